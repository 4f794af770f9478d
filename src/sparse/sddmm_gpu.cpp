// SDDMM on the GPU (flare/sparse/sddmm_gpu.h): argument checks, the kernel's vector width, the
// launch of kernels/sddmm_csr.cuh.
#include "flare/sparse/sddmm_gpu.h"

#include <algorithm>
#include <string>

#include "flare/core/error.h"
#include "kernels/sddmm_csr.cuh"
#include "src/sparse/gpu_operands.h"
#include "src/sparse/spmm_launch.h"

namespace flare::sparse {
namespace {

constexpr const char* kWhat = "flare::sparse::sddmm";

}  // namespace

jit::KernelSpec sddmm_csr_kernel_spec(int features, int vec, DType dtype) {
  gpu_operands::check_kernel_spec(kWhat, features, vec, dtype);
  jit::KernelSpec spec;
  spec.family_header = "sddmm_csr.cuh";
  spec.entry = "flare_sddmm_csr";
  spec.defines = {{"FLARE_SDDMM_FEATURES", std::to_string(features)},
                  {"FLARE_SDDMM_VEC", std::to_string(vec)},
                  {"FLARE_SDDMM_DTYPE", std::to_string(static_cast<int>(dtype))}};
  spec.label = "sddmm csr " + std::string(dtype_name(dtype)) + " d=" + std::to_string(features) +
               " vec=" + std::to_string(vec);
  return spec;
}

std::vector<jit::KernelSpec> shipped_sddmm_kernel_specs() {
  std::vector<jit::KernelSpec> specs;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int d : {32, 64, 128, 256, 512})
      specs.push_back(sddmm_csr_kernel_spec(d, 16 / static_cast<int>(dtype_bytes(dtype)), dtype));
  }
  return specs;
}

void sddmm(const Csr& a, const TensorView& q, const TensorView& k, const TensorView& out,
           cuda::Stream stream) {
  FLARE_CHECK(q.device.is_cuda(), ErrorCode::kInvalidArgument, kWhat,
              ": q must be a CUDA tensor (the CPU operator is sddmm_reference), got q on ",
              q.device.str());
  FLARE_CHECK(a.rows >= 0 && a.cols >= 0, ErrorCode::kInvalidArgument, kWhat,
              ": rows and cols must be >= 0, got ", a.rows, " x ", a.cols);
  const int64_t nnz = a.nnz();
  const int64_t d = q.ndim == 2 ? q.shape[1] : -1;
  gpu_operands::check_array(kWhat, a.indptr, "A.indptr", DType::kI32, a.rows + 1, q.device);
  gpu_operands::check_array(kWhat, a.indices, "A.indices", DType::kI32, nnz, q.device);
  gpu_operands::check_dense(kWhat, q, "q", a.rows, d, q.device);
  gpu_operands::check_dense(kWhat, k, "k", a.cols, d, q.device);
  FLARE_CHECK(k.dtype == q.dtype, ErrorCode::kInvalidArgument, kWhat, ": k must have q's dtype ",
              dtype_name(q.dtype), ", got ", dtype_name(k.dtype));
  gpu_operands::check_array(kWhat, out, "out", q.dtype, nnz, q.device);
  FLARE_CHECK(gpu_operands::feature_size_supported(d), ErrorCode::kUnsupported, kWhat,
              ": the GPU kernel takes feature sizes (q's last dimension) that are positive "
              "multiples of 32 or powers of two below 32, got ",
              d);
  FLARE_CHECK(a.rows < (int64_t{1} << 31) && nnz < (int64_t{1} << 31), ErrorCode::kUnsupported,
              kWhat, ": rows and nnz must be below 2^31, got ", a.rows, " and ", nnz);
  FLARE_CHECK(a.rows > 0 || nnz == 0, ErrorCode::kInvalidArgument, kWhat, ": A has ", nnz,
              " nonzeros but no rows");
  if (nnz == 0) return;

  SddmmCsrParams p{};
  p.indptr = a.indptr.ptr<const int32_t>();
  p.indices = a.indices.ptr<const int32_t>();
  p.q = q.data;
  p.k = k.data;
  p.out = out.data;
  p.rows = a.rows;
  p.cols = a.cols;
  p.nnz = nnz;
  p.q_stride = a.rows > 1 ? q.strides[0] : d;
  p.k_stride = a.cols > 1 ? k.strides[0] : d;

  const cuda::DeviceScope scope(q.device.index);
  const spmm_launch::KernelKey key{spmm_launch::KernelKey::kSddmm, static_cast<int>(d),
                                   gpu_operands::vector_width(d, q, k), q.dtype, q.device.index};
  const cuda::Function function =
      spmm_launch::cached_kernels(key, sddmm_csr_kernel_spec, {"flare_sddmm_csr"})[0];
  constexpr int64_t kWarpsPerBlock = kSddmmThreads / 32;
  const cuda::DeviceProperties props = cuda::device_properties(q.device.index);
  const int64_t tasks = (nnz + kSddmmChunk - 1) / kSddmmChunk;
  // Enough warps to fill every SM several times; the loop strides over the rest.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(
      int64_t{props.num_sms} * 16, (tasks + kWarpsPerBlock - 1) / kWarpsPerBlock));
  void* args[] = {&p};
  cuda::launch(function, blocks, 1, 1, kSddmmThreads, 1, 1, 0, stream, args);
}

}  // namespace flare::sparse
