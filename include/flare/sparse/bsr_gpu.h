// SpMM on the GPU over the "BSR + CSR remainder" decomposition (issue 23, bsr.h's bsr_split)
// with tensor cores: blocks of 16 x 16 holding at least min_fill of their slots go to
// kernels/spmm_bsr.cuh (a warp a block row and 32 features, mma.sync m16n8k16 on float16 or
// bfloat16, float32 sums), every other nonzero to a CSR remainder added afterwards through the
// merge-path kernels with mapped rows (spmm_hyb.cuh's). Y's rows are written once by the block
// kernel (block rows without blocks as zeros) and the remainder adds to its rows: no atomics,
// deterministic; 16-bit Y is rounded once by each. The CPU reference is bsr.h's spmm_reference.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/bsr.h"

namespace flare::sparse {

// The device arrays of bsr_split(a, 16, 16, min_fill) as host vectors.
struct BsrGpuLayout {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nnz = 0;
  int64_t block_rows = 0;          // ceil(rows / 16)
  std::vector<int32_t> indptr;     // [block_rows + 1]: block row b's blocks
  std::vector<int32_t> block_col;  // [blocks], increasing within a block row
  std::vector<int64_t> source;     // [blocks][16][16]: the slot's nonzero of A, -1 for padding
  // The remainder: rows holding a nonzero outside the blocks, in order, as CSR.
  std::vector<int32_t> rest_rows;
  std::vector<int32_t> rest_indptr;  // [rest_rows + 1] from 0
  std::vector<int32_t> rest_columns;
  std::vector<int64_t> rest_source;

  int64_t blocks() const { return static_cast<int64_t>(block_col.size()); }
  // Stored slots (256 a block plus the remainder's nonzeros) over nnz (1 when empty).
  double padding_ratio() const;
};

// The layout of `a` (validated, values needed: bsr_split's) with blocks holding at least
// min_fill * 256 nonzeros (min_fill in [0, 1]; 0: every nonzero in blocks). Throws
// kInvalidArgument as bsr_split, kUnsupported for 2^31 or more blocks or remainder rows +
// nonzeros.
BsrGpuLayout bsr_gpu_layout(const Csr& a, double min_fill);

// The layout's arrays on one CUDA device, each a contiguous 1-D tensor of the layout vector's
// size: int32 for indptr / block_col / rest_*, X's dtype for values ([blocks * 256]:
// values[s] = A.values[source[s]], 0 for padding) and rest_values.
struct BsrGpu {
  const BsrGpuLayout* layout = nullptr;
  TensorView indptr, block_col, values;
  TensorView rest_rows, rest_indptr, rest_columns, rest_values;
};

// Device bytes of the remainder's workspace at feature size d (0 without a remainder).
size_t bsr_spmm_workspace_bytes(const BsrGpuLayout& layout, int64_t d);

// Y = A X on `stream` without synchronizing or allocating (CUDA-graph safe after the first call
// per dtype and feature size, which compiles the kernels). x [cols, d], y [rows, d]: one dtype,
// float16 or bfloat16 (kUnsupported otherwise: tensor cores), CUDA, unit stride along d, 16-byte
// aligned with row strides of multiples of 16 bytes (kUnsupported otherwise), d a positive
// multiple of 32 (kUnsupported); workspace as spmm(Csr)'s, of bsr_spmm_workspace_bytes bytes.
// kInvalidArgument naming the BsrGpu array whose dtype, device or size differs from the
// layout's. The arrays are not validated on the device: a block column outside the matrix
// contributes nothing, a remainder column outside it nothing, a remainder row outside Y is not
// written (no access outside the tensors).
void spmm(const BsrGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream);

// The block kernel of `dtype` (float16 or bfloat16) as a JIT spec: entry flare_spmm_bsr.
jit::KernelSpec spmm_bsr_kernel_spec(DType dtype);
// The specs CI compiles: float16 and bfloat16.
std::vector<jit::KernelSpec> shipped_spmm_bsr_kernel_specs();

}  // namespace flare::sparse
