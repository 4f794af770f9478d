// SpMM on the GPU (issue 23): Y = A X for a CSR A whose arrays are on a CUDA device, with the
// kernels of kernels/spmm_csr.cuh (merge-based: warps take equal runs of the merged row ends
// and nonzeros, a row split between warps is summed by a second, deterministic pass; float32,
// float16 or bfloat16 with float32 sums; the hyb(c, k) decomposition's kernels: hyb_gpu.h).
// The CPU reference is flare/sparse/csr.h's spmm_reference.
#pragma once

#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/csr.h"

namespace flare::sparse {

// Merge items (nonzeros and row ends) a warp takes, a chunk, at feature size d by default: 128,
// or d above 128 (the workspace then stays about 8 bytes an item).
int64_t spmm_chunk_items(int64_t d);

// How the kernels cover Y = A X (what flare/sparse/spmm_tune.h chooses per matrix): features
// [0, d) in tiles of feature_tile, one pair of launches a tile, one after another (a tile gathers
// only its columns of X's rows: a working set that can stay in L2 where all of X does not),
// warps taking chunk_items merge items each. Every schedule gives A X; the summation order,
// and so the last bits, depend on chunk_items.
struct SpmmSchedule {
  int64_t feature_tile = 0;  // d, or a multiple of 32 dividing d
  int64_t chunk_items = 0;   // in [32, 2^20]
  bool operator==(const SpmmSchedule&) const = default;
};
// {d, spmm_chunk_items(d)}: one pass.
SpmmSchedule default_spmm_schedule(int64_t d);
// The schedules the tuner times for d, the default first: tiles d and every power of two times
// 32 below d that divides it (largest first), each with spmm_chunk_items(tile) times 1, 2, 4.
std::vector<SpmmSchedule> spmm_schedules(int64_t d);

// Device bytes of spmm's workspace for rows, nnz nonzeros and d features, enough for every
// schedule of spmm_schedules(d): per chunk of a schedule, two partial rows of its feature_tile
// float32 (a split row's part at the chunk's end and at its start) and two row indices; the
// same for every dtype.
size_t spmm_workspace_bytes(int64_t rows, int64_t nnz, int64_t d);

// Y = A X on `stream`, two launches a feature tile, without synchronizing or allocating
// (CUDA-graph safe after the first call per feature size, which compiles the kernels: NVRTC,
// disk-cached).
//   a: indptr int32 [rows + 1], indices int32 [nnz], values [nnz] in x's dtype, on x's device
//      (contiguous); the arrays are not validated on the device: a row range outside [0, nnz]
//      is clamped and a column outside [0, cols) contributes nothing (no read outside the
//      tensors), so only well-formed CSR (validate_csr on a host copy) gives A X.
//   x: [cols, d], y: [rows, d], one dtype: float32, float16 or bfloat16 (sums in float32, y
//      rounded to nearest even); CUDA, unit stride along d, rows any stride; d a positive
//      multiple of 32 or a power of two below 32.
//   workspace: contiguous 1-D, any dtype, on x's device, 16-byte aligned, of at least
//      spmm_workspace_bytes(rows, nnz, d) bytes; scratch for this call only (not shared with a call
//      running at the same time).
// Errors (before anything is launched): kInvalidArgument naming the argument (shape, dtype,
// device, stride), kUnsupported for another d or rows + nnz of 2^31 and more.
void spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream);
// The same with a schedule (default_spmm_schedule(d) above): kInvalidArgument for a schedule
// outside SpmmSchedule's ranges or one whose workspace exceeds `workspace`.
void spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream, const SpmmSchedule& schedule);
// spmm's argument checks alone (the errors above), launching nothing.
void check_spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
                const SpmmSchedule& schedule);

// The kernels of d features of `dtype` (float32, float16 or bfloat16) with vectors of `vec`
// elements a lane (at most 16 bytes; d / vec a multiple or a divisor of 32), as a JIT spec:
// entries flare_spmm_csr (the chunks) and flare_spmm_csr_carries (the split rows' sums).
jit::KernelSpec spmm_csr_kernel_spec(int features, int vec, DType dtype = DType::kF32);
// The specs CI compiles: d = 32, 64, 128, 256, 512 in each dtype at the widest vector.
std::vector<jit::KernelSpec> shipped_spmm_kernel_specs();

}  // namespace flare::sparse
