// BatchDecode's configuration as the class and its plan setup share it (decode_config.cpp):
// validation, the planner's view of the heads (whole-page items are planned as "super heads")
// and the kernel's occupancy.
#pragma once

#include <cstddef>

#include "flare/api/batch_decode.h"
#include "flare/jit/cuda_driver.h"

namespace flare::api_detail {

// Throws kInvalidArgument / kUnsupported for a config no decode kernel handles.
void validate_decode_config(const BatchDecodeConfig& c);
// Query heads per planned KV head (whole-page items are planned as "super heads").
int decode_plan_group_size(const BatchDecodeConfig& c);
// CTAs per SM of the compiled kernel (config.ctas_per_sm caps it); throws when none fits.
size_t decode_ctas_per_sm(const BatchDecodeConfig& c, cuda::Function decode, int threads,
                          size_t shared);

}  // namespace flare::api_detail
