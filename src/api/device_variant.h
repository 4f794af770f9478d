// The kernels' VariantParams for the AttentionParams of a BatchDecode or BatchPrefill config,
// with the ALiBi slopes and RoPE frequencies uploaded to a device buffer the caller keeps.
#pragma once

#include <vector>

#include "flare/jit/cuda_driver.h"
#include "flare/variant/attention_params.h"
#include "kernels/decode_params.cuh"

namespace flare::api_detail {

// Turns per position of each RoPE pair i < rotary_dim / 2, rope_frequency(p, i, rotary_dim) /
// (2 pi) (Llama 3.1's scaling included), computed in double and split into a float and the float
// of its remainder ([pairs][2]: hi, lo), so that the kernels form pos * turns to ~1e-7 turns at
// any position (kernels/rotary_angle.cuh).
std::vector<float> rope_turns(const AttentionParams& p, int rotary_dim);

// sm_scale resolved for `head_dim_qk`, soft cap and window of `p`; `tables` receives (copied
// synchronously from pageable memory) for kAlibi the num_qo_heads slopes (p.alibi_slopes or
// the default ones) and for kRopeLlama each pair's turns per position, and the result points
// at them.
VariantParams device_variant(const AttentionParams& p, int head_dim_qk, int num_qo_heads,
                             cuda::DeviceBuffer& tables);

}  // namespace flare::api_detail
