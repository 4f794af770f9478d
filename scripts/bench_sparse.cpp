// SpMM and SDDMM from C++ (issue 23), next to cuSPARSE called the same way in the same process:
// flare::sparse::spmm / sddmm against cusparseSpMM (CSR algorithms 1, 2 and 3; the best that
// runs) and cusparseSDDMM, float32 or (--dtype) float16 / bfloat16 with float32 sums, on
// bench_spmm.py's seeded synthetic graphs of the dissertation's graph set (R-MAT of cora's,
// citeseer's, pubmed's, ppi's and arxiv's sizes and of a quarter of reddit's edges, uniform of
// ogbn-proteins' node count; named as synthetic). Per graph and feature size: GPU time of a CUDA-graph replay, eager time (events
// around the call), and the host time of one enqueue; medians. Inputs are random normals,
// outputs poisoned with NaN before the first call and checked finite after.
//
// Build (after the library, from the repository root; one line):
//   g++ -O2 -std=c++20 -Iinclude -I. -I/usr/local/cuda/include scripts/bench_sparse.cpp
//       -Lbuild-gpu -lflare -L/usr/local/cuda/lib64 -lcusparse -lcudart
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_sparse
// Run: build-gpu/bench_sparse [--features 32,128,512] [--graphs cora,...,reddit (all seven)]
//        [--dtype float32|float16|bfloat16] [--hyb 1:4,1:6,1:9,4:6 | none]
// --hyb: SpMM over hyb(c, k) decompositions too (flare/sparse/hyb_gpu.h: its padding, the host
// time of the decomposition, its default and tuned schedules; the ratios are cuSPARSE's best
// over each, with flare's tuned CSR for comparison).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "flare/sparse/generate.h"
#include "flare/sparse/hyb_gpu.h"
#include "flare/sparse/sddmm_gpu.h"
#include "flare/sparse/spmm_gpu.h"
#include "flare/sparse/spmm_tune.h"

// After flare's headers: they name the driver's stream type in namespace flare::cuda (no CUDA
// header needed), which the runtime's own declaration would otherwise replace.
#include "scripts/bench_sparse_util.h"

namespace {

using namespace flare;
using namespace bench_sparse;

struct GraphShape {
  const char* name;
  const char* kind;  // "rmat" or "uniform"
  int64_t nodes, edges;
};
// The dissertation's graph set (its table of node and edge counts; synthetic, seeded).
constexpr GraphShape kGraphs[] = {{"cora", "rmat", 2708, 10556},
                                  {"citeseer", "rmat", 3327, 9228},
                                  {"pubmed", "rmat", 19717, 88651},
                                  {"ppi", "rmat", 44906, 1271274},
                                  {"arxiv", "rmat", 169343, 1890000},
                                  {"proteins", "uniform", 132534, 9890000},
                                  {"reddit", "rmat", 232965, 23200000}};

// A graph's hyb(c, k) on the device (flare/sparse/hyb_gpu.h), its values gathered from A's.
struct DeviceHyb {
  int c = 1, k = 0;
  double layout_ms = 0;  // hyb_gpu_layout on the host
  sparse::HybGpuLayout layout;
  cuda::DeviceBuffer ell_rows, ell_columns, ell_values, rest_rows, rest_indptr, rest_columns,
      rest_values;

  sparse::HybGpu view(DType dtype) const {
    const auto array = [](const cuda::DeviceBuffer& b, DType t, size_t n) {
      return TensorView::contiguous(b.data(), t, {static_cast<int64_t>(n)}, Device::cuda(0));
    };
    const size_t slots = layout.ell_columns.size(), rest = layout.rest_columns.size();
    return {&layout,
            array(ell_rows, DType::kI32, layout.ell_rows.size()),
            array(ell_columns, DType::kI32, slots),
            array(ell_values, dtype, slots),
            array(rest_rows, DType::kI32, layout.rest_rows.size()),
            array(rest_indptr, DType::kI32, layout.rest_indptr.size()),
            array(rest_columns, DType::kI32, rest),
            array(rest_values, dtype, rest)};
  }
};

DeviceHyb device_hyb(const sparse::CsrGraph& g, const std::vector<std::byte>& values, DType dtype,
                     int c, int k) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto nnz = static_cast<int64_t>(g.indices.size());
  sparse::Csr host;  // no values: the layout holds each slot's source, gathered below
  host.rows = host.cols = g.nodes;
  host.indptr = TensorView::contiguous(const_cast<int32_t*>(g.indptr.data()), DType::kI32,
                                       {g.nodes + 1}, Device::cpu());
  host.indices = TensorView::contiguous(const_cast<int32_t*>(g.indices.data()), DType::kI32, {nnz},
                                        Device::cpu());
  DeviceHyb d;
  d.c = c;
  d.k = k;
  d.layout = sparse::hyb_gpu_layout(host, c, k);
  d.layout_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const auto ints = [](const std::vector<int32_t>& v) { return upload(v.data(), v.size() * 4); };
  d.ell_rows = ints(d.layout.ell_rows);
  d.ell_columns = ints(d.layout.ell_columns);
  d.ell_values = gathered(d.layout.ell_source, values, dtype);
  d.rest_rows = ints(d.layout.rest_rows);
  d.rest_indptr = ints(d.layout.rest_indptr);
  d.rest_columns = ints(d.layout.rest_columns);
  d.rest_values = gathered(d.layout.rest_source, values, dtype);
  return d;
}

}  // namespace

int run(int argc, char** argv) {
  std::string features = "32,128,512", graphs = "cora,citeseer,pubmed,ppi,arxiv,proteins,reddit", dtype_flag = "float32";
  std::string hyb_configs = "1:4,1:6,1:9,4:6";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--features")
      features = argv[i + 1];
    else if (flag == "--graphs")
      graphs = argv[i + 1];
    else if (flag == "--dtype")
      dtype_flag = argv[i + 1];
    else if (flag == "--hyb")
      hyb_configs = argv[i + 1];
    else {
      std::fprintf(stderr,
                   "usage: bench_sparse [--features 32,128,512] [--graphs a,b] [--dtype d] "
                   "[--hyb c:k,c:k | none]\n");
      return 2;
    }
  }
  const DType dtype = parse_dtype(dtype_flag);
  const cudaDataType type = cuda_type(dtype);
  cuda::set_device(0);
  const cuda::OwnedStream owned;
  const cuda::Stream stream = owned.get();
  const cusparseHandle_t handle = cusparse_on(stream);
  const float alpha = 1.f, beta = 0.f;
  std::printf(
      "%s\n\n| op | graph | d | flare us (graph / eager / host) | cuSPARSE us (graph / eager / "
      "host) | cuSPARSE / flare (graph) |\n|---|---|---|---|---|---|\n",
      std::string(dtype_name(dtype)).c_str());
  for (const std::string& name : split(graphs)) {
    const GraphShape* shape = nullptr;
    for (const GraphShape& g : kGraphs) {
      if (name == g.name) shape = &g;
    }
    if (shape == nullptr) {
      std::fprintf(stderr, "unknown graph %s\n", name.c_str());
      return 2;
    }
    const sparse::CsrGraph g = std::string(shape->kind) == "rmat"
                                   ? sparse::rmat_graph(shape->nodes, shape->edges, 1)
                                   : sparse::uniform_graph(shape->nodes, shape->edges, 1);
    const int64_t n = g.nodes, nnz = static_cast<int64_t>(g.indices.size());
    const cuda::DeviceBuffer indptr = upload(g.indptr.data(), g.indptr.size() * 4);
    const cuda::DeviceBuffer indices = upload(g.indices.data(), g.indices.size() * 4);
    const std::vector<std::byte> host_values = random_host_values(nnz, 7, dtype);
    const cuda::DeviceBuffer values = upload(host_values.data(), host_values.size());
    std::vector<DeviceHyb> hybs;
    for (const std::string& config : split(hyb_configs == "none" ? "" : hyb_configs)) {
      const size_t colon = config.find(':');
      hybs.push_back(device_hyb(g, host_values, dtype, std::stoi(config.substr(0, colon)),
                                std::stoi(config.substr(colon + 1))));
    }
    sparse::Csr a;
    a.rows = a.cols = n;
    a.indptr = TensorView::contiguous(indptr.data(), DType::kI32, {n + 1}, Device::cuda(0));
    a.indices = TensorView::contiguous(indices.data(), DType::kI32, {nnz}, Device::cuda(0));
    a.values = TensorView::contiguous(values.data(), dtype, {nnz}, Device::cuda(0));
    const std::string label = std::string(shape->name) + " (synthetic " + shape->kind + "), " +
                              std::to_string(nnz) + " nnz";
    for (const std::string& f : split(features)) {
      const int64_t d = std::stoll(f);
      const cuda::DeviceBuffer x = random_values(n * d, 11, dtype);
      const cuda::DeviceBuffer q = random_values(n * d, 12, dtype);
      const cuda::DeviceBuffer y = nan_values(n * d, dtype), out = nan_values(nnz, dtype);
      const cuda::DeviceBuffer workspace(
          std::max<size_t>(sparse::spmm_workspace_bytes(n, nnz, d), 16));
      const TensorView xv = TensorView::contiguous(x.data(), dtype, {n, d}, Device::cuda(0));
      const TensorView qv = TensorView::contiguous(q.data(), dtype, {n, d}, Device::cuda(0));
      const TensorView yv = TensorView::contiguous(y.data(), dtype, {n, d}, Device::cuda(0));
      const TensorView ov = TensorView::contiguous(out.data(), dtype, {nnz}, Device::cuda(0));
      const TensorView wv = TensorView::contiguous(
          workspace.data(), DType::kU8, {static_cast<int64_t>(workspace.bytes())}, Device::cuda(0));

      // cuSPARSE descriptors over the same arrays.
      const cusparseSpMatDescr_t ad = csr_descriptor(n, nnz, indptr, indices, values.data(), type);
      const cusparseDnMatDescr_t xd = dense_descriptor(n, d, x.data(), type);
      const cusparseDnMatDescr_t yd = dense_descriptor(n, d, y.data(), type);

      const Timing flare_spmm = time_call(stream, [&] { sparse::spmm(a, xv, yv, wv, stream); });
      // The auto-tuner's search (no disk cache: its full cost), then its schedule timed alike.
      sparse::SpmmTuneOptions search;
      search.use_cache = false;
      const sparse::SpmmTuning tuning = sparse::tune_spmm(a, xv, yv, wv, stream, search);
      const Timing flare_tuned =
          time_call(stream, [&] { sparse::spmm(a, xv, yv, wv, stream, tuning.schedule); });
      const bool spmm_ok = all_finite(y, n * d, dtype);
      const auto [best, best_alg] = best_spmm(handle, ad, xd, yd, stream, csr_spmm_algorithms());
      std::printf("| spmm%s | %s | %lld | %s | %s (%s) | %.2f |\n", spmm_ok ? "" : " (NOT FINITE)",
                  label.c_str(), static_cast<long long>(d), cell(flare_spmm).c_str(),
                  cell(best).c_str(), best_alg,
                  best.graph_us > 0 ? best.graph_us / flare_spmm.graph_us : 0.0);
      std::printf(
          "| spmm tuned: tile %lld, chunk %lld (search %.0f ms) | %s | %lld | %s | | %.2f |\n",
          static_cast<long long>(tuning.schedule.feature_tile),
          static_cast<long long>(tuning.schedule.chunk_items), tuning.search_ms, label.c_str(),
          static_cast<long long>(d), cell(flare_tuned).c_str(),
          best.graph_us > 0 ? best.graph_us / flare_tuned.graph_us : 0.0);
      for (const DeviceHyb& h : hybs) {
        const sparse::HybGpu hv = h.view(dtype);
        const cuda::DeviceBuffer hyb_workspace(
            std::max<size_t>(sparse::hyb_spmm_workspace_bytes(h.layout, d), 16));
        const TensorView hw =
            TensorView::contiguous(hyb_workspace.data(), DType::kU8,
                                   {static_cast<int64_t>(hyb_workspace.bytes())}, Device::cuda(0));
        const cuda::DeviceBuffer y_hyb = nan_values(n * d, dtype);
        const TensorView yh = TensorView::contiguous(y_hyb.data(), dtype, {n, d}, Device::cuda(0));
        const Timing t = time_call(stream, [&] { sparse::spmm(hv, xv, yh, hw, stream); });
        const sparse::HybTuning hyb_tuning = sparse::tune_spmm(hv, xv, yh, hw, stream, search);
        const Timing tuned =
            time_call(stream, [&] { sparse::spmm(hv, xv, yh, hw, stream, hyb_tuning.schedule); });
        std::printf(
            "| spmm hyb(%d, %d)%s: padding %.2f, layout %.0f ms; tuned: tile %lld, slots %lld "
            "(search %.0f ms) | %s | %lld | %s; tuned %s | | %.2f; tuned %.2f (flare csr tuned "
            "%.2f) |\n",
            h.c, h.k, all_finite(y_hyb, n * d, dtype) ? "" : " (NOT FINITE)",
            h.layout.padding_ratio(), h.layout_ms,
            static_cast<long long>(hyb_tuning.schedule.feature_tile),
            static_cast<long long>(hyb_tuning.schedule.slots_per_warp), hyb_tuning.search_ms,
            label.c_str(), static_cast<long long>(d), cell(t).c_str(), cell(tuned).c_str(),
            best.graph_us > 0 ? best.graph_us / t.graph_us : 0.0,
            best.graph_us > 0 ? best.graph_us / tuned.graph_us : 0.0,
            best.graph_us > 0 ? best.graph_us / flare_tuned.graph_us : 0.0);
      }

      // SDDMM: out = (Q K^T) at A's pattern, K = X here; cuSPARSE writes a CSR copy of A's pattern.
      const cuda::DeviceBuffer anchor_out = nan_values(nnz, dtype);
      const cusparseSpMatDescr_t cd =
          csr_descriptor(n, nnz, indptr, indices, anchor_out.data(), type);
      const cusparseDnMatDescr_t qd = dense_descriptor(n, d, q.data(), type);
      const cusparseDnMatDescr_t kd = dense_descriptor(n, d, x.data(), type);
      const auto destroy_descriptors = [&] {
        cusparseDestroySpMat(ad);
        cusparseDestroySpMat(cd);
        for (cusparseDnMatDescr_t m : {xd, yd, qd, kd}) cusparseDestroyDnMat(m);
      };
      const Timing flare_sddmm = time_call(stream, [&] { sparse::sddmm(a, qv, xv, ov, stream); });
      const bool sddmm_ok = all_finite(out, nnz, dtype);
      size_t bytes = 0;
      // cuSPARSE's SDDMM may lack a 16-bit form: flare's row alone then.
      if (cusparseSDDMM_bufferSize(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                   CUSPARSE_OPERATION_TRANSPOSE, &alpha, qd, kd, &beta, cd,
                                   CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT,
                                   &bytes) != CUSPARSE_STATUS_SUCCESS) {
        std::printf("| sddmm%s | %s | %lld | %s | not supported | - |\n",
                    sddmm_ok ? "" : " (NOT FINITE)", label.c_str(), static_cast<long long>(d),
                    cell(flare_sddmm).c_str());
        destroy_descriptors();
        continue;
      }
      const cuda::DeviceBuffer buffer(std::max<size_t>(bytes, 16));
      check_cusparse(
          cusparseSDDMM_preprocess(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                   CUSPARSE_OPERATION_TRANSPOSE, &alpha, qd, kd, &beta, cd,
                                   CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, buffer.data()),
          "cusparseSDDMM_preprocess");
      const Timing anchor_sddmm = time_call(stream, [&] {
        check_cusparse(cusparseSDDMM(handle, CUSPARSE_OPERATION_NON_TRANSPOSE,
                                     CUSPARSE_OPERATION_TRANSPOSE, &alpha, qd, kd, &beta, cd,
                                     CUDA_R_32F, CUSPARSE_SDDMM_ALG_DEFAULT, buffer.data()),
                       "cusparseSDDMM");
      });
      std::printf("| sddmm%s | %s | %lld | %s | %s | %.2f |\n", sddmm_ok ? "" : " (NOT FINITE)",
                  label.c_str(), static_cast<long long>(d), cell(flare_sddmm).c_str(),
                  cell(anchor_sddmm).c_str(), anchor_sddmm.graph_us / flare_sddmm.graph_us);
      std::fflush(stdout);
      destroy_descriptors();
    }
  }
  cusparseDestroy(handle);
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sparse: %s\n", e.what());
    return 1;
  }
}
