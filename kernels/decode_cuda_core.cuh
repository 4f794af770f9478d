// The CUDA-core compute loop of the decode kernel (kernels/decode.cuh, FLARE_DECODE_MMA 0).
//
// Scores: a group's kTokensPerGroup x kRows partial dot products (index r * kTokensPerGroup + i)
// are summed over its lanes by a reduce-scatter: each halving step sends half of the values to
// the partner lane and keeps the other half, so a lane ends with kValuesPerLane finished
// scores (or, with fewer values than lanes, one score shared by kLanes / kValues lanes). The
// softmax then runs once per score, not once per lane; probabilities and row rescale factors
// go back to every lane of the group through a small shared-memory exchange.
#pragma once

#include "decode_pipeline.cuh"

namespace flare::decode {

// A lane's dims: kChunksPerLane chunks of 8, chunk c of lane l being dims (c * kLanes + l) * 8
// .. + 8 (Traits), element e of a lane's registers in chunk e / 8.
__device__ __forceinline__ int lane_chunk_dim(int lane, int chunk) {
  return (chunk * T::kLanes + lane) * 8;
}
template <int N>
__device__ __forceinline__ float (&chunk8(float (&x)[N], int chunk))[8] {
  static_assert(N % 8 == 0, "whole chunks");
  return *reinterpret_cast<float(*)[8]>(x + chunk * 8);
}

// The 8 values of chunk `chunk` of this lane in row `row` of a stage's K (or V) tile: 16-bit and
// fp8 rows are contiguous elements; NVFP4 rows 4 bytes of codes a chunk, with the scale of its
// block from the tile's scale rows (decode_pipeline.cuh Traits).
__device__ __forceinline__ void load_row_chunk(const unsigned char* tile,
                                               const unsigned char* scales, int row, int lane,
                                               int chunk, float (&out)[8]) {
  const int dim = lane_chunk_dim(lane, chunk);
  if constexpr (T::kNvfp4) {
    load_nvfp4_8(tile + row * T::kRowBytes + dim / 2, scales[row * T::kScaleRowBytes + dim / 16],
                 out);
  } else {
    load_kv8<T::kKVCode>(tile + row * T::kRowBytes + dim * T::kKVBytes, out);
  }
}

// Per-thread state of one work item: kRows query rows x this lane's kDimsPerLane dims, and the
// softmax state of the rows whose scores this lane finishes (see LaneScores).
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

// RoPE on a row of q or fp8 K (kernels/rotary.cuh) at position `pos`, as the group's lanes
// hold it (lane_chunk_dim): with one chunk a lane's dims pair with the lane kLanes / 2 away
// (warp-uniform: shuffles); with two (D 512) chunk 0's dims pair with chunk 1's, D / 2 apart,
// in the same lane.
__device__ __forceinline__ void rotate_lane_dims(const DecodeParams& p, int pos,
                                                 float (&q)[T::kDimsPerLane]) {
  static_assert(T::kChunksPerLane == 1 || T::kChunksPerLane == 2, "one or two chunks a lane");
  const int lane = threadIdx.x % T::kLanes;
  if constexpr (T::kChunksPerLane == 2) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      rotate_pair(q[e], q[8 + e], pos,
                  rotary_turns<Variant, T::kHeadDim>(p.variant, lane_chunk_dim(lane, 0) + e));
    }
  } else {
    constexpr int kHalf = T::kLanes / 2;
    const bool upper = lane >= kHalf;
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) {
      const float partner = __shfl_xor_sync(0xffffffffu, q[e], kHalf);
      float lo = upper ? partner : q[e];
      float hi = upper ? q[e] : partner;
      rotate_pair(
          lo, hi, pos,
          rotary_turns<Variant, T::kHeadDim>(p.variant, (lane % kHalf) * T::kDimsPerLane + e));
      q[e] = upper ? hi : lo;
    }
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
  const unsigned char* k_scales = stage + 2 * T::kTileBytes;  // NVFP4 only
  const unsigned char* v_scales = k_scales + T::kScaleTileBytes;

  // Token slot i of this group is KV position first_token + i * kGroups.
  const int first_token = g.kv_lo + tile * T::kTileTokens + group;
  float s[T::kValues];  // [row][token slot]
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    float k[T::kDimsPerLane];
#pragma unroll
    for (int c = 0; c < T::kChunksPerLane; ++c) {
      load_row_chunk(stage, k_scales, i * T::kGroups + group, lane, c, chunk8(k, c));
    }
    // fp8 / NVFP4 K rotates here, in float32 (16-bit K was rotated in its stage: rotate_k_tile).
    if constexpr (Variant::kRotary && T::kConvertsInRegisters) {
      rotate_lane_dims(p, first_token + i * T::kGroups, k);
    }
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
  float rescale[T::kRowsPerLane];
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    constexpr int kPerRow = T::kValuesPerLane < kTokens ? T::kValuesPerLane : kTokens;
    // Where the variant's logits are affine on this group's keys of the tile
    // (has_affine_logits_on_some_keys: T5's far keys, one constant a row), the logit is s + base
    // + slope * offset, without logits_transform: for a bias table, no load a key. (No measured
    // change at the decode benchmark's shapes: the distance bias's 1.13-1.23x plain decode that
    // prompted it was the harness's, docs/perf.md forty-sixth session E.)
    float affine_base = 0.0f, affine_slope = 0.0f;
    bool affine = false;
    if constexpr (has_affine_logits_on_some_keys<Variant>) {
      affine = variant[k].logits_affine_on(p.variant, first_token,
                                           first_token + (kTokens - 1) * T::kGroups, affine_base,
                                           affine_slope);
    }
    const auto logit = [&](float x, int token) {
      if constexpr (has_affine_logits_on_some_keys<Variant>) {
        if (affine) {
          return fmaf(affine_slope, static_cast<float>(token - first_token), x + affine_base);
        }
      }
      return variant[k].logits_transform(p.variant, x, token);
    };
    if constexpr (!Variant::use_softmax) {  // the weights themselves; m stays 0
#pragma unroll
      for (int j = k * kPerRow; j < (k + 1) * kPerRow; ++j) {
        const int token = first_token + ((lane_scores.base + j) % kTokens) * T::kGroups;
        const bool visible = token < g.kv_hi && variant[k].logits_mask(token);
        s[j] = visible ? logit(s[j], token) : 0.0f;
      }
      rescale[k] = 1.0f;
      continue;
    }
    float tile_max = negative_infinity();
#pragma unroll
    for (int j = k * kPerRow; j < (k + 1) * kPerRow; ++j) {
      const int token = first_token + ((lane_scores.base + j) % kTokens) * T::kGroups;
      const bool visible = token < g.kv_hi && variant[k].logits_mask(token);
      s[j] = visible ? logit(s[j], token) : negative_infinity();
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
#pragma unroll
    for (int c = 0; c < T::kChunksPerLane; ++c) {
      load_row_chunk(v_tile, v_scales, i * T::kGroups + group, lane, c, chunk8(v, c));
    }
#pragma unroll
    for (int r = 0; r < T::kRows; ++r) {
#pragma unroll
      for (int e = 0; e < T::kDimsPerLane; ++e) {
        st.o[r][e] = fmaf(prob[r * kTokens + i], v[e], st.o[r][e]);
      }
    }
  }
}

// The loop's per-thread state of one work item.
struct LoopState {
  RowState rows;
  LaneScores lane_scores;
  Variant variant[T::kRowsPerLane];
  __device__ __forceinline__ LoopState() : lane_scores(threadIdx.x % T::kLanes) {}
};

// Loads the item's query rows (16-bit words, in the first half of each row's floats until
// finish_query) and starts the softmax state.
__device__ __forceinline__ void begin_item(const DecodeParams& p, const WorkItem& item, int q_pos,
                                           LoopState& ls) {
  RowState& st = ls.rows;
  const int lane = threadIdx.x % T::kLanes;
  const int rows = item.row_end - item.row_begin;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    const int packed = item.row_begin + r;
    const long long token = item.request + packed / p.group_size;
    const int head = item.kv_head * p.group_size + packed % p.group_size;
#pragma unroll
    for (int c = 0; c < T::kChunksPerLane; ++c) {
      Vec16 raw = {0u, 0u, 0u, 0u};
      if (r < rows) {
        const unsigned char* q = static_cast<const unsigned char*>(p.q) +
                                 (token * p.q_stride_token + head * p.q_stride_head) * 2;
        raw = *reinterpret_cast<const Vec16*>(q + lane_chunk_dim(lane, c) * 2);
      }
      float* words = chunk8(st.q[r], c);
      words[0] = __uint_as_float(raw.x);
      words[1] = __uint_as_float(raw.y);
      words[2] = __uint_as_float(raw.z);
      words[3] = __uint_as_float(raw.w);
    }
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) st.o[r][e] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    const int r = ls.lane_scores.first_row + k;
    const int packed = item.row_begin + (r < rows ? r : 0);  // padding rows: any valid head
    ls.variant[k].init(p.variant, row_context(p, item, packed, q_pos));
    st.m[k] = row_max_start<Variant>();
    st.d[k] = 0.0f;
  }
}

// The item's query rows as scaled floats (RoPE applied): called once its first tiles are in
// flight (kernels/decode.cuh run_item), so that the wait for q overlaps their round trips.
__device__ __forceinline__ void finish_query(const DecodeParams& p, int q_pos, LoopState& ls) {
  RowState& st = ls.rows;
  const float fp8_fix = T::kKVCode == kCodeE4M3 ? kE4M3ViaF16Scale : 1.0f;
  const float q_scale = Variant::query_scale(p.variant) * p.k_scale * fp8_fix;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
#pragma unroll
    for (int c = 0; c < T::kChunksPerLane; ++c) {
      float* chunk = chunk8(st.q[r], c);
      const unsigned words[4] = {__float_as_uint(chunk[0]), __float_as_uint(chunk[1]),
                                 __float_as_uint(chunk[2]), __float_as_uint(chunk[3])};
#pragma unroll
      for (int i = 0; i < 4; ++i)
        pair16_to_float2<T::kQCode>(words[i], chunk[2 * i], chunk[2 * i + 1]);
    }
    if constexpr (Variant::kRotary) rotate_lane_dims(p, q_pos, st.q[r]);
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; ++e) st.q[r][e] *= q_scale;
  }
}

// RoPE on 16-bit K where its tile landed (kernels/rotary.cuh): row r at KV position kv_lo +
// tile * kTileTokens + r, every thread some rows, then a barrier. fp8 and NVFP4 K rotate in
// registers after their conversion (compute_tile above): rotated and stored back in their own
// type they would lose the rotation's precision.
__device__ __forceinline__ void rotate_k_tile(const DecodeParams& p, const ItemGeometry& g,
                                              int tile, unsigned char* smem) {
  rotate_shared_rows_from<Variant, T::kKVCode, T::kHeadDim, T::kTileTokens, T::kThreads>(
      smem + (tile % T::kStages) * T::kStageBytes, p.variant, threadIdx.x,
      [](int row, int chunk) { return stage_offset(row, chunk); }, g.kv_lo + tile * T::kTileTokens);
  __syncthreads();  // the rotated K rows are visible
}

// One tile of the pipeline for this thread's group (the exchange follows the stages).
__device__ __forceinline__ void compute_tile(const DecodeParams& p, const ItemGeometry& g, int tile,
                                             unsigned char* smem, LoopState& ls) {
  if constexpr (Variant::kRotary && !T::kConvertsInRegisters) rotate_k_tile(p, g, tile, smem);
  compute_tile(p, g, tile, smem, reinterpret_cast<float*>(smem + T::kPipelineBytes), ls.lane_scores,
               ls.variant, ls.rows);
}

// Nothing a CTA sets up once on this loop (decode_mma.cuh's RoPE table).
__device__ __forceinline__ void begin_cta(const DecodeParams&, unsigned char*) {}

// Writes this group's unnormalized o rows, running max and sum into the combine scratch:
// s_o [kStateGroups][kRows][D], s_m and s_d [kStateGroups][kRows].
__device__ __forceinline__ void publish_state(const LoopState& st, float* s_o, float* s_m,
                                              float* s_d) {
  const int lane = threadIdx.x % T::kLanes;
  const int group = threadIdx.x / T::kLanes;
#pragma unroll
  for (int r = 0; r < T::kRows; ++r) {
    float* row = s_o + (group * T::kRows + r) * T::kHeadDim;
#pragma unroll
    for (int e = 0; e < T::kDimsPerLane; e += 4) {
      float* dst = row + lane_chunk_dim(lane, e / 8) + e % 8;
      *reinterpret_cast<float4*>(dst) = make_float4(st.rows.o[r][e], st.rows.o[r][e + 1],
                                                    st.rows.o[r][e + 2], st.rows.o[r][e + 3]);
    }
  }
#pragma unroll
  for (int k = 0; k < T::kRowsPerLane; ++k) {
    const float d = T::kValuesPerLane < T::kTokensPerGroup
                        ? across_token_lanes(st.rows.d[k], AddOp())
                        : st.rows.d[k];
    if (st.lane_scores.publishes_row) {
      s_m[group * T::kRows + st.lane_scores.first_row + k] = st.rows.m[k];
      s_d[group * T::kRows + st.lane_scores.first_row + k] = d;
    }
  }
}

}  // namespace flare::decode
