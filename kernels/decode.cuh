// Persistent split-KV batch decode on CUDA cores over a paged KV cache (papers 001 §3.2.2 with
// tile size 1, 002 appendix A head-group fusion): each CTA walks its plan work queue; a work
// item is up to kRows query heads of one KV head against one KV chunk, each K/V row read once.
// Split tiles are merged in the same launch by the CTA finishing their last chunk
// (kernels/decode_merge.cuh).
//
// Compile-time defines: FLARE_HEAD_DIM (64 | 128 | 256), FLARE_ROWS (1 | 2 | 4 | 8),
// FLARE_PAGE_SIZE (>= 1), FLARE_Q_DTYPE / FLARE_KV_DTYPE (DTypeCode), and the tuning the host
// chose (src/api/batch_decode.cpp decode_geometry): FLARE_TOKENS_PER_GROUP, FLARE_STAGES,
// FLARE_MIN_CTAS_PER_SM (the register cap) and FLARE_SHARED_BYTES (the dynamic shared memory it
// launches with). `struct Variant` comes from the variant source (kernels/variant.cuh describes
// its interface).
#pragma once

#include "decode_merge.cuh"
#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "plan_types.cuh"
#include "variant.cuh"

namespace flare::decode {

constexpr int log2_exact(int x) { return x <= 1 ? 0 : 1 + log2_exact(x / 2); }

// Threads: kLanes lanes share one token row (8 head dims each, one 16-byte or 8-byte shared
// read); the CTA's kGroups token groups take different tokens of a tile and keep their own
// online-softmax state, combined through shared memory at the end of a work item.
//
// Scores: a group's kTokensPerGroup x kRows partial dot products (index r * kTokensPerGroup + i)
// are summed over its lanes by a reduce-scatter: each halving step sends half of the values to
// the partner lane and keeps the other half, so a lane ends with kValuesPerLane finished
// scores (or, with fewer values than lanes, one score shared by kLanes / kValues lanes). The
// softmax then runs once per score, not once per lane; probabilities and row rescale factors
// go back to every lane of the group through a small shared-memory exchange.
struct Traits {
  static constexpr int kHeadDim = FLARE_HEAD_DIM;
  static constexpr int kRows = FLARE_ROWS;  // packed query rows per work item (<= 8)
  static constexpr int kPageSize = FLARE_PAGE_SIZE;
  static constexpr int kQCode = FLARE_Q_DTYPE;
  static constexpr int kKVCode = FLARE_KV_DTYPE;
  static constexpr bool kFp8 = kKVCode == kCodeE4M3 || kKVCode == kCodeE5M2;
  static constexpr int kKVBytes = kFp8 ? 1 : 2;

  static constexpr int kThreads = 128;
  static constexpr int kMinCtasPerSm = FLARE_MIN_CTAS_PER_SM;
  static constexpr int kDimsPerLane = 8;
  static constexpr int kLanes = kHeadDim / kDimsPerLane;  // 8, 16 or 32: inside one warp
  static constexpr int kGroups = kThreads / kLanes;
  // Tokens one group handles per tile: scores live in registers (kTokensPerGroup * kRows).
  static constexpr int kTokensPerGroup = FLARE_TOKENS_PER_GROUP;
  static constexpr int kTileTokens = kGroups * kTokensPerGroup;

  static constexpr int kValues = kTokensPerGroup * kRows;  // partial scores per lane
  static constexpr int kLaneSteps = log2_exact(kLanes);
  static constexpr int kSplitSteps = log2_exact(kValues < kLanes ? kValues : kLanes);
  static constexpr int kValuesPerLane = kValues > kLanes ? kValues / kLanes : 1;
  static constexpr int kRowsPerLane =
      kValuesPerLane >= kTokensPerGroup ? kValuesPerLane / kTokensPerGroup : 1;
  // Lanes holding the same scores after the reduce-scatter (kValues < kLanes).
  static constexpr int kDuplicateLanes = kValues < kLanes ? kLanes / kValues : 1;
  static constexpr int kExchangeFloats = kGroups * (kValues + kRows);

  // cp.async of 16-byte chunks: a thread copies the same chunk column of kCopiesPerThread rows.
  static constexpr int kRowBytes = kHeadDim * kKVBytes;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kCopyRowStride = kThreads / kChunksPerRow;
  static constexpr int kCopiesPerThread = kTileTokens / kCopyRowStride;
  static constexpr int kTileBytes = kTileTokens * kRowBytes;  // K or V of one tile
  static constexpr int kStageBytes = 2 * kTileBytes;
  // (kStages - 1) stages in flight per CTA (48 KiB with 16-bit KV and 4-token groups).
  static constexpr int kStages = FLARE_STAGES;

  static constexpr int kCombineFloats = kGroups * kRows * (kHeadDim + 2);
  static constexpr int kPipelineBytes = kStages * kStageBytes;
  static constexpr int kLoopBytes = kPipelineBytes + kExchangeFloats * 4;
  static constexpr int kSharedBytes =
      kLoopBytes > kCombineFloats * 4 ? kLoopBytes : kCombineFloats * 4;
  static_assert(FLARE_SHARED_BYTES >= kSharedBytes, "the host launches with too little smem");
  static_assert(kStages >= 2 && kTokensPerGroup >= 1, "pipeline");
  static_assert(kMinCtasPerSm >= 1 && kMinCtasPerSm <= 4, "register cap");
  static_assert((kTokensPerGroup & (kTokensPerGroup - 1)) == 0, "tokens per group");

  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim");
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "rows per item");
  static_assert(kPageSize >= 1, "page size");
  static_assert(kQCode == kCodeF16 || kQCode == kCodeBF16, "q dtype");
  static_assert(kLanes <= 32 && 32 % kLanes == 0, "a token row stays inside one warp");
  static_assert(kThreads % kChunksPerRow == 0 && kTileTokens % kCopyRowStride == 0,
                "copies tile the stage exactly");
};

using T = Traits;

// Per-thread state of one work item: kRows query rows x this lane's 8 dims, and the softmax
// state of the rows whose scores this lane finishes (see LaneScores).
struct RowState {
  float q[T::kRows][T::kDimsPerLane];
  float o[T::kRows][T::kDimsPerLane];
  float m[T::kRowsPerLane];  // running max (log2 units), -inf before any visible key
  float d[T::kRowsPerLane];  // this lane's share of the running sum of exp2(s - m)
};

// Which scores a lane finishes: value j of the lane is score index base + j, i.e. row
// (base + j) / kTokensPerGroup, token slot (base + j) % kTokensPerGroup. `primary` picks one
// lane of each set of duplicates (the one that publishes).
struct LaneScores {
  int base;
  int first_row;
  bool primary;
  bool publishes_row;  // primary and holding token slot 0 of its rows

  __device__ explicit LaneScores(int lane) {
    base = 0;
#pragma unroll
    for (int step = 0; step < T::kSplitSteps; ++step) {
      const int offset = T::kLanes >> (step + 1);
      if (lane & offset) base += T::kValues >> (step + 1);
    }
    first_row = base / T::kTokensPerGroup;
    primary = lane % T::kDuplicateLanes == 0;
    publishes_row = primary && base % T::kTokensPerGroup == 0;
  }
};

// Offsets of the lanes that hold other token slots of the same row (summed or maxed over).
// The split steps s in [log2 kRows, kSplitSteps) distribute tokens; earlier steps split rows.
template <class Op>
__device__ __forceinline__ float across_token_lanes(float x, Op op) {
#pragma unroll
  for (int step = log2_exact(T::kRows); step < T::kSplitSteps; ++step) {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, T::kLanes >> (step + 1)));
  }
  return x;
}
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct ItemGeometry {
  int kv_lo, kv_hi;  // KV positions this item reads
  int page_base;     // first entry of the request's page list
  int num_tiles;
  int kv_head;
};

__device__ __forceinline__ void fetch_pages(const DecodeParams& p, const ItemGeometry& g, int tile,
                                            int (&pages)[T::kCopiesPerThread]) {
  const int first_row = threadIdx.x / T::kChunksPerRow;
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int token = g.kv_lo + tile * T::kTileTokens + first_row + i * T::kCopyRowStride;
    pages[i] = token < g.kv_hi ? __ldg(p.kv_indices + g.page_base + token / T::kPageSize) : 0;
  }
}

// Gathers K and V rows of `tile` through the page table into its pipeline stage. Byte strides
// of a page and a slot fit 32 bits (BatchDecode::run checks), so a row's address is the item's
// head base plus 32-bit slot and page-id multiply-adds: 64-bit element arithmetic per copy was
// ~17% of the fp8 loop's instructions.
__device__ __forceinline__ void issue_tile(const DecodeParams& p, const ItemGeometry& g, int tile,
                                           const int (&pages)[T::kCopiesPerThread],
                                           unsigned char* smem, bool ready = true) {
  const int column = threadIdx.x % T::kChunksPerRow;
  const int first_row = threadIdx.x / T::kChunksPerRow;
  const unsigned stage = shared_address(smem + (tile % T::kStages) * T::kStageBytes);
  const unsigned char* k = static_cast<const unsigned char*>(p.k) +
                           g.kv_head * p.k_stride_head * T::kKVBytes + column * 16;
  const unsigned char* v = static_cast<const unsigned char*>(p.v) +
                           g.kv_head * p.v_stride_head * T::kKVBytes + column * 16;
  const int k_page_bytes = static_cast<int>(p.k_stride_page) * T::kKVBytes;
  const int v_page_bytes = static_cast<int>(p.v_stride_page) * T::kKVBytes;
  const int k_slot_bytes = static_cast<int>(p.k_stride_slot) * T::kKVBytes;
  const int v_slot_bytes = static_cast<int>(p.v_stride_slot) * T::kKVBytes;
  const int first_token = g.kv_lo + tile * T::kTileTokens + first_row;
#pragma unroll
  for (int i = 0; i < T::kCopiesPerThread; ++i) {
    const int token = first_token + i * T::kCopyRowStride;
    // Else pages[i] is 0: the address stays in page 0.
    const bool valid = token < g.kv_hi && ready;
    const int slot = static_cast<int>(static_cast<unsigned>(token) % T::kPageSize);
    const unsigned offset = (first_row + i * T::kCopyRowStride) * T::kRowBytes + column * 16;
    cp_async_16(stage + offset,
                k + slot * k_slot_bytes + static_cast<long long>(pages[i]) * k_page_bytes, valid);
    cp_async_16(stage + T::kTileBytes + offset,
                v + slot * v_slot_bytes + static_cast<long long>(pages[i]) * v_page_bytes, valid);
  }
}

// Sums the partial scores over the group's lanes: after the split steps value j of this lane
// is the full score base + j (LaneScores); remaining steps (fewer values than lanes) sum
// duplicates. Halving keeps the lower half on lanes whose step bit is clear. One template
// instance per step keeps every register index a compile-time constant.
template <int kStep>
__device__ __forceinline__ void reduce_scatter(float (&s)[T::kValues], int lane) {
  if constexpr (kStep < T::kLaneSteps) {
    constexpr int kOffset = T::kLanes >> (kStep + 1);
    constexpr int kCount = T::kValues >> kStep;
    if constexpr (kCount >= 2) {
      const bool upper = (lane & kOffset) != 0;
#pragma unroll
      for (int j = 0; j < kCount / 2; ++j) {
        const float send = upper ? s[j] : s[j + kCount / 2];
        const float keep = upper ? s[j + kCount / 2] : s[j];
        s[j] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
    } else {
      s[0] += __shfl_xor_sync(0xffffffffu, s[0], kOffset);
    }
    reduce_scatter<kStep + 1>(s, lane);
  }
}

// Scores, online softmax and P.V of one tile for this thread's group.
__device__ __forceinline__ void compute_tile(const DecodeParams& p, const ItemGeometry& g, int tile,
                                             const unsigned char* smem, float* exchange,
                                             const LaneScores& lane_scores,
                                             const Variant (&variant)[T::kRowsPerLane],
                                             RowState& st) {
  constexpr int kTokens = T::kTokensPerGroup;
  const int lane = threadIdx.x % T::kLanes;
  const int group = threadIdx.x / T::kLanes;
  const unsigned char* stage = smem + (tile % T::kStages) * T::kStageBytes;
  const int lane_offset = lane * T::kDimsPerLane * T::kKVBytes;

  float s[T::kValues];  // [row][token slot]
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    float k[T::kDimsPerLane];
    load_kv8<T::kKVCode>(stage + (i * T::kGroups + group) * T::kRowBytes + lane_offset, k);
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
      float acc = 0.0f;
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) acc = fmaf(st.q[r][e], k[e], acc);
      s[r * kTokens + i] = acc;
    }
  }
  reduce_scatter<0>(s, lane);

  // Softmax of this lane's finished scores.
  const int first_token = g.kv_lo + tile * T::kTileTokens + group;
  float rescale[T::kRowsPerLane];
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    constexpr int kPerRow = T::kValuesPerLane < kTokens ? T::kValuesPerLane : kTokens;
    float tile_max = negative_infinity();
#pragma unroll
    for (int j = k * kPerRow; j < (k + 1) * kPerRow; ++j) {
      const int token = first_token + ((lane_scores.base + j) % kTokens) * T::kGroups;
      const bool visible = token < g.kv_hi && variant[k].logits_mask(token);
      s[j] = visible ? variant[k].logits_transform(p.variant, s[j], token) : negative_infinity();
      tile_max = fmaxf(tile_max, s[j]);
    }
    if (T::kValuesPerLane < kTokens) tile_max = across_token_lanes(tile_max, MaxOp());
    const float m_new = fmaxf(st.m[k], tile_max);
    // Rows that saw no visible key yet keep m = -inf; subtracting 0 then keeps exp2 at 0.
    const float m_base = m_new == negative_infinity() ? 0.0f : m_new;
    rescale[k] = fast_exp2(st.m[k] - m_base);
    st.m[k] = m_new;
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = k * kPerRow; j < (k + 1) * kPerRow; ++j) {
      s[j] = fast_exp2(s[j] - m_base);
      tile_sum += s[j];
    }
    st.d[k] = st.d[k] * rescale[k] + tile_sum;
  }

  // Every lane of the group needs every probability and row rescale factor for P.V.
  float* probabilities = exchange + group * (T::kValues + T::kRows);
  float* row_rescale = probabilities + T::kValues;
  if (lane_scores.primary) {
#pragma unroll
    for (int j = 0; j < T::kValuesPerLane; ++j) probabilities[lane_scores.base + j] = s[j];
  }
  if (lane_scores.publishes_row) {
#pragma unroll
    for (int k = 0; k < T::kRowsPerLane; ++k) row_rescale[lane_scores.first_row + k] = rescale[k];
  }
  __syncwarp();
  float prob[T::kValues];
  float scale[T::kRows];
#pragma unroll
  for (int j = 0; j < T::kValues; ++j) prob[j] = probabilities[j];
  bool max_moved = false;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    scale[r] = row_rescale[r];
    max_moved |= scale[r] != 1.0f;
  }
  // The running max settles after a few tiles: rescaling o is then skipped.
  if (max_moved) {
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] *= scale[r];
    }
  }

  const unsigned char* v_tile = stage + T::kTileBytes;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    float v[T::kDimsPerLane];
    load_kv8<T::kKVCode>(v_tile + (i * T::kGroups + group) * T::kRowBytes + lane_offset, v);
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) {
        st.o[r][e] = fmaf(prob[r * kTokens + i], v[e], st.o[r][e]);
      }
    }
  }
}

// Writes dims [4 * quad, 4 * quad + 4) of packed row r of `item` to o, and the row's lse once.
__device__ __forceinline__ void store_output(const DecodeParams& p, const WorkItem& item, int r,
                                             int quad, const float (&acc)[4], float lse) {
  const int packed = item.row_begin + r;
  const long long token = item.request + packed / p.group_size;  // one query token per request
  const long long head = item.kv_head * p.group_size + packed % p.group_size;
  unsigned char* o = static_cast<unsigned char*>(p.o);
  store_16bit4<T::kQCode>(o + ((token * p.o_stride_token + head * p.o_stride_head) + quad * 4) * 2,
                          acc);
  if (p.lse != nullptr && quad == 0) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = lse;
  }
}

// Combines the groups' states through shared memory and writes the item's rows: the final o
// and lse (write-through) or a float32 partial slot.
__device__ __forceinline__ void write_item(const DecodeParams& p, const WorkItem& item,
                                           const RowState& st, const LaneScores& lane_scores,
                                           float* scratch) {
  const int lane = threadIdx.x % T::kLanes;
  const int group = threadIdx.x / T::kLanes;
  float* s_o = scratch;                                    // [kGroups][kRows][D]
  float* s_m = s_o + T::kGroups * T::kRows * T::kHeadDim;  // [kGroups][kRows]
  float* s_d = s_m + T::kGroups * T::kRows;                // [kGroups][kRows]
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    float* dst = s_o + (group * T::kRows + r) * T::kHeadDim + lane * T::kDimsPerLane;
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; e += 4) {
      *reinterpret_cast<float4*>(dst + e) =
          make_float4(st.o[r][e], st.o[r][e + 1], st.o[r][e + 2], st.o[r][e + 3]);
    }
  }
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    const float d =
        T::kValuesPerLane < T::kTokensPerGroup ? across_token_lanes(st.d[k], AddOp()) : st.d[k];
    if (lane_scores.publishes_row) {
      s_m[group * T::kRows + lane_scores.first_row + k] = st.m[k];
      s_d[group * T::kRows + lane_scores.first_row + k] = d;
    }
  }
  __syncthreads();

  const int rows = item.row_end - item.row_begin;
  const float out_scale = p.v_scale * (T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f);
  constexpr int kQuads = T::kHeadDim / 4;
  for (int unit = threadIdx.x; unit < rows * kQuads; unit += T::kThreads) {
    const int r = unit / kQuads;
    const int quad = unit % kQuads;
    float m_max = negative_infinity();
#pragma unroll
    for (int gi = 0; gi < T::kGroups; ++gi) m_max = fmaxf(m_max, s_m[gi * T::kRows + r]);
    const float m_base = m_max == negative_infinity() ? 0.0f : m_max;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float denominator = 0.0f;
#pragma unroll
    for (int gi = 0; gi < T::kGroups; ++gi) {
      const float w = fast_exp2(s_m[gi * T::kRows + r] - m_base);
      denominator = fmaf(w, s_d[gi * T::kRows + r], denominator);
      const float4 part =
          *reinterpret_cast<const float4*>(s_o + (gi * T::kRows + r) * T::kHeadDim + quad * 4);
      acc[0] = fmaf(w, part.x, acc[0]);
      acc[1] = fmaf(w, part.y, acc[1]);
      acc[2] = fmaf(w, part.z, acc[2]);
      acc[3] = fmaf(w, part.w, acc[3]);
    }
    const bool empty = denominator == 0.0f;
    const float norm = empty ? 0.0f : out_scale / denominator;
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[e] *= norm;
    const float lse = empty ? negative_infinity() : (m_max + fast_log2(denominator)) * kLn2;

    if (item.partial_slot < 0) {
      store_output(p, item, r, quad, acc, lse);
    } else {
      const long long slot_row =
          static_cast<long long>(item.partial_slot) * p.offsets.partial_rows + r;
      float* partial_o = reinterpret_cast<float*>(p.workspace + p.offsets.partial_o);
      float* partial_lse = reinterpret_cast<float*>(p.workspace + p.offsets.partial_lse);
      *reinterpret_cast<float4*>(partial_o + slot_row * T::kHeadDim + quad * 4) =
          make_float4(acc[0], acc[1], acc[2], acc[3]);
      if (quad == 0) partial_lse[slot_row] = lse;
    }
  }
}

// A work item and what it needs of its request and its merge (staged by the plan).
struct ItemRecord {
  WorkItem item;
  DecodeItemMeta meta;
};

__device__ __forceinline__ ItemRecord load_record(const DecodeParams& p, int w) {
  const auto* items = reinterpret_cast<const WorkItem*>(p.workspace + p.offsets.work_items);
  ItemRecord r;
  r.item = items[w];
  r.meta = p.item_meta[w];
  return r;
}

// Runs `record`'s item (the caller has the next item's record in flight meanwhile).
__device__ __forceinline__ void run_item(const DecodeParams& p, const ItemRecord& record,
                                         unsigned char* smem) {
  const WorkItem& item = record.item;
  const int lane = threadIdx.x % T::kLanes;
  const int kv_len = record.meta.kv_len;

  ItemGeometry g;
  g.kv_head = item.kv_head;
  g.page_base = record.meta.page_begin;
  g.kv_hi = item.kv_end;
  const int q_pos = kv_len - 1;  // one query token per request, bottom-right aligned
  const int visible = Variant::visible_begin(p.variant, q_pos);
  g.kv_lo = item.kv_begin > visible ? item.kv_begin : visible;
  g.num_tiles = g.kv_hi > g.kv_lo ? (g.kv_hi - g.kv_lo + T::kTileTokens - 1) / T::kTileTokens : 0;

  RowState st;
  const LaneScores lane_scores(lane);
  Variant variant[T::kRowsPerLane];
  const float fp8_fix = T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f;
  const float q_scale = Variant::query_scale(p.variant) * p.k_scale * fp8_fix;
  const int rows = item.row_end - item.row_begin;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    const int packed = item.row_begin + r;
    const long long token = item.request + packed / p.group_size;
    const int head = item.kv_head * p.group_size + packed % p.group_size;
    if (r < rows) {
      const unsigned char* q =
          static_cast<const unsigned char*>(p.q) +
          ((token * p.q_stride_token + head * p.q_stride_head) + lane * T::kDimsPerLane) * 2;
      load_global_16bit8<T::kQCode>(q, st.q[r]);
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.q[r][e] *= q_scale;
    } else {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) st.q[r][e] = 0.0f;
    }
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    const int r = lane_scores.first_row + k;
    const int packed = item.row_begin + (r < rows ? r : 0);  // padding rows: any valid head
    variant[k].init(p.variant, item.kv_head * p.group_size + packed % p.group_size, q_pos);
    st.m[k] = negative_infinity();
    st.d[k] = 0.0f;
  }
  float* exchange = reinterpret_cast<float*>(smem + T::kPipelineBytes);

  // Pipeline: kStages - 1 tiles in flight; page ids of the next tile fetched one tile ahead.
  // The first tiles' page ids load together: one dependent load before the item streams.
  int pages[T::kCopiesPerThread];
  {
    int first_pages[T::kStages - 1][T::kCopiesPerThread];
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) fetch_pages(p, g, s, first_pages[s]);
    // ptxas sinks the later tiles' page-id loads below the first tile's copies (a round trip
    // later) unless those copies depend on them: page ids are never negative.
    int all_pages = 0;
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
#pragma unroll
      for (int i = 0; i < T::kCopiesPerThread; ++i) all_pages |= first_pages[s][i];
    }
#pragma unroll
    for (int s = 0; s < T::kStages - 1; ++s) {
      if (s < g.num_tiles) issue_tile(p, g, s, first_pages[s], smem, all_pages >= 0);
      cp_async_commit();
    }
  }
  fetch_pages(p, g, T::kStages - 1, pages);
  for (int tile = 0; tile < g.num_tiles; ++tile) {
    cp_async_wait<T::kStages - 2>();
    // Tile `tile` has landed for every thread, and every thread is done with tile - 1, whose
    // stage the next issue overwrites.
    __syncthreads();
    const int next = tile + T::kStages - 1;
    if (next < g.num_tiles) {
      issue_tile(p, g, next, pages, smem);
      fetch_pages(p, g, next + 1, pages);
    }
    cp_async_commit();
    compute_tile(p, g, tile, smem, exchange, lane_scores, variant, st);
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline stages become the combine scratch
  write_item(p, item, st, lane_scores, reinterpret_cast<float*>(smem));
  if (item.partial_slot >= 0) {
    const MergeRange range = {item.reserved, record.meta.slot_begin, record.meta.slot_count};
    if (arrived_last(p.merge_counters, range, reinterpret_cast<int*>(smem))) {
      merge_split_tile<T>(p, item, range, smem,
                          [&p, item](int r, int quad, const float(&acc)[4], float lse) {
                            store_output(p, item, r, quad, acc, lse);
                          });
    }
  }
  __syncthreads();  // the next item's copies overwrite the scratch
}

}  // namespace flare::decode

extern "C" __global__ void __launch_bounds__(flare::decode::Traits::kThreads,
                                             flare::decode::Traits::kMinCtasPerSm)
    flare_decode(const flare::DecodeParams params) {
  extern __shared__ __align__(16) unsigned char flare_decode_smem[];
  // One load (64 bytes) to the CTA's queue and its first item; the next item's record is in
  // flight while each item streams. The empty-queue test reads a field of each 16-byte part
  // (request, kv_begin and page_begin are never negative): otherwise ptxas sinks three of the
  // four loads below the exit, a second round trip before the first page ids.
  const flare::DecodeCtaStart start = params.cta_starts[blockIdx.x];
  const int begin = start.begin;
  const int end = start.end;
  if (((end - begin - 1) | start.item.request | start.item.kv_begin | start.meta.page_begin) < 0) {
    return;  // begin >= end
  }
  flare::decode::ItemRecord current = {start.item, start.meta};
  for (int w = begin; w < end; ++w) {
    flare::decode::ItemRecord next = current;
    if (w + 1 < end) next = flare::decode::load_record(params, w + 1);
    flare::decode::run_item(params, current, flare_decode_smem);
    current = next;
  }
}
