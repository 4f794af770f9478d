// SpMM on the GPU over hyb(c, k) (flare/sparse/hyb_gpu.h): schedules, argument checks and the
// launches of kernels/spmm_hyb.cuh (the device layout: hyb_gpu_layout.cpp).
#include "flare/sparse/hyb_gpu.h"

#include <algorithm>
#include <string>

#include "flare/core/error.h"
#include "kernels/spmm_hyb.cuh"
#include "src/sparse/gpu_operands.h"
#include "src/sparse/spmm_launch.h"

namespace flare::sparse {
namespace {

constexpr const char* kWhat = "flare::sparse::spmm (hyb)";

void check_layout(const HybGpuLayout& layout) {
  const auto within = [](int64_t offset, int64_t count, size_t size) {
    return offset >= 0 && count >= 0 && offset + count <= static_cast<int64_t>(size);
  };
  for (size_t p = 0; p < layout.partitions.size(); ++p) {
    const HybGpuLayout::Partition& part = layout.partitions[p];
    FLARE_CHECK(part.buckets.size() <= static_cast<size_t>(kSpmmEllMaxBuckets),
                ErrorCode::kInvalidArgument, kWhat, ": partition ", p, " has ", part.buckets.size(),
                " buckets, at most ", kSpmmEllMaxBuckets);
    for (const HybGpuLayout::Bucket& b : part.buckets) {
      FLARE_CHECK(b.log2_width >= 0 && b.log2_width <= 16 && b.rows > 0 &&
                      b.rows < (int64_t{1} << 31) &&
                      within(b.row_offset, b.rows, layout.ell_rows.size()) &&
                      within(b.slot_offset, b.rows << b.log2_width, layout.ell_columns.size()),
                  ErrorCode::kInvalidArgument, kWhat, ": partition ", p, "'s bucket of width 2^",
                  b.log2_width, " (", b.rows, " rows at row ", b.row_offset, ", slot ",
                  b.slot_offset, ") lies outside the layout's arrays");
    }
    const HybGpuLayout::Remainder& r = part.remainder;
    FLARE_CHECK(within(r.row_offset, r.rows, layout.rest_rows.size()) &&
                    within(r.indptr_offset, r.rows + 1, layout.rest_indptr.size()) &&
                    within(r.nnz_offset, r.nnz, layout.rest_columns.size()) &&
                    r.rows + r.nnz < (int64_t{1} << 31),
                ErrorCode::kInvalidArgument, kWhat, ": partition ", p, "'s remainder (", r.rows,
                " rows, ", r.nnz, " nonzeros) lies outside the layout's arrays");
  }
}

// The widest feature tile: a lane's sums at 1024 spill.
constexpr int64_t kMaxTile = 512;

int64_t default_slots(int64_t tile) {
  int64_t slots = 32;
  while (slots < spmm_chunk_items(tile)) slots *= 2;
  return slots;
}

// The remainders' schedule for a feature tile.
SpmmSchedule remainder_schedule(int64_t tile) { return {tile, spmm_chunk_items(tile)}; }

// Workspace bytes the remainders need at a feature tile (they run one after another, sharing it).
size_t remainder_workspace_bytes(const HybGpuLayout& layout, int64_t tile) {
  size_t bytes = 0;
  for (const HybGpuLayout::Partition& part : layout.partitions) {
    const HybGpuLayout::Remainder& r = part.remainder;
    if (r.rows > 0) {
      bytes = std::max(
          bytes, spmm_launch::workspace_layout(r.rows, r.nnz, remainder_schedule(tile)).bytes);
    }
  }
  return bytes;
}

}  // namespace

HybSchedule default_hyb_schedule(int64_t d) {
  FLARE_CHECK(d > 0, ErrorCode::kInvalidArgument, "flare::sparse::default_hyb_schedule",
              ": d must be positive, got ", d);
  int64_t tile = d;
  if (d > kMaxTile) {
    tile = kMaxTile;
    while (d % tile != 0) tile /= 2;
  }
  return {tile, default_slots(tile)};
}

std::vector<HybSchedule> hyb_schedules(int64_t d) {
  std::vector<HybSchedule> schedules = {default_hyb_schedule(d)};
  for (const SpmmSchedule& s : spmm_schedules(d)) {
    if (s.feature_tile > kMaxTile || s.chunk_items != spmm_chunk_items(s.feature_tile)) continue;
    for (const int64_t factor : {1, 4}) {
      const HybSchedule candidate{s.feature_tile, factor * default_slots(s.feature_tile)};
      if (std::find(schedules.begin(), schedules.end(), candidate) == schedules.end())
        schedules.push_back(candidate);
    }
  }
  return schedules;
}

size_t hyb_spmm_workspace_bytes(const HybGpuLayout& layout, int64_t d) {
  FLARE_CHECK(d > 0, ErrorCode::kInvalidArgument, "flare::sparse::hyb_spmm_workspace_bytes",
              ": d must be positive, got ", d);
  size_t bytes = 0;
  for (const HybSchedule& schedule : hyb_schedules(d))
    bytes = std::max(bytes, remainder_workspace_bytes(layout, schedule.feature_tile));
  return bytes;
}

jit::KernelSpec spmm_hyb_kernel_spec(int features, int vec, DType dtype) {
  jit::KernelSpec spec = spmm_csr_kernel_spec(features, vec, dtype);  // its checks and defines
  spec.family_header = "spmm_hyb.cuh";
  spec.entry = "flare_spmm_ell;flare_spmm_csr;flare_spmm_csr_carries";
  spec.defines.push_back({"FLARE_SPMM_ROWS_MAPPED", "1"});
  spec.label = "spmm hyb " + std::string(dtype_name(dtype)) + " d=" + std::to_string(features) +
               " vec=" + std::to_string(vec);
  return spec;
}

std::vector<jit::KernelSpec> shipped_spmm_hyb_kernel_specs() {
  std::vector<jit::KernelSpec> specs;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int d : {32, 128, 512})
      specs.push_back(spmm_hyb_kernel_spec(d, 16 / static_cast<int>(dtype_bytes(dtype)), dtype));
  }
  return specs;
}

void spmm(const HybGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream) {
  spmm(a, x, y, workspace, stream, default_hyb_schedule(x.ndim == 2 ? x.shape[1] : 1));
}

void check_spmm(const HybGpu& a, const TensorView& x, const TensorView& y,
                const TensorView& workspace, const HybSchedule& schedule) {
  FLARE_CHECK(a.layout != nullptr, ErrorCode::kInvalidArgument, kWhat, ": A.layout is null");
  const HybGpuLayout& layout = *a.layout;
  const int64_t d = gpu_operands::check_spmm_operands(kWhat, x, y, layout.rows, layout.cols);
  const auto size = [](const auto& v) { return static_cast<int64_t>(v.size()); };
  gpu_operands::check_array(kWhat, a.ell_rows, "A.ell_rows", DType::kI32, size(layout.ell_rows),
                            x.device);
  gpu_operands::check_array(kWhat, a.ell_columns, "A.ell_columns", DType::kI32,
                            size(layout.ell_columns), x.device);
  gpu_operands::check_array(kWhat, a.ell_values, "A.ell_values", x.dtype, size(layout.ell_columns),
                            x.device);
  gpu_operands::check_remainder_arrays(kWhat, a, layout, x.dtype, x.device);
  FLARE_CHECK(gpu_operands::feature_size_supported(d), ErrorCode::kUnsupported, kWhat,
              ": the GPU kernel takes feature sizes (x's last dimension) that are positive "
              "multiples of 32 or powers of two below 32, got ",
              d);
  FLARE_CHECK(layout.rows < (int64_t{1} << 31), ErrorCode::kUnsupported, kWhat,
              ": rows must be below 2^31, got ", layout.rows);
  check_layout(layout);
  const int64_t tile = schedule.feature_tile, slots_per_warp = schedule.slots_per_warp;
  FLARE_CHECK(tile > 0 && tile <= d && tile <= kMaxTile && d % tile == 0 &&
                  gpu_operands::feature_size_supported(tile) && slots_per_warp >= 32 &&
                  slots_per_warp <= 65536 && (slots_per_warp & (slots_per_warp - 1)) == 0,
              ErrorCode::kInvalidArgument, kWhat,
              ": schedule must have a feature_tile of at most 512 dividing d = ", d,
              " (d, or a multiple of 32) and slots_per_warp a power of two in [32, 65536], got "
              "feature_tile ",
              tile, " and slots_per_warp ", slots_per_warp);
  // This schedule's need (no list of every schedule on each call, as the CSR check).
  gpu_operands::check_workspace(kWhat, workspace, remainder_workspace_bytes(layout, tile), x.device,
                                "hyb_spmm_workspace_bytes covers every schedule");
  const int64_t x_row_bytes =
      (layout.cols > 1 ? x.strides[0] : d) * static_cast<int64_t>(dtype_bytes(x.dtype));
  FLARE_CHECK(x_row_bytes < (int64_t{1} << 32), ErrorCode::kUnsupported, kWhat,
              ": x's rows must be less than 4 GiB apart, got a row stride of ", x_row_bytes,
              " bytes");
}

namespace {

// What one feature tile's launches share.
struct TileLaunch {
  const HybGpu& a;
  const TensorView& x;  // the tile's columns of X and Y
  const TensorView& y;
  int64_t x_stride, y_stride;
  void* workspace;
  cuda::Stream stream;
};

// Every bucket of a partition in one launch: a warp takes rows_per_warp rows of one bucket.
void launch_buckets(const TileLaunch& t, const HybGpuLayout::Partition& part, bool accumulate,
                    int log2_slots, cuda::Function ell) {
  const HybGpuLayout& layout = *t.a.layout;
  SpmmEllParams e{};
  e.rows = t.a.ell_rows.ptr<const int32_t>();
  e.columns = t.a.ell_columns.ptr<const int32_t>();
  e.values = t.a.ell_values.data;
  e.x = t.x.data;
  e.y = t.y.data;
  e.cols = layout.cols;
  e.y_rows = layout.rows;
  e.x_stride = t.x_stride;
  e.y_stride = t.y_stride;
  e.accumulate = accumulate ? 1 : 0;
  int64_t warps = 0;
  for (const HybGpuLayout::Bucket& b : part.buckets) {
    SpmmEllBucket& out = e.bucket[e.buckets++];
    out.first_warp = warps;
    out.row_offset = b.row_offset;
    out.slot_offset = b.slot_offset;
    out.rows = static_cast<int32_t>(b.rows);
    out.log2_width = b.log2_width;
    out.log2_rows_per_warp = std::max(0, log2_slots - b.log2_width);
    const int64_t per_warp = int64_t{1} << out.log2_rows_per_warp;
    warps += (b.rows + per_warp - 1) / per_warp;
  }
  e.warps = warps;
  constexpr int64_t kWarpsPerBlock = kSpmmThreads / 32;
  const auto blocks = static_cast<unsigned>((warps + kWarpsPerBlock - 1) / kWarpsPerBlock);
  void* args[] = {&e};
  cuda::launch(ell, blocks, 1, 1, kSpmmThreads, 1, 1, 0, t.stream, args);
}

// A partition's remainder through the merge-path pair, its rows mapped to Y's.
void launch_remainder(const TileLaunch& t, const HybGpuLayout::Remainder& r, bool accumulate,
                      cuda::Function chunks, cuda::Function carries) {
  const HybGpuLayout& layout = *t.a.layout;
  const spmm_launch::MappedCsr m{t.a.rest_indptr.ptr<const int32_t>() + r.indptr_offset,
                                 t.a.rest_columns.ptr<const int32_t>() + r.nnz_offset,
                                 static_cast<const char*>(t.a.rest_values.data) +
                                     r.nnz_offset * static_cast<int64_t>(dtype_bytes(t.x.dtype)),
                                 t.a.rest_rows.ptr<const int32_t>() + r.row_offset,
                                 r.rows,
                                 r.nnz};
  spmm_launch::launch_mapped_csr(m, layout.cols, layout.rows, t.x, t.y, t.x_stride, t.y_stride,
                                 accumulate, t.workspace, chunks, carries, t.stream);
}

}  // namespace

void spmm(const HybGpu& a, const TensorView& x, const TensorView& y, const TensorView& workspace,
          cuda::Stream stream, const HybSchedule& schedule) {
  check_spmm(a, x, y, workspace, schedule);
  const HybGpuLayout& layout = *a.layout;
  if (layout.rows == 0) return;
  const int64_t d = x.shape[1];
  const int64_t tile = schedule.feature_tile;
  int log2_slots = 0;
  while ((int64_t{1} << log2_slots) < schedule.slots_per_warp) ++log2_slots;
  const cuda::DeviceScope scope(x.device.index);
  // Feature tiles one after another, each every partition in order; partition 0 writes every
  // row of Y, the later ones add to it.
  spmm_launch::for_each_feature_tile(
      x, y, tile, spmm_launch::KernelKey::kHyb, spmm_hyb_kernel_spec,
      {"flare_spmm_ell", "flare_spmm_csr", "flare_spmm_csr_carries"},
      [&](const TensorView& x_tile, const TensorView& y_tile,
          const std::vector<cuda::Function>& kernels) {
        const TileLaunch launch{a,
                                x_tile,
                                y_tile,
                                layout.cols > 1 ? x.strides[0] : d,
                                layout.rows > 1 ? y.strides[0] : d,
                                workspace.data,
                                stream};
        for (size_t p = 0; p < layout.partitions.size(); ++p) {
          const HybGpuLayout::Partition& part = layout.partitions[p];
          if (!part.buckets.empty()) launch_buckets(launch, part, p > 0, log2_slots, kernels[0]);
          if (part.remainder.rows > 0)
            launch_remainder(launch, part.remainder, p > 0, kernels[1], kernels[2]);
        }
      });
}

}  // namespace flare::sparse
