// Merging one row of a split tile from its float32 partial slots (papers 001 §2.2, 002 D.2):
// shared by the standalone merge kernel (kernels/merge.cuh) and the decode kernel's fused merge.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "plan_types.cuh"

namespace flare::merge {

// Slots of a row are spread over the lanes for the max and the weights (so a long split costs
// a few shuffles, not a chain of dependent loads); the weighted sum then walks the slots in KV
// order, slot id and weight broadcast from their lane, loads unrolled so several are in flight.
// kFloatsInFlight: loads outstanding per lane (registers): the standalone kernel affords 64,
// the decode kernel's fused merge fewer, to stay within the decode loop's register budget.
template <int kHeadDim, int kOCode, int kFloatsInFlight = 64>
__device__ __forceinline__ void merge_row(const MergeParams& p, const MergeItem& item, int r,
                                          int slot_begin, int slot_end) {
  constexpr int kDimsPerLane = kHeadDim / 32;
  constexpr unsigned kFull = 0xffffffffu;
  constexpr int kUnroll = kFloatsInFlight / kDimsPerLane;
  static_assert(kUnroll >= 1, "at least one partial row in flight");
  const int lane = threadIdx.x % 32;
  const unsigned char* ws = p.workspace;
  const int* slots = reinterpret_cast<const int*>(ws + p.offsets.merge_slots);
  const float* partial_o = reinterpret_cast<const float*>(ws + p.offsets.partial_o);
  const float* partial_lse = reinterpret_cast<const float*>(ws + p.offsets.partial_lse);

  float lse_max = negative_infinity();
  for (int i = slot_begin + lane; i < slot_end; i += 32) {
    lse_max = fmaxf(lse_max, __ldcg(partial_lse + static_cast<long long>(slots[i]) *
                                                      p.offsets.partial_rows + r));
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    lse_max = fmaxf(lse_max, __shfl_xor_sync(kFull, lse_max, offset));
  }
  const float base = lse_max == negative_infinity() ? 0.0f : lse_max;

  float acc[kDimsPerLane];
#pragma unroll
  for (int e = 0; e < kDimsPerLane; ++e) acc[e] = 0.0f;
  float denominator = 0.0f;  // this lane's slots; summed over the warp at the end
  for (int first = slot_begin; first < slot_end; first += 32) {
    const int count = slot_end - first < 32 ? slot_end - first : 32;
    long long my_row = 0;
    float my_weight = 0.0f;
    if (lane < count) {
      my_row = static_cast<long long>(slots[first + lane]) * p.offsets.partial_rows + r;
      my_weight = fast_exp2((__ldcg(partial_lse + my_row) - base) * kLog2e);
    }
    denominator += my_weight;
    for (int j0 = 0; j0 < count; j0 += kUnroll) {
      float part[kUnroll][kDimsPerLane];
      float weight[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const long long row = __shfl_sync(kFull, my_row, (j0 + u) & 31);
        weight[u] = __shfl_sync(kFull, my_weight, (j0 + u) & 31);
        const float* src = partial_o + row * kHeadDim + lane * kDimsPerLane;
#pragma unroll
        for (int e = 0; e < kDimsPerLane; ++e) {
          part[u][e] = j0 + u < count ? __ldcg(src + e) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int e = 0; e < kDimsPerLane; ++e) acc[e] = fmaf(weight[u], part[u][e], acc[e]);
      }
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    denominator += __shfl_xor_sync(kFull, denominator, offset);
  }
  const bool empty = denominator == 0.0f;
  const float norm = empty ? 0.0f : 1.0f / denominator;

  const int packed = item.row_begin + r;
  // Prefill passes qo_indptr (request -> first token); decode has one token per request.
  const long long first_token =
      p.qo_indptr != nullptr ? p.qo_indptr[item.request] : item.request;
  const long long token = first_token + packed / p.group_size;
  const long long head = item.kv_head * p.group_size + packed % p.group_size;
  unsigned char* o = static_cast<unsigned char*>(p.o) +
                     ((token * p.o_stride_token + head * p.o_stride_head) +
                      lane * kDimsPerLane) * 2;
#pragma unroll
  for (int e = 0; e < kDimsPerLane; e += 2) {
    *reinterpret_cast<unsigned*>(o + e * 2) =
        float2_to_16bit2<kOCode>(acc[e] * norm, acc[e + 1] * norm);
  }
  if (p.lse != nullptr && lane == 0) {
    p.lse[token * p.lse_stride_token + head * p.lse_stride_head] =
        empty ? negative_infinity() : lse_max + fast_log2(denominator) * kLn2;
  }
}

}  // namespace flare::merge
