// What the GPU SpMM launchers share (spmm_gpu.cpp for CSR, hyb_gpu.cpp for hyb's remainders):
// the merge-path kernels' workspace layout and launch, and a process-wide table of the sparse
// kernels' functions by configuration.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/sparse/spmm_gpu.h"
#include "kernels/spmm_csr.cuh"
#include "src/sparse/gpu_operands.h"

namespace flare::sparse::spmm_launch {

int64_t chunk_count(int64_t rows, int64_t nnz, int64_t chunk_items);

// The workspace of one feature tile: the carry rows, the head rows (`tile` float32 each:
// aligned as the workspace, to the kernels' vectors of at most 16 bytes), then the carry and the
// head row indices.
struct WorkspaceLayout {
  size_t head = 0, carry_row = 0, head_row = 0, bytes = 0;
};
WorkspaceLayout workspace_layout(int64_t rows, int64_t nnz, const SpmmSchedule& schedule);

// X's or Y's columns [first, first + tile) as a [rows, tile] view with the same row stride.
inline TensorView column_tile(const TensorView& t, int64_t first, int64_t tile) {
  TensorView view = t;
  view.data = static_cast<char*>(t.data) + first * static_cast<int64_t>(dtype_bytes(t.dtype));
  view.shape[1] = tile;
  return view;
}

// Sets p's chunking (p.rows and p.nnz already set) and its workspace pointers into `workspace`
// for `schedule`, then launches the chunks and the carries kernels on `stream`.
void launch_csr(SpmmCsrParams& p, void* workspace, const SpmmSchedule& schedule,
                cuda::Function chunks, cuda::Function carries, cuda::Stream stream);

// A CSR sub-matrix of a decomposition (hyb's or BSR's remainder) whose row i is Y's row
// row_ids[i]: its arrays on the device (indptr from 0, indices and values from its first nonzero).
struct MappedCsr {
  const int32_t* indptr;
  const int32_t* indices;
  const void* values;
  const int32_t* row_ids;
  int64_t rows;
  int64_t nnz;
};

// One feature tile of y (+)= M x through the mapped merge-path pair (spmm_hyb_kernel_spec's
// flare_spmm_csr / flare_spmm_csr_carries) at chunk spmm_chunk_items(tile): x_tile [cols, tile]
// and y_tile [y_rows, tile] with their row strides; accumulate adds to Y's rows.
void launch_mapped_csr(const MappedCsr& m, int64_t cols, int64_t y_rows, const TensorView& x_tile,
                       const TensorView& y_tile, int64_t x_stride, int64_t y_stride,
                       bool accumulate, void* workspace, cuda::Function chunks,
                       cuda::Function carries, cuda::Stream stream);

// A sparse kernel configuration: its family and the numbers its spec is made of.
struct KernelKey {
  enum Family { kCsr, kHyb, kSddmm, kBsr } family;
  int features;
  int vec;
  DType dtype;
  int device;
  bool operator==(const KernelKey&) const = default;
};

// The functions `entries` of the spec `make_spec` builds, loaded on key.device, in entry
// order: jit::get_kernel at the configuration's first call, a table lookup afterwards
// (get_kernel builds the spec's strings and its lookup key each call: most of a sparse call's
// host time when it launches several feature tiles). Thread-safe.
const std::vector<cuda::Function>& cached_kernels(const KernelKey& key,
                                                  jit::KernelSpec (*make_spec)(int, int, DType),
                                                  std::initializer_list<const char*> entries);

// The sparse launchers' feature-tile loop: for each tile [first, first + tile) of x's and y's
// columns, one after another (the tiles share the workspace), calls
// launch_tile(x_tile, y_tile, kernels) with the family's kernels for the tile's width and the
// widest vector its columns allow.
template <class LaunchTile>
void for_each_feature_tile(const TensorView& x, const TensorView& y, int64_t tile,
                           KernelKey::Family family, jit::KernelSpec (*make_spec)(int, int, DType),
                           std::initializer_list<const char*> entries, LaunchTile&& launch_tile) {
  for (int64_t first = 0; first < x.shape[1]; first += tile) {
    const TensorView x_tile = column_tile(x, first, tile), y_tile = column_tile(y, first, tile);
    const KernelKey key{family, static_cast<int>(tile),
                        gpu_operands::vector_width(tile, x_tile, y_tile), x.dtype, x.device.index};
    launch_tile(x_tile, y_tile, cached_kernels(key, make_spec, entries));
  }
}

}  // namespace flare::sparse::spmm_launch
