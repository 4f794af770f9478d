// SpMM on the GPU (issue 23): Y = A X for a CSR A whose arrays are on a CUDA device, with the
// kernel of kernels/spmm_csr.cuh (a warp per row, float32; no decomposition yet: the hyb(c, k)
// and ELL schedules are the next step). The CPU reference is flare/sparse/csr.h's
// spmm_reference.
#pragma once

#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/csr.h"

namespace flare::sparse {

// Y = A X on `stream`, without synchronizing or allocating (CUDA-graph safe after the first call
// per feature size, which compiles the kernel: NVRTC, disk-cached).
//   a: indptr int32 [rows + 1], indices int32 [nnz], values float32 [nnz], on x's device
//      (contiguous); the arrays are not validated on the device: a row range outside [0, nnz]
//      is clamped and a column outside [0, cols) contributes nothing (no read outside the
//      tensors), so only well-formed CSR (validate_csr on a host copy) gives A X.
//   x: float32 [cols, d], y: float32 [rows, d], CUDA, unit stride along d, rows any stride;
//      d a positive multiple of 32.
// Errors (before anything is launched): kInvalidArgument naming the argument (shape, dtype,
// device, stride), kUnsupported for d not a multiple of 32 or rows / nnz of 2^31 and more.
void spmm(const Csr& a, const TensorView& x, const TensorView& y, cuda::Stream stream);

// The kernel of d features with `vec` floats per lane (4, 2 or 1), as a JIT spec.
jit::KernelSpec spmm_csr_kernel_spec(int features, int vec);
// The specs CI compiles: d = 32, 64, 128, 256, 512 at the widest vector.
std::vector<jit::KernelSpec> shipped_spmm_kernel_specs();

}  // namespace flare::sparse
