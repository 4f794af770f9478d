// The batch prefill/append kernel's entry point (the JIT's family header): the mma.sync
// family's CTA (prefill.cuh) or, with FLARE_WARPGROUP, the Hopper family's (prefill_hopper.cuh),
// over the same plan and work-item queue.
#pragma once

#include "prefill.cuh"  // defines FLARE_WARPGROUP (0) when the spec does not
#if FLARE_WARPGROUP
#include "prefill_hopper.cuh"
#endif

namespace flare::prefill {

// Threads and resident CTAs the launch is compiled for. The mma.sync family asks for 1: without
// it ptxas caps some small-tile configs at 128 registers and spills. The Hopper family's register
// split (setmaxnreg) assumes its own count.
#if FLARE_WARPGROUP
constexpr int kMinCtasPerSm = hopper::kCtasPerSm;
#else
constexpr int kMinCtasPerSm = 1;
#endif

}  // namespace flare::prefill

extern "C" __global__ void __launch_bounds__(flare::prefill::T::kLaunchThreads,
                                             flare::prefill::kMinCtasPerSm)
    flare_prefill(const __grid_constant__ flare::PrefillParams params) {
  extern __shared__ __align__(
      flare::kPrefillSharedBaseAlign) unsigned char flare_prefill_smem_base[];
  unsigned char* smem = flare_prefill_smem_base;
  if constexpr (flare::prefill::T::kWarpgroup) {  // tiles start 1024-byte aligned (wgmma.cuh)
    constexpr unsigned kAlign = flare::kWarpgroupTileAlign;
    smem += (kAlign - flare::shared_address(flare_prefill_smem_base) % kAlign) % kAlign;
  }
  flare::wait_for_prior_grids();
  if (static_cast<int>(blockIdx.x) >= flare::prefill::plan_counts(params)->num_ctas) return;
#if FLARE_WARPGROUP
  flare::prefill::hopper::run(params, smem);
#else
  flare::prefill::run_items(params, smem);
#endif
  // Every CTA has taken its last entry: the last one to finish zeroes the queue for the next
  // launch (so run() needs no memset before each one; PDL launches wait for this grid first).
  if (flare::prefill::thread_index() == 0 &&
      atomicAdd(params.next_work_item + 1, 1) == flare::prefill::plan_counts(params)->num_ctas - 1) {
    params.next_work_item[0] = 0;
    params.next_work_item[1] = 0;
  }
}
