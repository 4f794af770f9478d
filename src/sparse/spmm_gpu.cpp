// SpMM on the GPU (flare/sparse/spmm_gpu.h): argument checks, the kernel's vector width, the
// launch of kernels/spmm_csr.cuh.
#include "flare/sparse/spmm_gpu.h"

#include <algorithm>
#include <functional>
#include <string>

#include "flare/core/error.h"
#include "kernels/spmm_csr.cuh"
#include "src/sparse/gpu_operands.h"
#include "src/sparse/spmm_launch.h"

namespace flare::sparse {
int64_t spmm_chunk_items(int64_t d) { return std::max<int64_t>(128, d); }

namespace {

constexpr const char* kWhat = "flare::sparse::spmm";

using spmm_launch::column_tile;
using spmm_launch::workspace_layout;

}  // namespace

SpmmSchedule default_spmm_schedule(int64_t d) { return {d, spmm_chunk_items(d)}; }

std::vector<SpmmSchedule> spmm_schedules(int64_t d) {
  FLARE_CHECK(d > 0, ErrorCode::kInvalidArgument, kWhat, "_schedules: d must be positive, got ", d);
  std::vector<int64_t> tiles = {d};
  for (int64_t tile = 32; tile < d; tile *= 2) {
    if (d % tile == 0) tiles.push_back(tile);
  }
  std::sort(tiles.begin() + 1, tiles.end(), std::greater<>());
  std::vector<SpmmSchedule> schedules;
  for (const int64_t tile : tiles) {
    for (const int64_t factor : {1, 2, 4})
      schedules.push_back({tile, factor * spmm_chunk_items(tile)});
  }
  return schedules;
}

size_t spmm_workspace_bytes(int64_t rows, int64_t nnz, int64_t d) {
  FLARE_CHECK(rows >= 0 && nnz >= 0 && d > 0, ErrorCode::kInvalidArgument, kWhat,
              "_workspace_bytes: rows and nnz must be >= 0 and d positive, got ", rows, ", ", nnz,
              " and ", d);
  size_t bytes = 0;
  for (const SpmmSchedule& schedule : spmm_schedules(d))
    bytes = std::max(bytes, workspace_layout(rows, nnz, schedule).bytes);
  return bytes;
}

jit::KernelSpec spmm_csr_kernel_spec(int features, int vec, DType dtype) {
  gpu_operands::check_kernel_spec(kWhat, features, vec, dtype);
  jit::KernelSpec spec;
  spec.family_header = "spmm_csr.cuh";
  spec.entry = "flare_spmm_csr;flare_spmm_csr_carries";
  spec.defines = {{"FLARE_SPMM_FEATURES", std::to_string(features)},
                  {"FLARE_SPMM_VEC", std::to_string(vec)},
                  {"FLARE_SPMM_DTYPE", std::to_string(static_cast<int>(dtype))}};
  spec.label = "spmm csr " + std::string(dtype_name(dtype)) + " d=" + std::to_string(features) +
               " vec=" + std::to_string(vec);
  return spec;
}

std::vector<jit::KernelSpec> shipped_spmm_kernel_specs() {
  std::vector<jit::KernelSpec> specs;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int d : {32, 64, 128, 256, 512})
      specs.push_back(spmm_csr_kernel_spec(d, 16 / static_cast<int>(dtype_bytes(dtype)), dtype));
  }
  return specs;
}

void spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream) {
  spmm(a, x, y, workspace, stream, default_spmm_schedule(x.ndim == 2 ? x.shape[1] : 1));
}

void check_spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
                const SpmmSchedule& schedule) {
  FLARE_CHECK(x.device.is_cuda(), ErrorCode::kInvalidArgument, kWhat,
              ": x must be a CUDA tensor (the CPU operator is spmm_reference), got x on ",
              x.device.str());
  FLARE_CHECK(a.rows >= 0 && a.cols >= 0, ErrorCode::kInvalidArgument, kWhat,
              ": rows and cols must be >= 0, got ", a.rows, " x ", a.cols);
  FLARE_CHECK(a.values.has_value(), ErrorCode::kInvalidArgument, kWhat, ": A needs values");
  const int64_t nnz = a.nnz();
  const int64_t d = x.ndim == 2 ? x.shape[1] : -1;
  gpu_operands::check_array(kWhat, a.indptr, "A.indptr", DType::kI32, a.rows + 1, x.device);
  gpu_operands::check_array(kWhat, a.indices, "A.indices", DType::kI32, nnz, x.device);
  gpu_operands::check_dense(kWhat, x, "x", a.cols, d, x.device);
  gpu_operands::check_array(kWhat, *a.values, "A.values", x.dtype, nnz, x.device);
  gpu_operands::check_dense(kWhat, y, "y", a.rows, d, x.device);
  FLARE_CHECK(y.dtype == x.dtype, ErrorCode::kInvalidArgument, kWhat, ": y must have x's dtype ",
              dtype_name(x.dtype), ", got ", dtype_name(y.dtype));
  FLARE_CHECK(gpu_operands::feature_size_supported(d), ErrorCode::kUnsupported, kWhat,
              ": the GPU kernel takes feature sizes (x's last dimension) that are positive "
              "multiples of 32 or powers of two below 32, got ",
              d);
  FLARE_CHECK(a.rows + nnz < (int64_t{1} << 31), ErrorCode::kUnsupported, kWhat,
              ": rows + nnz must be below 2^31, got ", a.rows, " + ", nnz);
  const int64_t tile = schedule.feature_tile;
  FLARE_CHECK(
      tile > 0 && tile <= d && d % tile == 0 && gpu_operands::feature_size_supported(tile) &&
          schedule.chunk_items >= 32 && schedule.chunk_items <= (int64_t{1} << 20),
      ErrorCode::kInvalidArgument, kWhat, ": schedule must have a feature_tile dividing d = ", d,
      " (d, or a multiple of 32) and chunk_items in [32, 2^20], got feature_tile ", tile,
      " and chunk_items ", schedule.chunk_items);
  gpu_operands::check_workspace(
      kWhat, workspace, workspace_layout(a.rows, nnz, schedule).bytes, x.device,
      "spmm_workspace_bytes(rows = " + std::to_string(a.rows) + ", nnz = " + std::to_string(nnz) +
          ", d = " + std::to_string(d) + ") covers every schedule");
  const int64_t x_row_bytes =
      (a.cols > 1 ? x.strides[0] : d) * static_cast<int64_t>(dtype_bytes(x.dtype));
  FLARE_CHECK(x_row_bytes < (int64_t{1} << 32), ErrorCode::kUnsupported, kWhat,
              ": x's rows must be less than 4 GiB apart, got a row stride of ", x_row_bytes,
              " bytes");
}

void spmm(const Csr& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream, const SpmmSchedule& schedule) {
  check_spmm(a, x, y, workspace, schedule);
  if (a.rows == 0) return;
  const int64_t d = x.shape[1];
  const int64_t tile = schedule.feature_tile;

  SpmmCsrParams p{};
  p.indptr = a.indptr.ptr<const int32_t>();
  p.indices = a.indices.ptr<const int32_t>();
  p.values = a.values->data;
  p.rows = a.rows;
  p.cols = a.cols;
  // Without columns every nonzero lies outside the matrix: no nonzeros, Y = 0 (and the kernel
  // never reads X, which it otherwise does at row 0 for a column outside the matrix).
  p.nnz = a.cols > 0 ? a.nnz() : 0;
  p.x_stride = a.cols > 1 ? x.strides[0] : d;
  p.y_stride = a.rows > 1 ? y.strides[0] : d;

  const cuda::DeviceScope scope(x.device.index);
  // Feature tiles one after another on the stream (they share the workspace): each pair of
  // launches gathers only its tile of X's rows.
  spmm_launch::for_each_feature_tile(x, y, tile, spmm_launch::KernelKey::kCsr, spmm_csr_kernel_spec,
                                     {"flare_spmm_csr", "flare_spmm_csr_carries"},
                                     [&](const TensorView& x_tile, const TensorView& y_tile,
                                         const std::vector<cuda::Function>& kernels) {
                                       p.x = x_tile.data;
                                       p.y = y_tile.data;
                                       spmm_launch::launch_csr(p, workspace.data, schedule,
                                                               kernels[0], kernels[1], stream);
                                     });
}

}  // namespace flare::sparse
