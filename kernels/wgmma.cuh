// flare's thin warpgroup-MMA layer (sm_90a): the shared-memory tile layout wgmma reads, its
// matrix descriptors, and the fence / commit / wait protocol. The MMAs themselves are in
// wgmma_ops.cuh (generated).
//
// Layout ("128-byte swizzle", the mode TMA writes and wgmma descriptors read): a tile of kRows
// rows of 16-bit elements is stored as panels of 64 columns (128 bytes a row), panel after
// panel; inside a panel, row r's 16-byte chunk c lies at r * 128 + ((c ^ (r % 8)) * 16). Tiles
// start 1024-byte aligned (8 rows of a panel), so the hardware's swizzle (address bits 4-6 XOR
// bits 7-9) is exactly this XOR.
#pragma once

#include "decode_params.cuh"
#include "mbarrier.cuh"
#include "wgmma_ops.cuh"

namespace flare::wgmma {

constexpr int kPanelBytes = 128;  // bytes of one panel row
constexpr int kAtomBytes = 1024;  // 8 rows of a panel: the swizzle's period

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of kRows rows.
template <int kRows>
__device__ __forceinline__ unsigned tile_offset(int row, int chunk) {
  static_assert(kRows % 8 == 0, "whole swizzle atoms");
  return static_cast<unsigned>((chunk / 8) * (kRows * kPanelBytes) + row * kPanelBytes +
                               (((chunk % 8) ^ (row % 8)) * 16));
}

// Matrix descriptor: start address, leading and stride byte offsets (16-byte units), 128-byte
// swizzle (mode 1 in bits 62-63). Base offset 0: every tile starts 1024-byte aligned.
__device__ __forceinline__ unsigned long long descriptor(unsigned address, unsigned leading_bytes,
                                                         unsigned stride_bytes) {
  return static_cast<unsigned long long>((address & 0x3ffffu) >> 4) |
         static_cast<unsigned long long>(leading_bytes >> 4) << 16 |
         static_cast<unsigned long long>(stride_bytes >> 4) << 32 | 1ull << 62;
}

// K-major operand (rows are M or N, the 16 k-columns of step `k_step` contiguous) of a kRows
// tile: the descriptor of its first 64-row block (`tile_desc`, from k_major_tile) advanced to row
// `first_row` and to step `k_step`. The step's two chunks lie in panel k_step / 4 at byte
// 32 (k_step % 4) of each row, which the swizzle then permutes as tile_offset does; 8-row groups
// are kAtomBytes apart (stride byte offset); the leading offset is unused in this mode.
// Advancing adds offset / 16 to the start-address field (bits 0-13, address / 16): shared
// addresses stay below 2^18, so the sum never carries out of the field, and a descriptor built
// once per tile plus compile-time constants is what the MMAs read (uniform registers, no
// per-MMA encoding).
__device__ __forceinline__ unsigned long long k_major_tile(unsigned tile) {
  return descriptor(tile, 16, kAtomBytes);
}
template <int kRows>
__device__ __forceinline__ unsigned long long k_major(unsigned long long tile_desc, int first_row,
                                                      int k_step) {
  return tile_desc + (static_cast<unsigned>((k_step / 4) * (kRows * kPanelBytes) +
                                            first_row * kPanelBytes + (k_step % 4) * 32) >>
                      4);
}

// MN-major operand B (V: rows are k, the N columns contiguous) for k rows [16 k_step, + 16) of
// a kRows tile whose descriptor mn_major_tile built: 8-row groups kAtomBytes apart (stride byte
// offset), 64-column panels kRows * 128 bytes apart (leading byte offset).
template <int kRows>
__device__ __forceinline__ unsigned long long mn_major_tile(unsigned tile) {
  return descriptor(tile, kRows * kPanelBytes, kAtomBytes);
}
__device__ __forceinline__ unsigned long long mn_major(unsigned long long tile_desc, int k_step) {
  return tile_desc + (static_cast<unsigned>(k_step * 16 * kPanelBytes) >> 4);
}

// Orders this warpgroup's register accesses before the MMAs that follow (accumulators or A
// fragments written by ordinary instructions).
__device__ __forceinline__ void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most kPending committed groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accesses of an accumulator across the MMA protocol.
template <int kTiles>
__device__ __forceinline__ void hold(float (&d)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
  }
}

// Shared memory written by ordinary stores or cp.async, read next by the tensor cores: each
// writing thread fences before the barrier that publishes the writes.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// --- warp specialization: mbarriers, named barriers, register reallocation ----------------

using sm90::barrier_arrive;  // kernels/mbarrier.cuh
using sm90::barrier_arrive_expect;
using sm90::barrier_init;
using sm90::barrier_wait;

// A 3-D box of `map` (a __grid_constant__ parameter's address) at coordinates (x, y, z),
// innermost first, into shared memory at `dst`; its bytes complete on `barrier`.
__device__ __forceinline__ void bulk_copy_3d(unsigned dst, const void* map, int x, int y, int z,
                                             unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(z), "r"(barrier)
      : "memory");
}

// The same for a 4-D box at (x, y, z, w).
__device__ __forceinline__ void bulk_copy_4d(unsigned dst, const void* map, int x, int y, int z,
                                             int w, unsigned barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
      "[%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(z), "r"(w),
      "r"(barrier)
      : "memory");
}

using sm90::named_arrive;
using sm90::named_sync;

// This warpgroup's registers per thread from here on (sm_90a; the kernel needs a register cap at
// entry, and each role one branch of an if/else: HOPPER.md).
template <int kRegisters>
__device__ __forceinline__ void grow_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void shrink_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

}  // namespace flare::wgmma
