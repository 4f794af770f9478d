// The shipped library of variants (flare/variant/library.h): CUDA sources through the user
// interface.
#include "flare/variant/library.h"

#include <cmath>

#include "flare/core/error.h"
#include "flare/variant/attention_params.h"

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
  // The query at q_pos sees no key at or past max(q_pos + 1, prefix): the prefill skips the
  // tiles past that of the tile's last row (the kernel is planned without its causal mask).
  __device__ static int visible_end(const flare::VariantParams& p, int request, int q_pos) {
    const int prefix = Tensors::prefix_len(p)[request];
    return prefix > q_pos + 1 ? prefix : q_pos + 1;
  }
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    prefix = Tensors::prefix_len(p)[row.request];
    q_pos = row.q_pos;
  }
  // Exactly the keys before visible_end: the prefill checks keys only where a tile straddles it.
  static constexpr bool kMaskIsVisibleEnd = true;
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
  // at most 31, which every n >= max_distance reaches: those keys (all but the nearest
  // max_distance of a long row) take the row's last bucket from a register, without a
  // logarithm or a table load, and a key range of only those is affine in the KV position
  // (slope 0: kLogitsAffineOnSomeKeys, kLogitsAffineSlopeIsZero), so the Hopper prefill takes
  // causal attention's one FMA a logit there, the bucket's bias folded into the exp2 offset.
  // The bucket is in [0, 31] whatever max_distance holds (at most 16: every n >= 16 takes
  // bucket 31).
  v.source = R"(
struct Variant : flare::VariantBase {
  // Four registers per row (the decode loops keep several rows per thread): the scale of the
  // logarithmic buckets is one per row, not a logarithm and a reciprocal per score.
  int row_offset;  // qo_head * 32
  int q_pos;
  float far_bias;  // table[qo_head][31] in log2 units
  float buckets_per_log2;  // 16 / log2(max_distance / 16)
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    row_offset = row.qo_head * 32;
    q_pos = row.q_pos;
    far_bias = __ldg(Tensors::table(p) + row_offset + 31) * flare::kLog2e;
    // A fast reciprocal, not '/': IEEE division calls a slow-path subroutine.
    buckets_per_log2 = 16.0f * flare::fast_rcp(__log2f(Scalars::max_distance(p) * 0.0625f));
  }
  // n >= 0 as a float without the conversion unit (which a score's exp2 and logarithm share):
  // exact below 2^23; distances are clamped there (max_distance past 2^23 - 1 tokens would see
  // the farther keys in the bucket of 2^23 - 1).
  __device__ static float distance_as_float(int n) {
    return __int_as_float(min(n, (1 << 23) - 1) | 0x4B000000) - 8388608.0f;
  }
  __device__ static bool far(const flare::VariantParams& p, int n) {
    return n >= 16 && distance_as_float(n) >= Scalars::max_distance(p);
  }
  static constexpr bool kLogitsAffineOnSomeKeys = true;
  static constexpr bool kLogitsAffineSlopeIsZero = true;
  // Every key of [kv_first, kv_last] in the last bucket (the nearest one is): s + far_bias.
  __device__ bool logits_affine_on(const flare::VariantParams& p, int, int kv_last, float& base,
                                   float& slope) const {
    base = far_bias;
    slope = 0.0f;
    return far(p, q_pos - kv_last);
  }
  __device__ float logits_transform(const flare::VariantParams& p, float s, int kv_pos) const {
    const int n = q_pos > kv_pos ? q_pos - kv_pos : 0;
    if (far(p, n)) return s + far_bias;
    int bucket = n;
    if (n >= 16) {  // here max_distance > n >= 16: the logarithm below is positive
      const float scaled = __log2f(distance_as_float(n) * 0.0625f) * buckets_per_log2;
      // The integer part of scaled in [0, 15] by a round-toward-zero add of 2^23 (no
      // conversion unit): its low mantissa bits are then that integer.
      const float clamped = fminf(fmaxf(scaled, 0.0f), 15.0f);
      bucket = 16 + (__float_as_int(__fadd_rz(clamped, 8388608.0f)) & 0xf);
    }
    return s + __ldg(Tensors::table(p) + row_offset + bucket) * flare::kLog2e;
  }
};
)";
  return v;
}

UserVariant distance_bias() {
  UserVariant v;
  v.name = "distance_bias";
  v.tensors = {{"bias", DType::kF32, {kQoHeadsExtent, kTableExtent}}};
  v.requires_causal = true;
  // Keys at least W - 1 behind the query all take the row's last entry, so a key range of only
  // those has constant logits offsets (kLogitsAffineOnSomeKeys, slope 0): the Hopper prefill
  // takes causal attention's one FMA a logit there, the entry (held in a register from init())
  // folded into the exp2 offset. The other keys cost one load and one unsigned min, no branch:
  // the keys after the query (a negative distance, a large unsigned one) take the last entry
  // and the causal mask drops them.
  v.source = R"(
struct Variant : flare::VariantBase {
  // Three registers a row (the kernels hold every row's state across a work item): the row's
  // first entry (below 2^31: run() refuses larger tables, kTableExtent), its query position
  // and its last entry; the table's address and width are kernel parameters.
  int row_offset;
  int q_pos;
  float far_bias;  // bias[h][W - 1], for every key W - 1 or more back
  __device__ static int last(const flare::VariantParams& p) {
    return Tensors::bias_extent(p, 1) - 1;
  }
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    row_offset = row.qo_head * Tensors::bias_extent(p, 1);
    q_pos = row.q_pos;
    // Loaded once a row and item: in logits_affine_on, once a tile, the load sat on every
    // tile's way into the softmax (3.3% of the stall samples at 4096, forty-sixth session).
    far_bias = Tensors::bias(p)[row_offset + last(p)];
  }
  static constexpr bool kLogitsAffineOnSomeKeys = true;
  static constexpr bool kLogitsAffineSlopeIsZero = true;
  // Every key of [kv_first, kv_last] takes the last entry when the nearest one does.
  __device__ bool logits_affine_on(const flare::VariantParams& p, int, int kv_last, float& base,
                                   float& slope) const {
    base = far_bias * flare::kLog2e;
    slope = 0.0f;
    return q_pos - kv_last >= last(p);
  }
  // The bias depends on the row's head (its table row) and the distance only: the prefill
  // softmax shares a load between a thread's rows 8 tokens apart (kernels/variant.cuh).
  static constexpr bool kLogitsByDistance = true;
  __device__ int distance_key() const { return row_offset; }
  // A plain load, not __ldg: with the read-only path ptxas issued a tile's 64 loads of a thread
  // ahead of their use and spilled 180-240 bytes at the Hopper family's 128 x 128 tiles.
  // (A far key taking far_bias instead of the load, a select, spilled 8-16 bytes at 128 x 64
  // mma.sync and 128 x 128 Hopper tiles.)
  __device__ float logits_transform(const flare::VariantParams& p, float s, int kv_pos) const {
    const unsigned n = min(static_cast<unsigned>(q_pos - kv_pos), static_cast<unsigned>(last(p)));
    return fmaf(Tensors::bias(p)[row_offset + static_cast<int>(n)], flare::kLog2e, s);
  }
};
)";
  return v;
}

std::vector<int32_t> t5_distance_buckets(double max_distance) {
  FLARE_CHECK(std::isfinite(max_distance) && max_distance > 16.0 && max_distance <= (1 << 24),
              ErrorCode::kInvalidArgument,
              "flare::variants::t5_distance_buckets: max_distance must be finite, above 16 and at "
              "most 2^24, got ",
              max_distance);
  const int64_t width = static_cast<int64_t>(std::ceil(max_distance)) + 1;
  std::vector<int32_t> buckets(static_cast<size_t>(width));
  for (int64_t n = 0; n < width; ++n) buckets[n] = relative_bias_bucket(n, max_distance);
  return buckets;
}

std::vector<float> t5_distance_bias(const std::vector<float>& table, int64_t heads,
                                    double max_distance) {
  FLARE_CHECK(heads >= 1 && table.size() == static_cast<size_t>(heads) * kRelativePositionBuckets,
              ErrorCode::kInvalidArgument, "flare::variants::t5_distance_bias: table holds ",
              table.size(), " values, not heads * 32 = ", heads, " * 32 (heads >= 1)");
  const std::vector<int32_t> buckets = t5_distance_buckets(max_distance);
  std::vector<float> out(static_cast<size_t>(heads) * buckets.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (size_t n = 0; n < buckets.size(); ++n) {
      out[h * buckets.size() + n] = table[h * kRelativePositionBuckets + buckets[n]];
    }
  }
  return out;
}

UserVariant document_mask() {
  UserVariant v;
  v.name = "document_mask";
  v.tensors = {{"document_start", DType::kI32, {kBatchExtent, kAnyExtent}}};
  v.requires_causal = true;
  // A window per query: with the kernel's causal mask, the query at q_pos sees the keys from
  // its document's start on, so the prefill skips the tiles of earlier documents and checks
  // keys only on the tiles that straddle a start. The start is clamped into [0, q_pos]
  // (whatever the tensor holds, the query sees at least itself); positions past the row are
  // documents of their own.
  v.source = R"(
struct Variant : flare::VariantBase {
  static constexpr bool kMaskIsWindow = true;
  int first;
  __device__ static int visible_begin(const flare::VariantParams& p, int request, int q_pos) {
    const int columns = Tensors::document_start_extent(p, 1);
    if (q_pos <= 0 || q_pos >= columns) return q_pos > 0 ? q_pos : 0;
    const int start = __ldg(Tensors::document_start(p) + static_cast<long long>(request) * columns + q_pos);
    return start < 0 ? 0 : start > q_pos ? q_pos : start;
  }
  __device__ void init(const flare::VariantParams& p, const flare::RowContext& row) {
    first = visible_begin(p, row.request, row.q_pos);
  }
  __device__ bool logits_mask(int kv_pos) const { return kv_pos >= first; }
};
)";
  return v;
}

std::vector<int32_t> document_starts(const std::vector<int32_t>& document_id, int64_t rows,
                                     int64_t columns) {
  FLARE_CHECK(
      rows >= 0 && columns >= 0 && static_cast<int64_t>(document_id.size()) == rows * columns,
      ErrorCode::kInvalidArgument, "flare::variants::document_starts: document_id holds ",
      document_id.size(), " ids, not rows * columns = ", rows, " * ", columns);
  std::vector<int32_t> starts(document_id.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* ids = document_id.data() + r * columns;
    int32_t* out = starts.data() + r * columns;
    for (int64_t j = 0; j < columns; ++j) {
      out[j] = j > 0 && ids[j] == ids[j - 1] ? out[j - 1] : static_cast<int32_t>(j);
    }
  }
  return starts;
}

std::vector<std::string> names() {
  return {"sigmoid", "prefix_lm", "relative_position_bias", "distance_bias", "document_mask"};
}

UserVariant by_name(const std::string& name) {
  if (name == "sigmoid") return sigmoid();
  if (name == "prefix_lm") return prefix_lm();
  if (name == "relative_position_bias") return relative_position_bias();
  if (name == "distance_bias") return distance_bias();
  if (name == "document_mask") return document_mask();
  fail(ErrorCode::kInvalidArgument, "flare::variants: no variant named '", name,
       "' (sigmoid, prefix_lm, relative_position_bias, distance_bias, document_mask)");
}

}  // namespace flare::variants
