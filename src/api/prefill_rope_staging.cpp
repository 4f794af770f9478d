// BatchPrefill's staged RoPE: the rule (fused_rope_key_reads, plan_stages_rope), the copies and
// the rotation (prefill_rope_staging.h).
#include "src/api/prefill_rope_staging.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "flare/api/rope.h"
#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "kernels/rope_apply.cuh"
#include "src/api/device_variant.h"
#include "src/api/prefill_config.h"

namespace flare {

double fused_rope_key_reads(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                            int group, int query_tile, MaskMode mask, int window_left) {
  const bool causal = mask == MaskMode::kCausal;
  double reads = 0, keys = 0;
  for (size_t b = 0; b + 1 < qo_indptr.size() && b + 1 < kv_indptr.size(); ++b) {
    const int64_t q = qo_indptr[b + 1] - qo_indptr[b];
    const int64_t kv = kv_indptr[b + 1] - kv_indptr[b];
    keys += static_cast<double>(kv);
    if (q <= 0 || kv <= 0) continue;
    const int64_t tiles = (q * group + query_tile - 1) / query_tile;
    if (!causal && window_left < 0) {
      reads += static_cast<double>(tiles * kv);
    } else if (causal && window_left < 0 && query_tile % group == 0 && kv >= q) {
      // Tile t's last token is (t + 1) x tokens - 1 (the last tile's q - 1): the sum in closed
      // form, O(1) a request.
      const int64_t tokens = query_tile / group;
      reads += static_cast<double>(tiles * (kv - q) + tokens * (tiles - 1) * tiles / 2 + q);
    } else {
      // Token positions kv - q + t (bottom-right aligned); a tile sees from its first token's
      // window start to its last token's position (every key without the mask).
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t first = t * query_tile / group;
        const int64_t last = std::min(q - 1, ((t + 1) * query_tile - 1) / group);
        const int64_t hi = causal ? std::clamp<int64_t>(kv - q + last + 1, 0, kv) : kv;
        const int64_t lo =
            window_left >= 0 ? std::clamp<int64_t>(kv - q + first - window_left, 0, kv) : 0;
        reads += static_cast<double>(std::max<int64_t>(hi - lo, 0));
      }
    }
  }
  return keys > 0 ? reads / keys : 0;
}

namespace api_detail {
namespace {

constexpr const char* kWhat = "BatchPrefill";
constexpr int64_t kMaxBlocks = 8192;    // as apply_rope's grid
constexpr int kPieceElements = 16 / 2;  // 16 bytes of 16-bit elements
constexpr int kPairsApart = 2;          // pairs head_dim / 2 apart: a unit is two pieces
constexpr int64_t kRowsGranule = 4096;  // copies grow in steps of this many rows

int64_t units_per_row(int head_dim) { return head_dim / (kPieceElements * kPairsApart); }

size_t row_bytes(int heads, int head_dim) {
  return static_cast<size_t>(heads) * static_cast<size_t>(head_dim) * 2;
}

}  // namespace

bool rope_staging_applies(const BatchPrefillConfig& c) {
  return c.params.pos_encoding == PosEncoding::kRopeLlama && c.kv == PrefillKV::kRagged &&
         !c.kv_dtype && (!c.use_cuda_graph || c.max_total_kv >= 1) && !c.variant &&
         c.max_levels == 1 && c.head_dim_qk % (kPieceElements * kPairsApart) == 0 &&
         c.head_dim_qk / 2 <= kRopeMaxPairs;
}

bool may_stage_rope(const BatchPrefillConfig& c) {
  return c.rope_staging != RopeStaging::kFused && rope_staging_applies(c);
}

BatchPrefillConfig staged_rope_kernel_config(const BatchPrefillConfig& c) {
  BatchPrefillConfig plain = c;
  plain.params.pos_encoding = PosEncoding::kNone;
  plain.params.rope_llama31.reset();
  plain.rope_staging = RopeStaging::kFused;
  return plain;
}

namespace {

// Whether the rotation of q_tokens query and kv_tokens key rows fits the kernel's 32-bit count
// of pieces (rows x heads x units); under kStaged a batch past it throws kUnsupported (`which`:
// what bounds it).
bool rotation_fits(const BatchPrefillConfig& c, int64_t q_tokens, int64_t kv_tokens,
                   const char* which) {
  const int64_t pieces = std::max(q_tokens * c.num_qo_heads, kv_tokens * c.num_kv_heads) *
                         units_per_row(c.head_dim_qk);
  FLARE_CHECK(pieces <= INT32_MAX || c.rope_staging != RopeStaging::kStaged,
              ErrorCode::kUnsupported, kWhat,
              ": rope_staging kStaged rotates at most 2^31 16-byte pieces of q or k a run, ", which,
              " ", pieces);
  return pieces <= INT32_MAX;
}

}  // namespace

bool graph_stages_rope(const BatchPrefillConfig& c, const PrefillTiles& tiles) {
  if (!may_stage_rope(c)) return false;
  // The captured rotation covers the capacities.
  if (!rotation_fits(c, c.max_total_qo, c.max_total_kv,
                     "under use_cuda_graph max_total_qo and max_total_kv allow")) {
    return false;
  }
  if (c.rope_staging == RopeStaging::kStaged) return true;
  const int32_t tokens = std::max(c.max_total_qo / std::max(c.max_batch, 1), 1);
  const std::array<int32_t, 2> indptr = {0, tokens};
  return fused_rope_key_reads(indptr, indptr, prefill_group_size(c), tiles.query_tile,
                              c.params.mask, c.params.window_left) >= kStageRopeMinKeyReads;
}

bool plan_stages_rope(const BatchPrefillConfig& c, std::span<const int32_t> qo_indptr,
                      std::span<const int32_t> kv_indptr, const PrefillTiles& tiles) {
  if (c.use_cuda_graph) return graph_stages_rope(c, tiles);
  if (!may_stage_rope(c) ||
      !rotation_fits(c, qo_indptr.back(), kv_indptr.back(), "this plan has")) {
    return false;
  }
  if (c.rope_staging == RopeStaging::kStaged) return true;
  return fused_rope_key_reads(qo_indptr, kv_indptr, prefill_group_size(c), tiles.query_tile,
                              c.params.mask, c.params.window_left) >= kStageRopeMinKeyReads;
}

PrefillRopeStaging::PrefillRopeStaging() = default;
PrefillRopeStaging::~PrefillRopeStaging() = default;
PrefillRopeStaging::PrefillRopeStaging(PrefillRopeStaging&&) noexcept = default;
PrefillRopeStaging& PrefillRopeStaging::operator=(PrefillRopeStaging&&) noexcept = default;

PrefillRopeStaging::PrefillRopeStaging(const BatchPrefillConfig& c)
    : device_(c.device),
      q_heads_(c.num_qo_heads),
      k_heads_(c.num_kv_heads),
      head_dim_(c.head_dim_qk),
      graph_(c.use_cuda_graph),
      base_(std::make_unique<RopeApplyParams>()) {
  function_ = jit::get_kernel(rope_kernel_spec(c.dtype, false, 0), "flare_rope_apply", c.device);
  RopeApplyParams& p = *base_;
  p.rotary_units = static_cast<int32_t>(units_per_row(c.head_dim_qk));
  p.units_per_row = p.rotary_units;  // the whole head turns: no copy units
  p.half_bytes = c.head_dim_qk;      // head_dim / 2 elements of 2 bytes
  p.pairs = c.head_dim_qk / 2;
  const std::vector<float> turns = rope_turns(c.params, c.head_dim_qk);
  std::memcpy(p.turns, turns.data(), turns.size() * sizeof(float));
  zero_offsets_ = cuda::DeviceBuffer(static_cast<size_t>(c.max_batch) * sizeof(int32_t));
  cuda::memset_d8_async(zero_offsets_.data(), 0, zero_offsets_.bytes(), nullptr);
  cuda::stream_synchronize(nullptr);  // run() may use another stream
  if (graph_) {  // the copies' addresses go into captured launches: fixed from creation
    query_rows_ = std::max<int64_t>(c.max_total_qo, 1);
    key_rows_ = c.max_total_kv;
    q_ = cuda::DeviceBuffer(static_cast<size_t>(query_rows_) * row_bytes(q_heads_, head_dim_));
    k_ = cuda::DeviceBuffer(static_cast<size_t>(key_rows_) * row_bytes(k_heads_, head_dim_));
  }
}

void PrefillRopeStaging::reserve(int64_t total_qo, int64_t total_kv) {
  const auto rounded = [](int64_t rows) {
    return (std::max<int64_t>(rows, 1) + kRowsGranule - 1) / kRowsGranule * kRowsGranule;
  };
  if (total_qo <= query_rows_ && total_kv <= key_rows_) return;
  FLARE_CHECK(!graph_, ErrorCode::kInternal, kWhat,
              ": the CUDA-graph copies of staged RoPE cannot grow (plan() checks max_total_kv)");
  const cuda::DeviceScope scope(device_);
  cuda::device_synchronize();  // the smaller copies may be read by a run() in flight
  if (total_qo > query_rows_) {
    q_ = cuda::DeviceBuffer();
    query_rows_ = rounded(total_qo);
    q_ = cuda::DeviceBuffer(static_cast<size_t>(query_rows_) * row_bytes(q_heads_, head_dim_));
  }
  if (total_kv > key_rows_) {
    k_ = cuda::DeviceBuffer();
    key_rows_ = rounded(total_kv);
    k_ = cuda::DeviceBuffer(static_cast<size_t>(key_rows_) * row_bytes(k_heads_, head_dim_));
  }
}

void PrefillRopeStaging::launch(const void* in, int64_t token_stride, int64_t head_stride,
                                void* out, int64_t tokens, int heads, const int32_t* indptr,
                                const int32_t* offsets, int64_t batch, cuda::Stream stream) const {
  RopeApplyParams p = *base_;
  p.heads_per_thread = rope_heads_per_thread(tokens * heads * p.units_per_row);
  // Below 2^31: plan_stages_rope counts one unit a head.
  const int64_t units =
      tokens * ((heads + p.heads_per_thread - 1) / p.heads_per_thread) * p.units_per_row;
  if (units == 0) return;
  p.q.in = static_cast<const char*>(in);
  p.q.out = static_cast<char*>(out);
  p.q.in_token_stride = token_stride * 2;
  p.q.in_head_stride = head_stride * 2;
  p.q.out_token_stride = static_cast<int64_t>(heads) * head_dim_ * 2;
  p.q.out_head_stride = int64_t{head_dim_} * 2;
  p.k = p.q;  // no k heads: the kernel's pieces all fall in q's rows
  p.num_units = static_cast<int32_t>(units);
  p.q_heads = heads;
  p.k_heads = 0;
  p.batch = static_cast<int32_t>(batch);
  p.tokens_from_indptr = graph_ ? 1 : 0;
  p.indptr = indptr;
  p.offsets = offsets;
  const auto blocks = static_cast<unsigned>(
      std::min(kMaxBlocks, (units + kRopeApplyThreads - 1) / kRopeApplyThreads));
  void* args[] = {&p};
  cuda::launch(function_, blocks, 1, 1, kRopeApplyThreads, 1, 1, 0, stream, args);
}

void PrefillRopeStaging::rotate(const TensorView& q, const TensorView& k, int64_t total_qo,
                                int64_t total_kv, int64_t batch, const int32_t* qo_begin,
                                const int32_t* q_offset, const int32_t* kv_indptr,
                                cuda::Stream stream) const {
  const cuda::DeviceScope scope(device_);
  launch(q.data, q.strides[0], q.strides[1], q_.data(), total_qo, q_heads_, qo_begin, q_offset,
         batch, stream);
  launch(k.data, k.strides[0], k.strides[1], k_.data(), total_kv, k_heads_, kv_indptr,
         static_cast<const int32_t*>(zero_offsets_.data()), batch, stream);
}

}  // namespace api_detail
}  // namespace flare
