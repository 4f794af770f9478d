// SpMM on block-structured matrices from C++ (issue 23: tensor cores for BSR blocks), next to
// cuSPARSE called the same way in the same process: flare's BSR + CSR remainder
// (flare/sparse/bsr_gpu.h: 16 x 16 blocks on mma.sync) and flare's tuned CSR SpMM against
// cusparseSpMM on the same matrix as BSR (CUSPARSE_SPMM_BSR_ALG1, blocks of 16) and as CSR (the
// best of its CSR algorithms), float16 or bfloat16 with float32 sums.
//
// Matrices: n x n with a share of their 16 x 16 block positions full (block-pruned weights) and
// a few scattered nonzeros elsewhere (--scatter, default 0.0005 of the other entries), seeded.
// Per matrix and feature size: GPU time of a CUDA-graph replay, eager time, host time of one
// enqueue; medians (scripts/bench_sparse_util.h). Outputs NaN-poisoned, checked finite.
//
// Build (after the library, from the repository root; one line):
//   g++ -O2 -std=c++20 -Iinclude -I. -I/usr/local/cuda/include scripts/bench_bsr.cpp
//       -Lbuild-gpu -lflare -L/usr/local/cuda/lib64 -lcusparse -lcudart
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_bsr
// Run: build-gpu/bench_bsr [--n 16384] [--densities 0.02,0.1] [--features 64,256,1024]
//        [--dtype bfloat16|float16] [--scatter 0.0005]
#include <cstdio>
#include <string>
#include <vector>

#include "flare/sparse/bsr_gpu.h"
#include "flare/sparse/coo.h"
#include "flare/sparse/spmm_gpu.h"
#include "flare/sparse/spmm_tune.h"

// After flare's headers (see there).
#include "scripts/bench_sparse_util.h"

namespace {

using namespace flare;
using namespace bench_sparse;

// n x n: block_share of the 16 x 16 block positions full, `scatter` of the other entries set.
sparse::CsrStorage block_matrix(int64_t n, double block_share, double scatter, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_real_distribution<double> uniform01(0.0, 1.0);
  const auto uniform = [&] { return uniform01(engine); };
  const int64_t blocks = (n + 15) / 16;
  std::vector<bool> full(static_cast<size_t>(blocks * blocks));
  for (size_t b = 0; b < full.size(); ++b) full[b] = uniform() < block_share;
  sparse::CsrStorage a;
  a.rows = a.cols = n;
  a.indptr.push_back(0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t bc = 0; bc < blocks; ++bc) {
      const bool dense = full[static_cast<size_t>((r / 16) * blocks + bc)];
      for (int64_t c = bc * 16; c < std::min(n, bc * 16 + 16); ++c) {
        if (dense || (scatter > 0 && uniform() < scatter)) {
          a.indices.push_back(static_cast<int32_t>(c));
          a.values.push_back(1.0f);
        }
      }
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  return a;
}

// A host vector's bytes on the device, viewed as a 1-D tensor of `dtype`.
struct DeviceArray {
  cuda::DeviceBuffer buffer;
  TensorView view;
};

template <class T>
DeviceArray device_array(const std::vector<T>& v, DType dtype) {
  DeviceArray out{upload(v.data(), v.size() * sizeof(T)), {}};
  out.view = TensorView::contiguous(out.buffer.data(), dtype, {static_cast<int64_t>(v.size())},
                                    Device::cuda(0));
  return out;
}

DeviceArray gathered_array(const std::vector<int64_t>& source, const std::vector<std::byte>& values,
                           DType dtype) {
  DeviceArray out{gathered(source, values, dtype), {}};
  out.view = TensorView::contiguous(out.buffer.data(), dtype, {static_cast<int64_t>(source.size())},
                                    Device::cuda(0));
  return out;
}

int run(int argc, char** argv) {
  int64_t n = 16384;
  std::string densities = "0.02,0.1", features = "64,256,1024", dtype_flag = "bfloat16";
  double scatter = 0.0005;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--n") {
      n = std::stoll(argv[i + 1]);
    } else if (flag == "--densities") {
      densities = argv[i + 1];
    } else if (flag == "--features") {
      features = argv[i + 1];
    } else if (flag == "--dtype") {
      dtype_flag = argv[i + 1];
    } else if (flag == "--scatter") {
      scatter = std::stod(argv[i + 1]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_bsr [--n N] [--densities a,b] [--features 64,256] "
                   "[--dtype bfloat16|float16] [--scatter s]\n");
      return 2;
    }
  }
  const DType dtype = parse_dtype(dtype_flag);
  if (dtype != DType::kF16 && dtype != DType::kBF16) {
    std::fprintf(stderr, "bench_bsr: --dtype must be float16 or bfloat16\n");
    return 2;
  }
  const cudaDataType type = cuda_type(dtype);
  cuda::set_device(0);
  const cuda::OwnedStream owned;
  const cuda::Stream stream = owned.get();
  const cusparseHandle_t handle = cusparse_on(stream);
  std::printf(
      "%s, n %lld\n\n| op | block density | d | flare us (graph / eager / host) | cuSPARSE us "
      "(graph / eager / host) | cuSPARSE / flare (graph) |\n|---|---|---|---|---|---|\n",
      std::string(dtype_name(dtype)).c_str(), static_cast<long long>(n));
  for (const std::string& density : split(densities)) {
    const sparse::CsrStorage host = block_matrix(n, std::stod(density), scatter, 1);
    const auto nnz = static_cast<int64_t>(host.indices.size());
    const std::vector<std::byte> values = random_host_values(nnz, 7, dtype);
    // CSR on the device (flare's CSR SpMM and cuSPARSE's CSR algorithms).
    const DeviceArray indptr = device_array(host.indptr, DType::kI32);
    const DeviceArray indices = device_array(host.indices, DType::kI32);
    const DeviceArray csr_values{upload(values.data(), values.size()), {}};
    sparse::Csr a;
    a.rows = a.cols = n;
    a.indptr = indptr.view;
    a.indices = indices.view;
    a.values = TensorView::contiguous(csr_values.buffer.data(), dtype, {nnz}, Device::cuda(0));
    // BSR + CSR remainder (flare), and all of A as BSR blocks (cuSPARSE's BSR).
    sparse::Csr host_view = host.view();
    const sparse::BsrGpuLayout layout = sparse::bsr_gpu_layout(host_view, 0.5);
    const DeviceArray b_indptr = device_array(layout.indptr, DType::kI32);
    const DeviceArray b_cols = device_array(layout.block_col, DType::kI32);
    const DeviceArray b_values = gathered_array(layout.source, values, dtype);
    const DeviceArray r_rows = device_array(layout.rest_rows, DType::kI32);
    const DeviceArray r_indptr = device_array(layout.rest_indptr, DType::kI32);
    const DeviceArray r_cols = device_array(layout.rest_columns, DType::kI32);
    const DeviceArray r_values = gathered_array(layout.rest_source, values, dtype);
    const sparse::BsrGpu bsr{&layout,     b_indptr.view, b_cols.view, b_values.view,
                             r_rows.view, r_indptr.view, r_cols.view, r_values.view};
    const sparse::BsrGpuLayout all_blocks = sparse::bsr_gpu_layout(host_view, 0.0);
    const DeviceArray a_indptr = device_array(all_blocks.indptr, DType::kI32);
    const DeviceArray a_cols = device_array(all_blocks.block_col, DType::kI32);
    const DeviceArray a_values = gathered_array(all_blocks.source, values, dtype);
    const std::string label = density + " (" + std::to_string(layout.blocks()) + " blocks, " +
                              std::to_string(layout.rest_columns.size()) + " in CSR)";
    for (const std::string& f : split(features)) {
      const int64_t d = std::stoll(f);
      const cuda::DeviceBuffer x = random_values(n * d, 11, dtype);
      const cuda::DeviceBuffer y = nan_values(n * d, dtype), y_csr = nan_values(n * d, dtype);
      const TensorView xv = TensorView::contiguous(x.data(), dtype, {n, d}, Device::cuda(0));
      const TensorView yv = TensorView::contiguous(y.data(), dtype, {n, d}, Device::cuda(0));
      const TensorView yc = TensorView::contiguous(y_csr.data(), dtype, {n, d}, Device::cuda(0));
      const cuda::DeviceBuffer workspace(
          std::max<size_t>(std::max(sparse::spmm_workspace_bytes(n, nnz, d),
                                    sparse::bsr_spmm_workspace_bytes(layout, d)),
                           16));
      const TensorView wv = TensorView::contiguous(
          workspace.data(), DType::kU8, {static_cast<int64_t>(workspace.bytes())}, Device::cuda(0));
      const Timing flare_bsr = time_call(stream, [&] { sparse::spmm(bsr, xv, yv, wv, stream); });
      const bool bsr_ok = all_finite(y, n * d, dtype);
      sparse::SpmmTuneOptions search;
      search.use_cache = false;
      const sparse::SpmmTuning tuning = sparse::tune_spmm(a, xv, yc, wv, stream, search);
      const Timing flare_csr =
          time_call(stream, [&] { sparse::spmm(a, xv, yc, wv, stream, tuning.schedule); });
      // cuSPARSE: the same matrix as BSR of 16 x 16 (row-major blocks) and as CSR.
      cusparseSpMatDescr_t bd;
      check_cusparse(
          cusparseCreateBsr(&bd, all_blocks.block_rows, (n + 15) / 16, all_blocks.blocks(), 16, 16,
                            a_indptr.buffer.data(), a_cols.buffer.data(), a_values.buffer.data(),
                            CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type,
                            CUSPARSE_ORDER_ROW),
          "cusparseCreateBsr");
      const cusparseSpMatDescr_t cd =
          csr_descriptor(n, nnz, indptr.buffer, indices.buffer, csr_values.buffer.data(), type);
      const cusparseDnMatDescr_t xd = dense_descriptor(n, d, x.data(), type);
      const cusparseDnMatDescr_t yd = dense_descriptor(n, d, y_csr.data(), type);
      const auto [cusparse_bsr, bsr_alg] =
          best_spmm(handle, bd, xd, yd, stream, {{CUSPARSE_SPMM_BSR_ALG1, "bsr alg1"}});
      const auto [cusparse_csr, csr_alg] =
          best_spmm(handle, cd, xd, yd, stream, csr_spmm_algorithms());
      const auto ratio = [](const Timing& anchor, const Timing& t) {
        return anchor.graph_us > 0 ? anchor.graph_us / t.graph_us : 0.0;
      };
      std::printf("| spmm bsr16 + csr%s | %s | %lld | %s | %s (%s) | %.2f |\n",
                  bsr_ok ? "" : " (NOT FINITE)", label.c_str(), static_cast<long long>(d),
                  cell(flare_bsr).c_str(), cell(cusparse_bsr).c_str(), bsr_alg,
                  ratio(cusparse_bsr, flare_bsr));
      std::printf("| spmm csr tuned (tile %lld, chunk %lld) | %s | %lld | %s | %s (%s) | %.2f |\n",
                  static_cast<long long>(tuning.schedule.feature_tile),
                  static_cast<long long>(tuning.schedule.chunk_items), label.c_str(),
                  static_cast<long long>(d), cell(flare_csr).c_str(), cell(cusparse_csr).c_str(),
                  csr_alg, ratio(cusparse_csr, flare_csr));
      std::fflush(stdout);
      cusparseDestroySpMat(bd);
      cusparseDestroySpMat(cd);
      cusparseDestroyDnMat(xd);
      cusparseDestroyDnMat(yd);
    }
  }
  cusparseDestroy(handle);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_bsr: %s\n", e.what());
    return 1;
  }
}
