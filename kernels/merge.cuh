// The merge of split-KV partial states (papers 001 §2.2, 002 D.2) on a fixed grid: one warp
// per (merge item, row) reduces the row's float32 partial slots in the plan's KV order (a
// fixed order and a fixed shuffle tree: bitwise identical across runs), writes o and lse.
//
// Compile-time defines: FLARE_HEAD_DIM (64 | 128 | 256), FLARE_Q_DTYPE (o's DTypeCode).
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"
#include "merge_utils.cuh"
#include "plan_types.cuh"

namespace flare::merge {

struct Traits {
  static constexpr int kHeadDim = FLARE_HEAD_DIM;
  static constexpr int kOCode = FLARE_Q_DTYPE;
  static constexpr int kThreads = 128;
  static constexpr int kWarps = kThreads / 32;
  static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head dim");
  static_assert(kOCode == kCodeF16 || kOCode == kCodeBF16, "o dtype");
};

using T = Traits;

}  // namespace flare::merge

extern "C" __global__ void __launch_bounds__(flare::merge::Traits::kThreads)
    flare_merge(const flare::MergeParams params) {
  using flare::merge::T;
  const unsigned char* ws = params.workspace;
  const auto* counts = reinterpret_cast<const flare::PlanCounts*>(ws + params.offsets.counts);
  const int* merge_indptr = reinterpret_cast<const int*>(ws + params.offsets.merge_indptr);
  const auto* items = reinterpret_cast<const flare::MergeItem*>(ws + params.offsets.merge_items);
  const int rows_per_item = params.offsets.partial_rows;
  const long long pairs = static_cast<long long>(counts->num_merge_items) * rows_per_item;
  const long long warp = blockIdx.x * T::kWarps + threadIdx.x / 32;
  for (long long pair = warp; pair < pairs; pair += static_cast<long long>(gridDim.x) * T::kWarps) {
    const int index = static_cast<int>(pair / rows_per_item);
    const int r = static_cast<int>(pair % rows_per_item);
    const flare::MergeItem item = items[index];
    if (r < item.row_end - item.row_begin) {
      flare::merge::merge_row<T::kHeadDim, T::kOCode>(params, item, r, merge_indptr[index],
                                                       merge_indptr[index + 1]);
    }
  }
}
