// The shipped library of variants (flare/variant/library.h): CUDA sources through the user
// interface.
#include "flare/variant/library.h"

#include "flare/core/error.h"

namespace flare::variants {

UserVariant sigmoid() {
  UserVariant v;
  v.name = "sigmoid";
  v.scalars = {"bias"};
  v.use_softmax = false;
  v.source = R"(
struct Variant : flare::VariantBase {
  static constexpr bool use_softmax = false;
  __device__ static float query_scale(const flare::VariantParams& p) { return p.sm_scale; }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
    return flare::fast_rcp(1.0f + flare::fast_exp2(-(s + Scalars::bias(p)) * flare::kLog2e));
  }
};
)";
  return v;
}

UserVariant prefix_lm() {
  UserVariant v;
  v.name = "prefix_lm";
  v.tensors = {{"prefix_len", DType::kI32, {kBatchExtent}}};
  v.source = R"(
struct Variant : flare::VariantBase {
  int prefix;
  int q_pos;
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    prefix = Tensors::prefix_len(p)[row.request];
    q_pos = row.q_pos;
  }
  __device__ bool logits_mask(int kv_pos) const { return kv_pos < prefix || kv_pos <= q_pos; }
};
)";
  return v;
}

UserVariant relative_position_bias() {
  UserVariant v;
  v.name = "relative_position_bias";
  v.scalars = {"max_distance"};
  v.tensors = {{"table", DType::kF32, {kQoHeadsExtent, kRelativePositionBuckets}}};
  // T5's unidirectional buckets (transformers' _relative_position_bucket, bidirectional=False):
  // n = max(i - j, 0); n < 16 exact; else 16 + log(n / 16) / log(max_distance / 16) * 16,
  // at most 31. The bucket is in [0, 31] whatever max_distance holds.
  v.source = R"(
struct Variant : flare::VariantBase {
  // Two registers per row (the decode loops keep several rows per thread); the scale of the
  // logarithmic buckets depends on the parameters only, one value for every row.
  int row_offset;  // qo_head * 32
  int q_pos;
  __device__ void init(const flare::VariantParams&, const flare::RowContext& row) {
    row_offset = row.qo_head * 32;
    q_pos = row.q_pos;
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int kv_pos) const {
    const int n = q_pos > kv_pos ? q_pos - kv_pos : 0;
    int bucket = n;
    if (n >= 16) {  // NaN or negative (max_distance <= 16) clamps to bucket 16
      const float buckets_per_log = 16.0f / __logf(Scalars::max_distance(p) * 0.0625f);
      const float scaled = __logf(static_cast<float>(n) * 0.0625f) * buckets_per_log;
      bucket = 16 + static_cast<int>(fminf(fmaxf(scaled, 0.0f), 15.0f));
    }
    return s + Tensors::table(p)[row_offset + bucket] * flare::kLog2e;
  }
};
)";
  return v;
}

std::vector<std::string> names() { return {"sigmoid", "prefix_lm", "relative_position_bias"}; }

UserVariant by_name(const std::string& name) {
  if (name == "sigmoid") return sigmoid();
  if (name == "prefix_lm") return prefix_lm();
  if (name == "relative_position_bias") return relative_position_bias();
  fail(ErrorCode::kInvalidArgument, "flare::variants: no variant named '", name,
       "' (sigmoid, prefix_lm, relative_position_bias)");
}

}  // namespace flare::variants
