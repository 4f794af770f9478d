// BatchDecode in a CUDA graph: captured once, replayed over decode steps whose lengths, page
// tables and batch composition change (plan() between replays), equal to the reference every
// step; and run()'s argument errors, raised before anything is launched.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/jit/cuda_sync.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

constexpr double kOutputTolerance = 1e-2;  // CUDA-core loop (issue 4)
constexpr double kLseTolerance = 1e-3;

// The loops under test: CUDA cores, tensor cores, tensor cores on whole-page items.
enum Loop { kCudaCores, kTensorCores, kWholePages };

BatchDecodeConfig graph_config(int loop) {
  BatchDecodeConfig c;
  c.use_tensor_cores = loop != kCudaCores;
  c.kv_heads_per_item = loop == kWholePages ? 4 : 1;
  c.max_batch = 80;
  c.num_qo_heads = 28;  // GQA 7
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.page_size = 16;
  c.layout = KVLayout::kHND;
  c.use_cuda_graph = true;
  return c;
}

// Each loop (the parameter: Loop).
class BatchDecodeGraph : public ::testing::TestWithParam<int> {};

TEST_P(BatchDecodeGraph, OneCaptureReplayedOverChangingSteps) {
  FLARE_REQUIRE_GPU();
  cuda::set_device(0);
  const BatchDecodeConfig config = graph_config(GetParam());
  BatchDecode decode(config);
  const int64_t max_batch = config.max_batch, heads = config.num_qo_heads, d = config.head_dim;
  const int64_t page_size = config.page_size, kv_heads = config.num_kv_heads;
  constexpr int64_t kPoolPages = 8192;
  constexpr int kSteps = 6;

  // Fixed device buffers sized for the bounds: the captured run reads them every replay.
  const size_t page_bytes = static_cast<size_t>(kv_heads * page_size * d) * 2;
  cuda::DeviceBuffer k_pool(kPoolPages * page_bytes), v_pool(kPoolPages * page_bytes);
  cuda::DeviceBuffer indptr(static_cast<size_t>(max_batch + 1) * 4);
  cuda::DeviceBuffer indices(kPoolPages * 4), last(static_cast<size_t>(max_batch) * 4);
  cuda::DeviceBuffer q(static_cast<size_t>(max_batch * heads * d) * 2);
  gpu_testing::DeviceOutputs out(max_batch, heads, d, config.q_dtype);
  PagedKV kv;
  kv.layout = config.layout;
  kv.k = TensorView::contiguous(k_pool.data(), config.kv_dtype,
                                {kPoolPages, kv_heads, page_size, d}, Device::cuda(0));
  kv.v = TensorView::contiguous(v_pool.data(), config.kv_dtype,
                                {kPoolPages, kv_heads, page_size, d}, Device::cuda(0));
  kv.table.block_size = page_size;
  kv.table.indptr = TensorView::contiguous(indptr.data(), DType::kI32, {max_batch + 1},
                                           Device::cuda(0));
  kv.table.indices = TensorView::contiguous(indices.data(), DType::kI32, {kPoolPages},
                                            Device::cuda(0));
  kv.table.last_block_len = TensorView::contiguous(last.data(), DType::kI32, {max_batch},
                                                   Device::cuda(0));
  const TensorView q_view =
      TensorView::contiguous(q.data(), config.q_dtype, {max_batch, heads, d}, Device::cuda(0));
  const cuda::OwnedStream stream;

  std::optional<cuda::Graph> graph;
  testing::Rng rng(77);
  std::vector<int> planned_ctas;
  for (int step = 0; step < kSteps; ++step) {
    // A new batch: its own size, lengths (empty requests too) and a fresh page permutation.
    // Batches of more than 66 requests (264+ tiles) fill the tensor-core loop's resident CTAs
    // on a 132-SM GPU and are planned over both waves of its grid; smaller ones over one.
    const int64_t batch = step == 0         ? max_batch
                          : step % 2 == 1   ? rng.uniform_int(1, 40)
                                            : rng.uniform_int(67, max_batch);
    testing::KVCacheSpec spec;
    spec.kv_lens = testing::random_lengths(batch, testing::LengthDistribution::kZipf, 0, 3000,
                                           100 + step);
    spec.num_kv_heads = kv_heads;
    spec.head_dim_qk = spec.head_dim_vo = d;
    spec.dtype = config.kv_dtype;
    spec.page_size = page_size;
    spec.layout = config.layout;
    spec.seed = 200 + step;
    int64_t used = 0;
    for (int32_t len : spec.kv_lens) used += (len + page_size - 1) / page_size;
    ASSERT_LE(used, kPoolPages);
    spec.unused_pages = kPoolPages - used;
    const testing::TestKVCache cache = testing::build_kv_cache(spec);
    const gpu_testing::HostQuery host_q =
        gpu_testing::random_query(batch, heads, d, config.q_dtype, false, 300 + step);
    const gpu_testing::Reference ref =
        gpu_testing::reference_decode(host_q.view, cache, config.params);

    // Refill the captured buffers in place.
    cuda::stream_synchronize(stream.get());
    cuda::memcpy_htod(k_pool.data(), cache.pages_storage.data<std::byte>(), kPoolPages * page_bytes);
    cuda::memcpy_htod(v_pool.data(), cache.v_pages_storage.data<std::byte>(),
                      kPoolPages * page_bytes);
    cuda::memcpy_htod(indptr.data(), cache.page_indptr.data<std::byte>(),
                      static_cast<size_t>(batch + 1) * 4);
    if (used > 0) {
      cuda::memcpy_htod(indices.data(), cache.page_indices.data<std::byte>(),
                        static_cast<size_t>(used) * 4);
    }
    cuda::memcpy_htod(last.data(), cache.last_page_len.data<std::byte>(),
                      static_cast<size_t>(batch) * 4);
    cuda::memcpy_htod(q.data(), host_q.storage.data<std::byte>(),
                      static_cast<size_t>(batch * heads * d) * 2);
    cuda::device_synchronize();  // pageable copies may still be in flight on return

    decode.plan(testing::int32_values(cache.page_indptr.view()),
                testing::int32_values(cache.last_page_len.view()), stream.get());
    // The tensor-core loop's grid is two waves of resident CTAs (one tile per request and KV
    // head here): batches whose tiles fill the resident CTAs are planned over both.
    const int resident = GetParam() != kCudaCores ? decode.num_ctas() / 2 : decode.num_ctas();
    const bool fills = batch * (kv_heads / config.kv_heads_per_item) >= resident;
    EXPECT_EQ(decode.last_plan().num_ctas, fills ? decode.num_ctas() : resident)
        << "step " << step << " batch " << batch;
    planned_ctas.push_back(decode.last_plan().num_ctas);
    out.poison(stream.get());
    if (!graph) {
      graph.emplace(stream.get(), [&] {
        decode.run(q_view, kv, out.o_view, out.lse_view, stream.get());
      });
    }
    graph->launch(stream.get());
    cuda::stream_synchronize(stream.get());

    const HostTensor o = out.o_host();
    const HostTensor lse = out.lse_host();
    const TensorView o_rows = o.view().slice(0, 0, batch);
    const TensorView lse_rows = lse.view().slice(0, 0, batch);
    const testing::ErrorStats o_err = testing::error_stats(o_rows, ref.o.view());
    const testing::ErrorStats lse_err = testing::error_stats(lse_rows, ref.lse.view());
    const double tolerance =
        GetParam() != kCudaCores ? gpu_testing::kOutputToleranceTensorCores : kOutputTolerance;
    const int64_t worst_request = o_err.worst_index / (heads * d);
    EXPECT_LE(o_err.max_abs, tolerance)
        << "step " << step << " batch " << batch << " " << o_err << "; worst in request "
        << worst_request << " of kv_len " << spec.kv_lens[static_cast<size_t>(worst_request)]
        << ", reference " << ref.o.get(o_err.worst_index) << ", got " << o.get(o_err.worst_index);
    EXPECT_LE(lse_err.max_abs, kLseTolerance) << "step " << step << " " << lse_err;
    EXPECT_EQ(testing::count_nan(o_rows), 0) << "step " << step;
  }
  // The captured grid ran plans of both sizes (tensor cores, 2 CTAs per SM on up to 134 SMs).
  if (GetParam() == kTensorCores && decode.num_ctas() / 2 <= 67 * 4) {
    const auto [fewest, most] = std::minmax_element(planned_ctas.begin(), planned_ctas.end());
    EXPECT_EQ(*most, decode.num_ctas());
    EXPECT_EQ(*fewest, decode.num_ctas() / 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Loops, BatchDecodeGraph,
                         ::testing::Values(kCudaCores, kTensorCores, kWholePages),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == kCudaCores     ? "cuda_cores"
                                              : info.param == kTensorCores ? "tensor_cores"
                                                                           : "whole_pages");
                         });

class BatchDecodeErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << cuda::unavailable_reason();
    cuda::set_device(0);
    config_.max_batch = 2;
    config_.num_qo_heads = 8;
    config_.num_kv_heads = 2;
    config_.head_dim = 64;
    config_.page_size = 16;
    testing::KVCacheSpec spec;
    spec.kv_lens = {5, 40};
    spec.num_kv_heads = 2;
    spec.head_dim_qk = spec.head_dim_vo = 64;
    spec.dtype = DType::kBF16;
    cache_.emplace(testing::build_kv_cache(spec));
    kv_.emplace(gpu_testing::to_device(*cache_));
    query_ = gpu_testing::random_query(2, 8, 64, DType::kBF16, false, 3);
    q_.emplace(gpu_testing::to_device(query_.storage));
    out_.emplace(2, 8, 64, DType::kBF16);
    cuda::device_synchronize();
  }
  void plan(BatchDecode& decode) {
    decode.plan(testing::int32_values(cache_->page_indptr.view()),
                testing::int32_values(cache_->last_page_len.view()), nullptr);
  }

  BatchDecodeConfig config_;
  std::optional<testing::TestKVCache> cache_;
  std::optional<gpu_testing::DeviceKV> kv_;
  gpu_testing::HostQuery query_;
  std::optional<gpu_testing::DeviceCopy> q_;
  std::optional<gpu_testing::DeviceOutputs> out_;
};

TEST_F(BatchDecodeErrors, ArgumentsAreCheckedBeforeLaunching) {
  BatchDecode decode(config_);
  EXPECT_FLARE_ERROR(decode.run(q_->view, kv_->paged, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "before plan");
  plan(decode);
  out_->poison(nullptr);

  TensorView wrong_dtype = q_->view;
  wrong_dtype.dtype = DType::kF16;
  EXPECT_FLARE_ERROR(decode.run(wrong_dtype, kv_->paged, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "q must be bfloat16");
  TensorView host_q = query_.view;
  EXPECT_FLARE_ERROR(decode.run(host_q, kv_->paged, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "q must be on cuda:0");
  TensorView misaligned = q_->view;
  misaligned.data = static_cast<std::byte*>(misaligned.data) + 2;
  EXPECT_FLARE_ERROR(decode.run(misaligned, kv_->paged, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "16-byte");
  TensorView short_o = out_->o_view.slice(0, 0, 1);
  EXPECT_FLARE_ERROR(decode.run(q_->view, kv_->paged, short_o, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "o must have shape [2, 8, 64]");
  PagedKV hnd = kv_->paged;
  hnd.layout = KVLayout::kHND;
  EXPECT_FLARE_ERROR(decode.run(q_->view, hnd, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "layout");
  PagedKV short_table = kv_->paged;
  short_table.table.indices = short_table.table.indices.slice(0, 0, 1);
  EXPECT_FLARE_ERROR(decode.run(q_->view, short_table, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "kv indices");
  TensorView lse_f16 = out_->lse_view;
  lse_f16.dtype = DType::kF16;
  EXPECT_FLARE_ERROR(decode.run(q_->view, kv_->paged, out_->o_view, lse_f16, nullptr),
                     ErrorCode::kInvalidArgument, "lse must be float32");
  // A page stride of 2^30 elements (2 GiB per page) exceeds the kernel's 32-bit page offsets.
  PagedKV huge_pages = kv_->paged;
  huge_pages.v.strides[0] = int64_t{1} << 30;
  EXPECT_FLARE_ERROR(decode.run(q_->view, huge_pages, out_->o_view, std::nullopt, nullptr),
                     ErrorCode::kUnsupported, "2^31 bytes");

  // Nothing was launched: the poisoned output is untouched.
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(out_->o_host().view()), out_->o_view.numel());
}

TEST_F(BatchDecodeErrors, PlanRejectsMalformedTables) {
  BatchDecode decode(config_);
  const std::vector<int32_t> last = {5, 8};
  EXPECT_FLARE_ERROR(decode.plan(std::vector<int32_t>{0, 1, 3, 4}, std::vector<int32_t>{1, 1, 1},
                                 nullptr),
                     ErrorCode::kInvalidArgument, "max_batch");
  EXPECT_FLARE_ERROR(decode.plan(std::vector<int32_t>{0, 2, 1}, last, nullptr),
                     ErrorCode::kInvalidArgument, "non-decreasing");
  EXPECT_FLARE_ERROR(decode.plan(std::vector<int32_t>{1, 2, 3}, last, nullptr),
                     ErrorCode::kInvalidArgument, "kv_indptr[0]");
  EXPECT_FLARE_ERROR(decode.plan(std::vector<int32_t>{0, 1, 3}, std::vector<int32_t>{5, 17},
                                 nullptr),
                     ErrorCode::kInvalidArgument, "kv_last_page_len[1]");
  EXPECT_FLARE_ERROR(decode.plan(std::vector<int32_t>{0, 1, 3}, std::vector<int32_t>{5}, nullptr),
                     ErrorCode::kInvalidArgument, "kv_last_page_len");
}

TEST_F(BatchDecodeErrors, CapturingWithoutGraphModeThrows) {
  BatchDecode decode(config_);
  plan(decode);
  const cuda::OwnedStream stream;
  EXPECT_FLARE_ERROR(cuda::Graph(stream.get(),
                                 [&] {
                                   decode.run(q_->view, kv_->paged, out_->o_view, std::nullopt,
                                              stream.get());
                                 }),
                     ErrorCode::kInvalidArgument, "use_cuda_graph");
}

// Destructors during a capture: a decode object, device and pinned buffers, a stream and an
// event destroyed while another stream is being captured in the global mode (PyTorch's default;
// a wrapper collected by Python's garbage collector inside a torch.cuda.graph block) leave that
// capture valid, and its replay computes the step: flare frees in the relaxed capture mode. In
// the global mode the driver counts cuMemFree as unsafe and invalidated the capture
// (bench_t5_decode.py's graphs, forty-sixth session).
TEST_F(BatchDecodeErrors, DestructorsDuringAGlobalCaptureLeaveItValid) {
  BatchDecodeConfig graph_mode = config_;
  graph_mode.use_cuda_graph = true;
  BatchDecode captured(graph_mode);
  plan(captured);
  std::optional<BatchDecode> doomed(std::in_place, config_);
  plan(*doomed);
  doomed->run(q_->view, kv_->paged, out_->o_view, std::nullopt, nullptr);
  std::optional<cuda::DeviceBuffer> buffer(std::in_place, size_t{1} << 20);
  std::optional<cuda::PinnedBuffer> pinned(std::in_place, size_t{4096});
  std::optional<cuda::OwnedStream> other(std::in_place);
  std::optional<cuda::Event> event(std::in_place);
  out_->poison(nullptr);
  cuda::device_synchronize();
  const cuda::OwnedStream stream;
  std::optional<cuda::Graph> graph;
  ASSERT_NO_THROW(graph.emplace(
      stream.get(),
      [&] {
        doomed.reset();
        buffer.reset();
        pinned.reset();
        other.reset();
        event.reset();
        captured.run(q_->view, kv_->paged, out_->o_view, out_->lse_view, stream.get());
      },
      cuda::CaptureMode::kGlobal));
  graph->launch(stream.get());
  cuda::stream_synchronize(stream.get());
  const gpu_testing::Reference ref = gpu_testing::reference_decode(query_.view, *cache_, {});
  const testing::ErrorStats err = testing::error_stats(out_->o_host().view(), ref.o.view());
  EXPECT_LE(err.max_abs, kOutputTolerance) << err;
}

// The small case scripts/gpu_check.sh runs under compute-sanitizer memcheck and racecheck:
// split and write-through items, an empty request, fp8 and 16-bit KV on both loops and on
// whole-page items.
TEST_F(BatchDecodeErrors, SanitizerSmallCase) {
  for (const auto& [kv_dtype, loop] :
       {std::pair{DType::kBF16, kCudaCores}, std::pair{DType::kE4M3, kCudaCores},
        std::pair{DType::kBF16, kTensorCores}, std::pair{DType::kE4M3, kTensorCores},
        std::pair{DType::kBF16, kWholePages}, std::pair{DType::kE4M3, kWholePages}}) {
    testing::KVCacheSpec spec;
    spec.kv_lens = {1, 0, 300, 2000};
    spec.num_kv_heads = 2;
    spec.head_dim_qk = spec.head_dim_vo = 64;
    spec.dtype = kv_dtype;
    spec.page_size = 16;
    const testing::TestKVCache cache = testing::build_kv_cache(spec);
    const gpu_testing::HostQuery host_q = gpu_testing::random_query(4, 8, 64, DType::kBF16, false, 9);
    const gpu_testing::Reference ref = gpu_testing::reference_decode(host_q.view, cache, {});
    BatchDecodeConfig config = config_;
    config.max_batch = 4;
    config.kv_dtype = kv_dtype;
    config.use_tensor_cores = loop != kCudaCores;
    config.kv_heads_per_item = loop == kWholePages ? 2 : 1;
    config.ctas_per_sm = 1;
    config.num_sms_to_use = 8;
    BatchDecode decode(config);
    const gpu_testing::DeviceKV kv = gpu_testing::to_device(cache);
    const gpu_testing::DeviceCopy q = gpu_testing::to_device(host_q.storage);
    gpu_testing::DeviceOutputs out(4, 8, 64, DType::kBF16);
    cuda::device_synchronize();
    decode.plan(testing::int32_values(cache.page_indptr.view()),
                testing::int32_values(cache.last_page_len.view()), nullptr);
    ASSERT_GT(decode.last_plan().merge_items.size(), 0u);
    out.poison(nullptr);
    decode.run(q.view, kv.paged, out.o_view, out.lse_view, nullptr);
    cuda::stream_synchronize(nullptr);
    const testing::ErrorStats err = testing::error_stats(out.o_host().view(), ref.o.view());
    EXPECT_LE(err.max_abs, is_fp8(kv_dtype) ? 2e-2 : 1e-2) << err;
  }
}

}  // namespace
}  // namespace flare
