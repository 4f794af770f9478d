// Paged prefill of few query tokens per request from C++ (q1 / q16 batches, the shapes whose
// work items are short: decode-shaped rows and appends), next to BatchDecode (tensor cores) on
// the q1 shapes: 32 / 8 heads, D 128, bf16, page 16, pages shuffled, causal. Per shape: GPU us
// of one call eager (PDL) and in a CUDA graph, the tiles and queue entries the plan chose.
// Used to compare kernel variants of the mma.sync family's pipeline (two trees, one call).
//
// Build (after the library, from the repository root):
//   g++ -O2 -std=c++20 -Iinclude -I. experiments/bench_small_q_prefill.cpp -Lbuild-gpu -lflare
//       -Wl,-rpath,$PWD/build-gpu -o build-gpu/bench_small_q_prefill   (one line)
// Run: build-gpu/bench_small_q_prefill [batch q kv]   (one shape; default the list in main)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "scripts/bench_random_16bit.h"
#include "scripts/bench_timing.h"

namespace {

using namespace flare;
using bench_inputs::DeviceInts;
using bench_inputs::view;
using bench_timing::eager_us;
using bench_timing::graph_us;

constexpr int kQoHeads = 32, kKvHeads = 8, kHeadDim = 128, kPage = 16;

struct Shape {
  int batch, q, kv;
};

void bench(const Shape& shape) {
  const int pages_per_request = (shape.kv + kPage - 1) / kPage;
  const int64_t pages = int64_t{shape.batch} * pages_per_request;
  const int64_t tokens = int64_t{shape.batch} * shape.q;
  const cuda::DeviceBuffer k =
      bench_inputs::random_16bit(pages * kPage * kKvHeads * kHeadDim, 2, false);
  const cuda::DeviceBuffer v =
      bench_inputs::random_16bit(pages * kPage * kKvHeads * kHeadDim, 3, false);
  const cuda::DeviceBuffer q = bench_inputs::random_16bit(tokens * kQoHeads * kHeadDim, 1, false);
  cuda::DeviceBuffer o(static_cast<size_t>(tokens * kQoHeads * kHeadDim) * 2);
  const TensorView qv = view(q.data(), DType::kBF16, {tokens, kQoHeads, kHeadDim});
  const TensorView ov = view(o.data(), DType::kBF16, {tokens, kQoHeads, kHeadDim});
  const TensorView kv_k = view(k.data(), DType::kBF16, {pages, kPage, kKvHeads, kHeadDim});
  const TensorView kv_v = view(v.data(), DType::kBF16, {pages, kPage, kKvHeads, kHeadDim});
  std::vector<int32_t> ids(static_cast<size_t>(pages));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  const DeviceInts d_ids(ids);
  std::vector<int32_t> qo{0}, kv{0};
  for (int r = 0; r < shape.batch; ++r) {
    qo.push_back(qo.back() + shape.q);
    kv.push_back(kv.back() + pages_per_request);
  }
  const std::vector<int32_t> last(static_cast<size_t>(shape.batch),
                                  shape.kv - (pages_per_request - 1) * kPage);
  const PagedKVPages cache{kv_k, kv_v, KVLayout::kNHD, d_ids.tensor};
  cuda::OwnedStream stream;
  const cuda::Stream s = stream.get();
  RunOptions pdl;
  pdl.enable_pdl = true;

  BatchPrefillConfig c;
  c.max_batch = shape.batch;
  c.max_total_qo = static_cast<int>(tokens);
  c.num_qo_heads = kQoHeads;
  c.num_kv_heads = kKvHeads;
  c.head_dim_qk = c.head_dim_vo = kHeadDim;
  c.kv = PrefillKV::kPaged;
  c.page_size = kPage;
  c.dtype = DType::kBF16;
  c.params.mask = MaskMode::kCausal;
  BatchPrefill eager(c);
  c.use_cuda_graph = true;
  BatchPrefill graphed(c);
  eager.plan(qo, kv, last, s);
  graphed.plan(qo, kv, last, s);
  const double e =
      eager_us(s, [&] { eager.run(qv, cache, ov, std::nullopt, s, std::nullopt, pdl); });
  const double g =
      graph_us(s, [&] { graphed.run(qv, cache, ov, std::nullopt, s, std::nullopt, pdl); });
  const PrefillTiles tiles = eager.last_tiles();
  const size_t entries =
      eager.last_plan().work_items.size() * static_cast<size_t>(eager.last_plan().item_heads);

  double de = 0, dg = 0;
  if (shape.q == 1) {
    BatchDecodeConfig dc;
    dc.max_batch = shape.batch;
    dc.num_qo_heads = kQoHeads;
    dc.num_kv_heads = kKvHeads;
    dc.head_dim = kHeadDim;
    dc.page_size = kPage;
    dc.q_dtype = dc.kv_dtype = DType::kBF16;
    dc.layout = KVLayout::kNHD;
    dc.use_tensor_cores = true;
    BatchDecode decode(dc);
    decode.plan(kv, last, s);
    dc.use_cuda_graph = true;
    BatchDecode decode_graph(dc);
    decode_graph.plan(kv, last, s);
    de = eager_us(s, [&] { decode.run(qv, cache, ov, std::nullopt, s, pdl); });
    dg = graph_us(s, [&] { decode_graph.run(qv, cache, ov, std::nullopt, s, pdl); });
  }
  cuda::stream_synchronize(s);
  std::printf("| %d | %d | %d | %.1f | %.1f | %dx%d%s | %zu / %zu | ", shape.batch, shape.q,
              shape.kv, e, g, tiles.query_tile, tiles.kv_tile,
              tiles.warpgroup ? " (fa3)" : " (fa2)", entries, eager.last_plan().merge_items.size());
  if (shape.q == 1) {
    std::printf("%.1f / %.1f | %.2f |\n", de, dg, g / dg);
  } else {
    std::printf("- | - |\n");
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cuda::set_device(0);
    std::printf(
        "Paged prefill of few queries a request, GPU us (eager with PDL; graph); 32/8 heads, D "
        "128, bf16, page 16, shuffled pages, causal\n| batch | q | kv | eager | graph | tiles | "
        "entries / merges | decode eager / graph | prefill / decode (graph) |\n"
        "|---|---|---|---|---|---|---|---|---|\n");
    std::vector<Shape> shapes{{16, 1, 128},   {64, 1, 128},   {64, 1, 1024},
                              {64, 1, 2048},  {150, 1, 1024}, {64, 1, 8192},
                              {16, 16, 2048}, {24, 16, 4096}, {32, 16, 2048}};
    if (argc == 4) shapes = {{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3])}};
    for (const Shape& shape : shapes) bench(shape);
  } catch (const flare::Error& e) {
    std::fprintf(stderr, "bench_small_q_prefill: %s\n", e.what());
    return 1;
  }
  return 0;
}
