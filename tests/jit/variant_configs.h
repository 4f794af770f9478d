// Decode and prefill configurations with a variant, for the tests that compile or build a
// variant's kernels (32 query / 8 KV heads, D 128, pages of 16; prefill causal).
#pragma once

#include <optional>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/variant/user_variant.h"

namespace flare::testing {

inline BatchDecodeConfig decode_config(const UserVariant& variant, bool tensor_cores) {
  BatchDecodeConfig c;
  c.max_batch = 16;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = 16;
  c.use_tensor_cores = tensor_cores;
  c.variant = variant;
  return c;
}

inline BatchPrefillConfig prefill_config(const UserVariant& variant, PrefillKV kv) {
  BatchPrefillConfig c;
  c.max_batch = 8;
  c.max_total_qo = 4096;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim_qk = c.head_dim_vo = 128;
  c.kv = kv;
  c.page_size = 16;
  c.params.mask = MaskMode::kCausal;
  c.variant = variant;
  return c;
}

}  // namespace flare::testing
