// The accuracy column of `flare bench`: a backend's output on a few sampled requests against
// the float64 reference attention on the same (already rounded) inputs.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"
#include "tools/flare/workload.h"

namespace flare::cli {

// Query tokens checked per sampled request: its last ones (they see the most keys, and the
// bottom-right alignment makes them an exact sub-problem under every mask). Bounds the float64
// reference's time on long prefills; decode and the default prefill are checked whole.
inline constexpr int64_t kCheckedTokensPerRequest = 256;

struct SampleCheck {
  double max_abs_error = 0;  // NaN when the output holds a NaN where the reference does not
  int64_t requests_checked = 0;
};

// Compares rows of `o` (contiguous [total_q, H_qo, D] on the CPU, any floating dtype) for up to
// `max_requests` requests spread evenly over the batch (always the first and the last), the
// last kCheckedTokensPerRequest query tokens of each.
SampleCheck check_sampled_requests(const Workload& work, const TensorView& o, int max_requests);

}  // namespace flare::cli
