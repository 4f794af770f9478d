// Helpers of the sparse benchmarks (scripts/bench_sparse.cpp, bench_bsr.cpp): device buffers of
// random or NaN values, cuSPARSE descriptors over flare's arrays, the best of cusparseSpMM's CSR
// algorithms, and timings (GPU time of a CUDA-graph replay, eager GPU time, host time of one
// enqueue; medians). Include after flare's headers (they name the driver's stream type in
// namespace flare::cuda, which the runtime's own declaration would otherwise replace).
#pragma once

#include <cuda_runtime.h>
#include <cusparse.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"

namespace bench_sparse {

using namespace flare;

constexpr int kWarmup = 3;
constexpr int kIterations = 20;

inline void check_cusparse(cusparseStatus_t status, const char* what) {
  if (status != CUSPARSE_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s failed: %s\n", what, cusparseGetErrorString(status));
    std::exit(1);
  }
}

// A cuSPARSE handle issuing its work on `stream` (the benchmarks time both libraries there).
inline cusparseHandle_t cusparse_on(cuda::Stream stream) {
  cusparseHandle_t handle;
  check_cusparse(cusparseCreate(&handle), "cusparseCreate");
  check_cusparse(cusparseSetStream(handle, reinterpret_cast<cudaStream_t>(stream)),
                 "cusparseSetStream");
  return handle;
}

inline cuda::DeviceBuffer upload(const void* data, size_t bytes) {
  cuda::DeviceBuffer buffer(std::max<size_t>(bytes, 16));
  cuda::memcpy_htod(buffer.data(), data, bytes);
  return buffer;
}

// n random normals (or n NaNs) of `dtype` on the host and on the device.
inline std::vector<std::byte> random_host_values(int64_t n, uint32_t seed, DType dtype) {
  std::vector<std::byte> host(static_cast<size_t>(n) * dtype_bytes(dtype));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) store_float(host.data(), dtype, i, normal(rng));
  return host;
}

inline cuda::DeviceBuffer random_values(int64_t n, uint32_t seed, DType dtype) {
  const std::vector<std::byte> host = random_host_values(n, seed, dtype);
  return upload(host.data(), host.size());
}

inline cuda::DeviceBuffer nan_values(int64_t n, DType dtype) {
  std::vector<std::byte> host(static_cast<size_t>(n) * dtype_bytes(dtype));
  for (int64_t i = 0; i < n; ++i) store_float(host.data(), dtype, i, std::nanf(""));
  return upload(host.data(), host.size());
}

inline bool all_finite(const cuda::DeviceBuffer& buffer, int64_t n, DType dtype) {
  std::vector<std::byte> host(static_cast<size_t>(n) * dtype_bytes(dtype));
  cuda::memcpy_dtoh(host.data(), buffer.data(), host.size());
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(load_float(host.data(), dtype, i))) return false;
  }
  return true;
}

// cuSPARSE descriptors over flare's arrays: A's n x n CSR (values or the SDDMM output) and a
// row-major [n, d] dense matrix.
inline cusparseSpMatDescr_t csr_descriptor(int64_t n, int64_t nnz, const cuda::DeviceBuffer& indptr,
                                           const cuda::DeviceBuffer& indices, void* values,
                                           cudaDataType type) {
  cusparseSpMatDescr_t descriptor;
  check_cusparse(
      cusparseCreateCsr(&descriptor, n, n, nnz, indptr.data(), indices.data(), values,
                        CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, type),
      "cusparseCreateCsr");
  return descriptor;
}

inline cusparseDnMatDescr_t dense_descriptor(int64_t n, int64_t d, void* data, cudaDataType type) {
  cusparseDnMatDescr_t descriptor;
  check_cusparse(cusparseCreateDnMat(&descriptor, n, d, d, data, type, CUSPARSE_ORDER_ROW),
                 "cusparseCreateDnMat");
  return descriptor;
}

inline cudaDataType cuda_type(DType dtype) {
  return dtype == DType::kF16 ? CUDA_R_16F : dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
}

// values[source[s]] (0 where source is -1) on the device.
inline cuda::DeviceBuffer gathered(const std::vector<int64_t>& source,
                                   const std::vector<std::byte>& values, DType dtype) {
  const size_t element = dtype_bytes(dtype);
  std::vector<std::byte> host(source.size() * element, std::byte{0});
  for (size_t s = 0; s < source.size(); ++s) {
    if (source[s] >= 0)
      std::copy_n(values.begin() + static_cast<std::ptrdiff_t>(source[s] * element), element,
                  host.begin() + static_cast<std::ptrdiff_t>(s * element));
  }
  return upload(host.data(), host.size());
}

struct Timing {
  double graph_us = 0, eager_us = 0, host_us = 0;
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// GPU time of `call` replayed from a CUDA graph, eager GPU time, and the host time of an enqueue.
inline Timing time_call(cuda::Stream stream, const std::function<void()>& call) {
  for (int i = 0; i < kWarmup; ++i) call();
  cuda::stream_synchronize(stream);
  Timing t;
  std::vector<double> eager, host;
  for (int i = 0; i < kIterations; ++i) {
    cuda::Event start(true), stop(true);
    start.record(stream);
    const auto h0 = std::chrono::steady_clock::now();
    call();
    const auto h1 = std::chrono::steady_clock::now();
    stop.record(stream);
    stop.synchronize();
    eager.push_back(1e3 * stop.elapsed_ms_since(start));
    host.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count());
  }
  t.eager_us = median(eager);
  t.host_us = median(host);
  const cuda::Graph graph(stream, call);
  std::vector<double> replay;
  for (int i = 0; i < kIterations + kWarmup; ++i) {
    cuda::Event start(true), stop(true);
    start.record(stream);
    graph.launch(stream);
    stop.record(stream);
    stop.synchronize();
    if (i >= kWarmup) replay.push_back(1e3 * stop.elapsed_ms_since(start));
  }
  t.graph_us = median(replay);
  return t;
}

inline std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) parts.push_back(part);
  return parts;
}

inline std::string cell(const Timing& t) {
  char text[96];
  std::snprintf(text, sizeof(text), "%.1f / %.1f / %.1f", t.graph_us, t.eager_us, t.host_us);
  return text;
}

using SpmmAlgorithm = std::pair<cusparseSpMMAlg_t, const char*>;

// cusparseSpMM's CSR algorithms 1-3.
inline std::vector<SpmmAlgorithm> csr_spmm_algorithms() {
  return {{CUSPARSE_SPMM_CSR_ALG1, "alg1"},
          {CUSPARSE_SPMM_CSR_ALG2, "alg2"},
          {CUSPARSE_SPMM_CSR_ALG3, "alg3"}};
}

// The fastest of `algorithms` that runs cusparseSpMM for Y = A X (y overwritten; float32 sums),
// with its name ("none ran" and zeros when none does).
inline std::pair<Timing, const char*> best_spmm(cusparseHandle_t handle, cusparseSpMatDescr_t ad,
                                                cusparseDnMatDescr_t xd, cusparseDnMatDescr_t yd,
                                                cuda::Stream stream,
                                                const std::vector<SpmmAlgorithm>& algorithms) {
  const float alpha = 1.f, beta = 0.f;
  Timing best{};
  const char* best_name = "none ran";
  for (const auto& [algorithm, name] : algorithms) {
    size_t bytes = 0;
    if (cusparseSpMM_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, ad, xd, &beta, yd,
                                CUDA_R_32F, algorithm, &bytes) != CUSPARSE_STATUS_SUCCESS) {
      continue;
    }
    const cuda::DeviceBuffer buffer(std::max<size_t>(bytes, 16));
    if (cusparseSpMM_preprocess(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, ad, xd, &beta, yd,
                                CUDA_R_32F, algorithm, buffer.data()) != CUSPARSE_STATUS_SUCCESS) {
      continue;
    }
    const Timing t = time_call(stream, [&] {
      check_cusparse(
          cusparseSpMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                       &alpha, ad, xd, &beta, yd, CUDA_R_32F, algorithm, buffer.data()),
          "cusparseSpMM");
    });
    if (best.graph_us == 0 || t.graph_us < best.graph_us) {
      best = t;
      best_name = name;
    }
  }
  return {best, best_name};
}

}  // namespace bench_sparse
