// Shared-prefix decode from C++ (issue 20; the FlashInfer paper's Table 5 shapes, as
// scripts/bench_cascade.py times them through Python): BatchPrefill::plan_cascade (level 0 the
// batch's prefix, level 1 each request's 128-token suffix; one prefill launch and the merge
// launch) next to BatchDecode over the suffixes alone (the cost floor of an empty prefix) and
// BatchDecode of the single format (every request lists the prefix's pages, then its own).
// 32 / 32 heads, D 128, bf16, page 16, pages in order. Per case: GPU us of one call, eager
// (events around each call, back to back, median of 20) with and without programmatic
// dependent launch (Python's wrappers use it), and from a CUDA graph of 10 calls; host us of
// plan_cascade() and run(); the query tile the cascade chose and its plan's size.
//
// Build (after the library, from the repository root):
//   g++ -O2 -std=c++20 -Iinclude -I. scripts/bench_cascade.cpp -Lbuild-gpu -lflare
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_cascade   (one line)
// Run: build-gpu/bench_cascade [batch,...] [prefix,...] [tile,...] [kv_tile,...]   (default
//   16,64; 0,1024,8192,32768; 0 = plan_cascade's own choice, else a fixed config.query_tile,
//   and config.kv_tile likewise)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "scripts/bench_random_16bit.h"
#include "scripts/bench_timing.h"

namespace {

using namespace flare;

constexpr int kHeads = 32;
constexpr int kHeadDim = 128;
constexpr int kPage = 16;
constexpr int kSuffix = 128;

using bench_inputs::DeviceInts;
using bench_inputs::view;
using bench_timing::eager_us;
using bench_timing::graph_us;
using bench_timing::host_us;

std::vector<int> list_arg(int argc, char** argv, int index, std::vector<int> fallback) {
  if (argc <= index) return fallback;
  std::vector<int> out;
  std::stringstream in(argv[index]);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::atoi(item.c_str()));
  return out;
}

struct Row {
  int batch = 0, prefix = 0;
  double cascade_pdl = 0, cascade_nopdl = 0, cascade_graph = 0, plan_host = 0, run_host = 0;
  double suffix_pdl = 0, suffix_graph = 0, single_pdl = 0, single_graph = 0;
  int tile = 0;
  size_t items = 0, merges = 0;
  int slots = 0;
  int kv_tile = 0;
  bool warpgroup = false;
};

Row bench(int batch, int prefix, int query_tile, int kv_tile) {
  Row row;
  row.batch = batch;
  row.prefix = prefix;
  const int prefix_pages = prefix / kPage;
  const int suffix_pages = kSuffix / kPage;
  const int64_t pages = prefix_pages + int64_t{batch} * suffix_pages;
  const int64_t token_elems = int64_t{kHeads} * kHeadDim;
  const cuda::DeviceBuffer k = bench_inputs::random_16bit(pages * kPage * token_elems, 2, false);
  const cuda::DeviceBuffer v = bench_inputs::random_16bit(pages * kPage * token_elems, 3, false);
  const cuda::DeviceBuffer q = bench_inputs::random_16bit(batch * token_elems, 1, false);
  cuda::DeviceBuffer o(static_cast<size_t>(batch * token_elems) * 2);
  const TensorView qv = view(q.data(), DType::kBF16, {batch, kHeads, kHeadDim});
  const TensorView ov = view(o.data(), DType::kBF16, {batch, kHeads, kHeadDim});
  const TensorView kv_k = view(k.data(), DType::kBF16, {pages, kPage, kHeads, kHeadDim});
  const TensorView kv_v = view(v.data(), DType::kBF16, {pages, kPage, kHeads, kHeadDim});
  cuda::OwnedStream stream;
  const cuda::Stream s = stream.get();

  // Page ids: the prefix's pages 0.., then each request's suffix; the cascade's levels back
  // to back in that order, the single format's per request.
  std::vector<int32_t> cascade_ids(static_cast<size_t>(pages));
  std::iota(cascade_ids.begin(), cascade_ids.end(), 0);
  std::vector<int32_t> single_ids;
  for (int r = 0; r < batch; ++r) {
    for (int p = 0; p < prefix_pages; ++p) single_ids.push_back(p);
    for (int p = 0; p < suffix_pages; ++p)
      single_ids.push_back(prefix_pages + r * suffix_pages + p);
  }
  const DeviceInts d_cascade(cascade_ids), d_single(single_ids);
  const DeviceInts d_suffix(
      std::vector<int32_t>(cascade_ids.begin() + prefix_pages, cascade_ids.end()));

  std::vector<int32_t> qo0{0, batch}, kv0{0, prefix_pages}, last0{prefix_pages ? kPage : 0};
  std::vector<int32_t> qo1(static_cast<size_t>(batch) + 1), kv1(static_cast<size_t>(batch) + 1);
  for (int r = 0; r <= batch; ++r) {
    qo1[static_cast<size_t>(r)] = r;
    kv1[static_cast<size_t>(r)] = prefix_pages + r * suffix_pages;
  }
  const std::vector<int32_t> last1(static_cast<size_t>(batch), kPage);
  const std::vector<CascadeLevel> levels{{qo0, kv0, last0}, {qo1, kv1, last1}};

  BatchPrefillConfig config;
  config.max_batch = batch + 1;
  config.max_total_qo = batch;
  config.num_qo_heads = config.num_kv_heads = kHeads;
  config.head_dim_qk = config.head_dim_vo = kHeadDim;
  config.kv = PrefillKV::kPaged;
  config.page_size = kPage;
  config.dtype = DType::kBF16;
  config.params.mask = MaskMode::kNone;
  config.max_levels = 2;
  config.query_tile = query_tile;
  config.kv_tile = kv_tile;
  BatchPrefill eager(config);
  config.use_cuda_graph = true;
  BatchPrefill graphed(config);
  const PagedKVPages cascade_kv{kv_k, kv_v, KVLayout::kNHD, d_cascade.tensor};
  row.plan_host = host_us([&] { eager.plan_cascade(levels, s); }, s);
  graphed.plan_cascade(levels, s);
  RunOptions pdl;
  pdl.enable_pdl = true;
  row.run_host =
      host_us([&] { eager.run(qv, cascade_kv, ov, std::nullopt, s, std::nullopt, pdl); }, s);
  row.cascade_pdl =
      eager_us(s, [&] { eager.run(qv, cascade_kv, ov, std::nullopt, s, std::nullopt, pdl); });
  row.cascade_nopdl = eager_us(s, [&] { eager.run(qv, cascade_kv, ov, std::nullopt, s); });
  row.cascade_graph =
      graph_us(s, [&] { graphed.run(qv, cascade_kv, ov, std::nullopt, s, std::nullopt, pdl); });
  row.tile = eager.last_tiles().query_tile;
  row.kv_tile = eager.last_tiles().kv_tile;
  row.warpgroup = eager.last_tiles().warpgroup;
  row.items =
      eager.last_plan().work_items.size() * static_cast<size_t>(eager.last_plan().item_heads);
  row.merges = eager.last_plan().merge_items.size();
  row.slots = eager.last_plan().num_partial_slots;

  // BatchDecode (tensor cores) over the suffixes alone, and over prefix + suffix per request.
  BatchDecodeConfig dc;
  dc.max_batch = batch;
  dc.num_qo_heads = dc.num_kv_heads = kHeads;
  dc.head_dim = kHeadDim;
  dc.page_size = kPage;
  dc.q_dtype = dc.kv_dtype = DType::kBF16;
  dc.layout = KVLayout::kNHD;
  dc.use_tensor_cores = true;
  const std::vector<int32_t> suffix_indptr = [&] {
    std::vector<int32_t> x(static_cast<size_t>(batch) + 1);
    for (int r = 0; r <= batch; ++r) x[static_cast<size_t>(r)] = r * suffix_pages;
    return x;
  }();
  const std::vector<int32_t> single_indptr = [&] {
    std::vector<int32_t> x(static_cast<size_t>(batch) + 1);
    for (int r = 0; r <= batch; ++r) x[static_cast<size_t>(r)] = r * (prefix_pages + suffix_pages);
    return x;
  }();
  for (int which = 0; which < 2; ++which) {
    const std::vector<int32_t>& indptr = which == 0 ? suffix_indptr : single_indptr;
    const PagedKVPages kv{kv_k, kv_v, KVLayout::kNHD,
                          which == 0 ? d_suffix.tensor : d_single.tensor};
    BatchDecode decode(dc);
    decode.plan(indptr, last1, s);
    BatchDecodeConfig gc = dc;
    gc.use_cuda_graph = true;
    BatchDecode decode_graph(gc);
    decode_graph.plan(indptr, last1, s);
    const double e = eager_us(s, [&] { decode.run(qv, kv, ov, std::nullopt, s, pdl); });
    const double g = graph_us(s, [&] { decode_graph.run(qv, kv, ov, std::nullopt, s, pdl); });
    (which == 0 ? row.suffix_pdl : row.single_pdl) = e;
    (which == 0 ? row.suffix_graph : row.single_graph) = g;
  }
  cuda::stream_synchronize(s);
  return row;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<int> batches = list_arg(argc, argv, 1, {16, 64});
    const std::vector<int> prefixes = list_arg(argc, argv, 2, {0, 1024, 8192, 32768});
    const std::vector<int> tiles = list_arg(argc, argv, 3, {0});
    const std::vector<int> kv_tiles = list_arg(argc, argv, 4, {0});
    cuda::set_device(0);
    std::printf(
        "Shared-prefix decode from C++, GPU us of one call (eager with PDL / without; "
        "graph); suffix 128, 32/32 heads, D 128, bf16, page 16\n");
    std::printf(
        "| batch | prefix | cascade eager pdl / no pdl | cascade graph | plan_cascade "
        "host | run host | tiles (q x kv) | items / merges / slots | suffix decode eager / graph "
        "| single decode eager / graph | cascade / suffix decode (graph) | single / "
        "cascade (graph) |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (const int batch : batches) {
      for (const int prefix : prefixes) {
        for (const int tile : tiles) {
          for (const int kv_tile : kv_tiles) {
            const Row r = bench(batch, prefix, tile, kv_tile);
            std::printf(
                "| %d | %d | %.1f / %.1f | %.1f | %.1f | %.1f | %dx%d%s | %zu / %zu / %d | %.1f / "
                "%.1f | %.1f / %.1f | %.2f | %.2f |\n",
                r.batch, r.prefix, r.cascade_pdl, r.cascade_nopdl, r.cascade_graph, r.plan_host,
                r.run_host, r.tile, r.kv_tile, r.warpgroup ? " (fa3)" : " (fa2)", r.items, r.merges,
                r.slots, r.suffix_pdl, r.suffix_graph, r.single_pdl, r.single_graph,
                r.cascade_graph / r.suffix_graph, r.single_graph / r.cascade_graph);
            std::fflush(stdout);
          }
        }
      }
    }
  } catch (const flare::Error& e) {
    std::fprintf(stderr, "bench_cascade: %s\n", e.what());
    return 1;
  }
  return 0;
}
