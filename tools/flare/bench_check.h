// The accuracy column of `flare bench`: a backend's output on a few sampled requests against
// the float64 reference attention on the same (already rounded) inputs.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"
#include "tools/flare/workload.h"

namespace flare::cli {

struct SampleCheck {
  double max_abs_error = 0;  // NaN when the output holds a NaN where the reference does not
  int64_t requests_checked = 0;
};

// Compares rows of `o` (contiguous [total_q, H_qo, D] on the CPU, any floating dtype) for up to
// `max_requests` requests spread evenly over the batch (always the first and the last).
SampleCheck check_sampled_requests(const Workload& work, const TensorView& o, int max_requests);

}  // namespace flare::cli
