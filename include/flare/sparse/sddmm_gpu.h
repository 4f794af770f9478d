// SDDMM on the GPU (issue 23): out[e] = q_i . k_j at every nonzero e = (i, j) of a CSR A whose
// arrays are on a CUDA device, with the kernel of kernels/sddmm_csr.cuh (nonzero-balanced warps,
// float32, float16 or bfloat16 with float32 dot products). The CPU reference is
// flare/sparse/csr.h's sddmm_reference.
#pragma once

#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/csr.h"

namespace flare::sparse {

// out = (Q K^T) sampled at A's pattern, on `stream`, without synchronizing or allocating
// (CUDA-graph safe after the first call per feature size, which compiles the kernel: NVRTC,
// disk-cached).
//   a: indptr int32 [rows + 1], indices int32 [nnz] on q's device (contiguous; values unused);
//      not validated on the device: an indptr entry outside [0, nnz] is clamped and a column
//      outside [0, cols) gives 0 (no read outside the tensors), so only a well-formed CSR
//      (validate_csr on a host copy) gives Q K^T at its pattern.
//   q: [rows, d], k: [cols, d], one dtype: float32, float16 or bfloat16; CUDA, unit stride along
//      d, rows any stride; d a positive multiple of 32 or a power of two below 32.
//   out: [nnz] in q's dtype (float32 dot products rounded to nearest even), contiguous, same
//      device.
// Errors (before anything is launched): kInvalidArgument naming the argument (shape, dtype,
// device, stride; nonzeros without rows), kUnsupported for another d or rows / nnz of 2^31 and
// more.
void sddmm(const Csr& a, const TensorView& q, const TensorView& k, const TensorView& out,
           cuda::Stream stream);

// The kernel of d features of `dtype` (float32, float16 or bfloat16) with vectors of `vec`
// elements a lane load (at most 16 bytes; d / vec a multiple or a divisor of 32), as a JIT spec.
jit::KernelSpec sddmm_csr_kernel_spec(int features, int vec, DType dtype = DType::kF32);
// The specs CI compiles: d = 32, 64, 128, 256, 512 in each dtype at the widest vector.
std::vector<jit::KernelSpec> shipped_sddmm_kernel_specs();

}  // namespace flare::sparse
