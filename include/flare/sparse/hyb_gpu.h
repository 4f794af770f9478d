// SpMM on the GPU over a hyb(c, k) decomposition (issue 23, SparseTIR §3.4): Y = A X with A held
// as hyb.h's column partitions of ELL buckets and a CSR remainder, copied to the device in the
// layout below. Each partition is one launch over all its buckets (kernels/spmm_hyb.cuh: a warp
// takes whole rows of one bucket, no row structure to search) plus the remainder's merge-path
// pair (spmm_csr.cuh), partitions in order on one stream, later ones adding to Y: no atomics,
// deterministic. The same result as spmm() on the CSR matrix up to summation order (16-bit Y is
// rounded once per partition). The CPU reference is hyb.h's spmm_reference.
#pragma once

#include <cstdint>
#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/hyb.h"

namespace flare::sparse {

// The device arrays of a decomposition as host vectors (to be copied to the device as they
// are), and where each bucket and remainder lies in them.
struct HybGpuLayout {
  struct Bucket {             // one ELL bucket holding rows
    int64_t row_offset = 0;   // its first row in ell_rows
    int64_t rows = 0;         // > 0 (empty buckets are left out)
    int64_t slot_offset = 0;  // its first slot in ell_columns: rows << log2_width slots
    int log2_width = 0;
  };
  struct Remainder {         // a partition's CSR remainder (rows = 0: none)
    int64_t row_offset = 0;  // its first row in rest_rows
    int64_t rows = 0;
    int64_t indptr_offset = 0;  // its indptr in rest_indptr: rows + 1 entries from 0
    int64_t nnz_offset = 0;     // its first nonzero in rest_columns
    int64_t nnz = 0;
  };
  struct Partition {
    std::vector<Bucket> buckets;  // increasing width
    Remainder remainder;
  };
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t nnz = 0;
  std::vector<Partition> partitions;
  // Partition 0 also lists the rows of A it holds no nonzero of, as padding rows of its width-1
  // bucket: its launches then write every row of Y.
  std::vector<int32_t> ell_rows;     // each bucket row's row of A
  std::vector<int32_t> ell_columns;  // every slot's column, -1 for padding
  std::vector<int64_t> ell_source;   // every slot's nonzero of A, -1 for padding
  std::vector<int32_t> rest_rows;
  std::vector<int32_t> rest_indptr;
  std::vector<int32_t> rest_columns;
  std::vector<int64_t> rest_source;
  // Stored slots (ELL slots with padding, plus remainder nonzeros) over nnz (1 when empty).
  double padding_ratio() const;
};

// The device layout of hyb_from_csr(a, column_parts, max_log2_width)'s decomposition, built
// straight from `a` (validated first; values not needed: the layout holds each slot's source)
// in two passes, without the Hyb in between. kInvalidArgument as hyb_from_csr's, naming
// hyb_gpu_layout; kUnsupported when a partition's remainder holds 2^31 or more rows +
// nonzeros.
HybGpuLayout hyb_gpu_layout(const Csr& a, int column_parts, int max_log2_width);

// A decomposition on one CUDA device: `layout`'s arrays, each a contiguous 1-D tensor of the
// layout vector's size: int32 for rows / columns / indptr, X's dtype for the values
// (ell_values[s] = A.values[ell_source[s]], 0 for padding; rest_values likewise).
struct HybGpu {
  const HybGpuLayout* layout = nullptr;
  TensorView ell_rows, ell_columns, ell_values;
  TensorView rest_rows, rest_indptr, rest_columns, rest_values;
};

// How the kernels cover Y = A X over a decomposition: features [0, d) in tiles of feature_tile
// launched one after another (each tile every partition in order: a tile gathers only its
// columns of X's rows), an ELL warp taking slots_per_warp slots (rows of a bucket of width w:
// max(1, slots_per_warp / w)); the remainders at spmm_chunk_items(feature_tile).
struct HybSchedule {
  int64_t feature_tile = 0;    // d (at most 512) or a multiple of 32 dividing d, at most 512
  int64_t slots_per_warp = 0;  // a power of two in [32, 65536]
  bool operator==(const HybSchedule&) const = default;
};
// d up to 512 (else its largest divisor 32 * 2^i <= 512: a lane's sums at 1024 spill), with the
// power of two at or above spmm_chunk_items(tile) slots a warp.
HybSchedule default_hyb_schedule(int64_t d);
// The schedules hyb's tuner times for d, the default first: the tiles of spmm_schedules(d) up to
// 512, each with its default slots a warp and four times that.
std::vector<HybSchedule> hyb_schedules(int64_t d);

// Device bytes of the workspace spmm(HybGpu) needs at feature size d for every schedule of
// hyb_schedules(d) (the largest remainder's partial rows; 0 without a remainder).
size_t hyb_spmm_workspace_bytes(const HybGpuLayout& layout, int64_t d);

// Y = A X on `stream` without synchronizing or allocating (CUDA-graph safe after the first call
// per feature tile and dtype, which compiles the kernels). x, y, workspace and the errors as
// spmm(Csr) (x [cols, d], y [rows, d], one dtype; d a multiple of 32 or a power of two below 32),
// plus kInvalidArgument naming the HybGpu array whose dtype, device or size differs from the
// layout's, and for a schedule outside HybSchedule's ranges. The arrays are not validated on
// the device: a column outside [0, cols) contributes nothing and a row outside [0, rows) is not
// written (no access outside the tensors).
void spmm(const HybGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream);  // default_hyb_schedule(d)
void spmm(const HybGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream, const HybSchedule& schedule);
// spmm's argument checks alone (the errors above), launching nothing.
void check_spmm(const HybGpu& a, const TensorView& x, const TensorView& y,
                const TensorView& workspace, const HybSchedule& schedule);

// The kernels of d features of `dtype` with vectors of `vec` elements (as spmm_csr_kernel_spec):
// entries flare_spmm_ell, and flare_spmm_csr / flare_spmm_csr_carries with mapped rows.
jit::KernelSpec spmm_hyb_kernel_spec(int features, int vec, DType dtype = DType::kF32);
// The specs CI compiles: d = 32, 128, 512 in each dtype at the widest vector.
std::vector<jit::KernelSpec> shipped_spmm_hyb_kernel_specs();

}  // namespace flare::sparse
