// SpMM on the GPU over "BSR + CSR remainder" (flare/sparse/bsr_gpu.h): the device layout,
// argument checks, the tensor-core block kernel (kernels/spmm_bsr.cuh) and the remainder's
// mapped merge-path launches.
#include "flare/sparse/bsr_gpu.h"

#include <string>

#include "flare/core/error.h"
#include "flare/sparse/hyb_gpu.h"
#include "kernels/spmm_bsr.cuh"
#include "src/sparse/gpu_operands.h"
#include "src/sparse/spmm_launch.h"

namespace flare::sparse {
namespace {

constexpr const char* kWhat = "flare::sparse::spmm (bsr)";
constexpr int kBlock = kSpmmBsrBlock;

// The remainder's feature tile at d (hyb's: d up to 512).
int64_t remainder_tile(int64_t d) { return default_hyb_schedule(d).feature_tile; }

bool aligned16(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 &&
         (t.shape[0] <= 1 || t.strides[0] * static_cast<int64_t>(dtype_bytes(t.dtype)) % 16 == 0);
}

}  // namespace

double BsrGpuLayout::padding_ratio() const {
  if (nnz == 0) return 1.0;
  return static_cast<double>(source.size() + rest_columns.size()) / static_cast<double>(nnz);
}

BsrGpuLayout bsr_gpu_layout(const Csr& a, double min_fill) {
  const BsrWithRemainder split = bsr_split(a, kBlock, kBlock, min_fill);
  BsrGpuLayout out;
  out.rows = a.rows;
  out.cols = a.cols;
  out.nnz = split.nnz;
  out.block_rows = (a.rows + kBlock - 1) / kBlock;
  FLARE_CHECK(split.blocks.blocks() < (int64_t{1} << 31), ErrorCode::kUnsupported,
              "flare::sparse::bsr_gpu_layout: ", split.blocks.blocks(),
              " blocks; the GPU kernel takes fewer than 2^31");
  for (const int64_t e : split.blocks.indptr) out.indptr.push_back(static_cast<int32_t>(e));
  out.block_col = split.blocks.block_col;
  out.source = split.blocks.source;
  const CsrRemainder& rest = split.remainder;
  FLARE_CHECK(static_cast<int64_t>(rest.rows.size() + rest.columns.size()) < (int64_t{1} << 31),
              ErrorCode::kUnsupported, "flare::sparse::bsr_gpu_layout: the remainder holds ",
              rest.rows.size(), " rows and ", rest.columns.size(),
              " nonzeros; the GPU kernels take rows + nonzeros below 2^31");
  out.rest_rows = rest.rows;
  for (const int64_t e : rest.indptr) out.rest_indptr.push_back(static_cast<int32_t>(e));
  out.rest_columns = rest.columns;
  out.rest_source = rest.source;
  return out;
}

size_t bsr_spmm_workspace_bytes(const BsrGpuLayout& layout, int64_t d) {
  FLARE_CHECK(d > 0, ErrorCode::kInvalidArgument, "flare::sparse::bsr_spmm_workspace_bytes",
              ": d must be positive, got ", d);
  const auto rest_rows = static_cast<int64_t>(layout.rest_rows.size());
  if (rest_rows == 0) return 0;
  const int64_t tile = remainder_tile(d);
  return spmm_launch::workspace_layout(rest_rows, static_cast<int64_t>(layout.rest_columns.size()),
                                       {tile, spmm_chunk_items(tile)})
      .bytes;
}

jit::KernelSpec spmm_bsr_kernel_spec(DType dtype) {
  FLARE_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, ErrorCode::kUnsupported, kWhat,
              ": the tensor-core block kernel takes float16 or bfloat16, got ", dtype_name(dtype));
  jit::KernelSpec spec;
  spec.family_header = "spmm_bsr.cuh";
  spec.entry = "flare_spmm_bsr";
  spec.defines = {{"FLARE_SPMM_DTYPE", std::to_string(static_cast<int>(dtype))}};
  spec.label = "spmm bsr16 " + std::string(dtype_name(dtype));
  return spec;
}

std::vector<jit::KernelSpec> shipped_spmm_bsr_kernel_specs() {
  return {spmm_bsr_kernel_spec(DType::kF16), spmm_bsr_kernel_spec(DType::kBF16)};
}

void spmm(const BsrGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream) {
  FLARE_CHECK(a.layout != nullptr, ErrorCode::kInvalidArgument, kWhat, ": A.layout is null");
  const BsrGpuLayout& layout = *a.layout;
  const int64_t d = gpu_operands::check_spmm_operands(kWhat, x, y, layout.rows, layout.cols);
  FLARE_CHECK(x.dtype == DType::kF16 || x.dtype == DType::kBF16, ErrorCode::kUnsupported, kWhat,
              ": the tensor-core block kernel takes float16 or bfloat16 x, got ",
              dtype_name(x.dtype));
  FLARE_CHECK(d > 0 && d % kSpmmBsrFeatures == 0, ErrorCode::kUnsupported, kWhat,
              ": the block kernel takes feature sizes that are positive multiples of 32, got ", d);
  FLARE_CHECK(aligned16(x) && aligned16(y), ErrorCode::kUnsupported, kWhat,
              ": x and y must be 16-byte aligned with row strides of multiples of 16 bytes");
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  gpu_operands::check_array(kWhat, a.indptr, "A.indptr", DType::kI32, size(layout.indptr),
                            x.device);
  gpu_operands::check_array(kWhat, a.block_col, "A.block_col", DType::kI32, size(layout.block_col),
                            x.device);
  gpu_operands::check_array(kWhat, a.values, "A.values", x.dtype, size(layout.source), x.device);
  gpu_operands::check_remainder_arrays(kWhat, a, layout, x.dtype, x.device);
  FLARE_CHECK(
      size(layout.indptr) == layout.block_rows + 1 &&
          size(layout.source) == layout.blocks() * kBlock * kBlock &&
          (layout.rest_rows.empty() ? layout.rest_indptr.size() <= 1
                                    : size(layout.rest_indptr) == size(layout.rest_rows) + 1),
      ErrorCode::kInvalidArgument, kWhat,
      ": the layout's arrays disagree (indptr of block_rows + 1, 256 sources a block, "
      "rest_indptr of rest_rows + 1)");
  FLARE_CHECK(layout.rows < (int64_t{1} << 31) && layout.cols < (int64_t{1} << 31),
              ErrorCode::kUnsupported, kWhat, ": rows and cols must be below 2^31");
  gpu_operands::check_workspace(kWhat, workspace, bsr_spmm_workspace_bytes(layout, d), x.device,
                                "bsr_spmm_workspace_bytes");
  if (layout.rows == 0) return;

  const cuda::DeviceScope scope(x.device.index);
  const int64_t x_stride = layout.cols > 1 ? x.strides[0] : d;
  const int64_t y_stride = layout.rows > 1 ? y.strides[0] : d;
  SpmmBsrParams p{};
  p.indptr = a.indptr.ptr<const int32_t>();
  p.block_col = a.block_col.ptr<const int32_t>();
  p.values = a.values.data;
  p.x = x.data;
  p.y = y.data;
  p.rows = layout.rows;
  p.cols = layout.cols;
  p.blocks = layout.blocks();
  p.block_rows = layout.block_rows;
  p.x_stride = x_stride;
  p.y_stride = y_stride;
  p.feature_tiles = static_cast<int32_t>(d / kSpmmBsrFeatures);
  const spmm_launch::KernelKey block_key{spmm_launch::KernelKey::kBsr, 16, 8, x.dtype,
                                         x.device.index};
  const cuda::Function block_kernel = spmm_launch::cached_kernels(
      block_key, [](int, int, DType dtype) { return spmm_bsr_kernel_spec(dtype); },
      {"flare_spmm_bsr"})[0];
  constexpr int64_t kWarpsPerBlock = kSpmmBsrThreads / 32;
  const int64_t tasks = layout.block_rows * p.feature_tiles;
  const auto blocks = static_cast<unsigned>((tasks + kWarpsPerBlock - 1) / kWarpsPerBlock);
  void* args[] = {&p};
  cuda::launch(block_kernel, blocks, 1, 1, kSpmmBsrThreads, 1, 1, 0, stream, args);

  if (layout.rest_rows.empty()) return;
  const spmm_launch::MappedCsr rest{a.rest_indptr.ptr<const int32_t>(),
                                    a.rest_columns.ptr<const int32_t>(),
                                    a.rest_values.data,
                                    a.rest_rows.ptr<const int32_t>(),
                                    size(layout.rest_rows),
                                    size(layout.rest_columns)};
  const int64_t tile = remainder_tile(d);
  // The hyb family's CSR kernels (kernels 1 and 2), as hyb's remainder runs them.
  spmm_launch::for_each_feature_tile(x, y, tile, spmm_launch::KernelKey::kHyb, spmm_hyb_kernel_spec,
                                     {"flare_spmm_ell", "flare_spmm_csr", "flare_spmm_csr_carries"},
                                     [&](const TensorView& x_tile, const TensorView& y_tile,
                                         const std::vector<cuda::Function>& kernels) {
                                       spmm_launch::launch_mapped_csr(
                                           rest, layout.cols, layout.rows, x_tile, y_tile, x_stride,
                                           y_stride, true, workspace.data, kernels[1], kernels[2],
                                           stream);
                                     });
}

}  // namespace flare::sparse
