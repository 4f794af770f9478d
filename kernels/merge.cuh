// The merge of split-KV partial states (papers 001 §2.2, 002 D.2) on a fixed grid: one warp
// per (merge item, row) reduces the row's float32 partial slots in the plan's KV order (a
// fixed order and a fixed shuffle tree: bitwise identical across runs), writes o and lse.
// The merge map's entries are partial row bases (slot x partial_rows + the item's first row in
// the slot: cascade plans merge pieces that start inside a shared level's slot).
//
// Compile-time defines: FLARE_HEAD_DIM (64 | 128 | 256), FLARE_Q_DTYPE (o's DTypeCode).
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "plan_types.cuh"

namespace flare::merge {

struct Traits {
  static constexpr int kHeadDim = FLARE_HEAD_DIM;
  static constexpr int kOCode = FLARE_Q_DTYPE;
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kDimsPerLane = kHeadDim / 32;  // 2, 4 or 8
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim");
  static_assert(kOCode == kCodeF16 || kOCode == kCodeBF16, "o dtype");
};

using T = Traits;

// Slots of a row are spread over the lanes for the max and the weights (so a long split costs
// a few shuffles, not a chain of dependent loads); the weighted sum then walks the slots in KV
// order, slot id and weight broadcast from their lane, loads unrolled so several are in flight.
// Row r of merge item `item` under its KV head + h (h < the plan's merge_heads): the entries'
// partial rows shifted by h slots (a merge item of several heads lists head 0's slots, the
// others' being the next ones: slot numbering head minor).
__device__ __forceinline__ void merge_row(const MergeParams& p, const MergeItem& item, int h,
                                          int r, int slot_begin, int slot_end) {
  constexpr unsigned kFull = 0xffffffffu;
  // Partial rows in flight per lane: 64 floats of loads outstanding whatever the head dim.
  constexpr int kUnroll = 64 / T::kDimsPerLane;
  const int lane = threadIdx.x % 32;
  const unsigned char* ws = p.workspace;
  const int* row_bases = reinterpret_cast<const int*>(ws + p.offsets.merge_slots);
  const float* partial_o = p.offsets.partial_o;
  const float* partial_lse = p.offsets.partial_lse;
  const int head_rows = h * p.offsets.partial_rows;

  float lse_max = negative_infinity();
  for (int i = slot_begin + lane; i < slot_end; i += 32) {
    lse_max = fmaxf(lse_max, partial_lse[row_bases[i] + head_rows + r]);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    lse_max = fmaxf(lse_max, __shfl_xor_sync(kFull, lse_max, offset));
  }
  const int packed = item.row_begin + r;
  const long long head = (item.kv_head + h) * p.group_size + packed % p.group_size;
  // The head's attention sink (MergeParams::sink): one more state, of value 0, in every row.
  const bool sink = p.sink != nullptr && !p.sum_partials;
  const float sink_lse = sink ? __ldg(p.sink + head) : negative_infinity();
  lse_max = fmaxf(lse_max, sink_lse);
  const float base = lse_max == negative_infinity() ? 0.0f : lse_max;

  float acc[T::kDimsPerLane];
#pragma unroll
  for (int e = 0; e < T::kDimsPerLane; ++e) acc[e] = 0.0f;
  float denominator = 0.0f;  // this lane's slots; summed over the warp at the end
  for (int first = slot_begin; first < slot_end; first += 32) {
    const int count = slot_end - first < 32 ? slot_end - first : 32;
    long long my_row = 0;
    float my_weight = 0.0f;
    if (lane < count) {
      my_row = row_bases[first + lane] + head_rows + r;
      my_weight = p.sum_partials ? 1.0f : fast_exp2((partial_lse[my_row] - base) * kLog2e);
    }
    denominator += my_weight;
    for (int j0 = 0; j0 < count; j0 += kUnroll) {
      float part[kUnroll][T::kDimsPerLane];
      float weight[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long row = __shfl_sync(kFull, my_row, (j0 + u) & 31);
        weight[u] = __shfl_sync(kFull, my_weight, (j0 + u) & 31);
        const float* src = partial_o + row * T::kHeadDim + lane * T::kDimsPerLane;
#pragma unroll
        for (int e = 0; e < T::kDimsPerLane; ++e) {
          part[u][e] = j0 + u < count ? src[e] : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < T::kDimsPerLane; ++e) acc[e] = fmaf(weight[u], part[u][e], acc[e]);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    denominator += __shfl_xor_sync(kFull, denominator, offset);
  }
  if (sink) denominator += fast_exp2((sink_lse - base) * kLog2e);
  const bool empty = denominator == 0.0f;
  const float norm = p.sum_partials ? 1.0f : empty ? 0.0f : 1.0f / denominator;

  // Prefill passes each request's first token; decode has one token per request.
  const long long first_token = p.qo_begin != nullptr ? p.qo_begin[item.request] : item.request;
  const long long token = first_token + packed / p.group_size;
  unsigned char* o =
      static_cast<unsigned char*>(p.o) +
      ((token * p.o_stride_token + head * p.o_stride_head) + lane * T::kDimsPerLane) * 2;
#pragma unroll
  for (int e = 0; e < T::kDimsPerLane; e += 2) {
    *reinterpret_cast<unsigned*>(o + e * 2) =
        float2_to_16bit2<T::kOCode>(acc[e] * norm, acc[e + 1] * norm);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] =
        empty ? negative_infinity() : (lse_max + fast_log2(denominator) * kLn2) * p.lse_scale;
  }
}

}  // namespace flare::merge

extern "C" __global__ void __launch_bounds__(flare::merge::Traits::kThreads)
    flare_merge(const flare::MergeParams params) {
  using flare::merge::T;
  flare::wait_for_prior_grids();
  const unsigned char* ws = params.workspace;
  const auto* counts = reinterpret_cast<const flare::PlanCounts*>(ws + params.offsets.counts);
  const int* merge_indptr = reinterpret_cast<const int*>(ws + params.offsets.merge_indptr);
  const auto* items = reinterpret_cast<const flare::MergeItem*>(ws + params.offsets.merge_items);
  // (item, head, row) triples up to the plan's longest item: warps walk no padding rows of the
  // slots (16-row items in 128-row slots cost 8x the loop trips, each an L2 round trip).
  const int rows_per_item = min(counts->max_merge_rows, params.offsets.partial_rows);
  const int heads = counts->merge_heads;
  const long long per_item = static_cast<long long>(heads) * rows_per_item;
  const long long pairs = static_cast<long long>(counts->num_merge_items) * per_item;
  const long long warp = blockIdx.x * T::kWarps + threadIdx.x / 32;
  for (long long pair = warp; pair < pairs; pair += static_cast<long long>(gridDim.x) * T::kWarps) {
    const int index = static_cast<int>(pair / per_item);
    const int h = static_cast<int>(pair % per_item / rows_per_item);
    const int r = static_cast<int>(pair % rows_per_item);
    const flare::MergeItem item = items[index];
    if (r < item.row_end - item.row_begin) {
      flare::merge::merge_row(params, item, h, r, merge_indptr[index], merge_indptr[index + 1]);
    }
  }
}
