// BatchPrefill on the GPU against the CPU float64 reference: paged (page sizes 1/16, NHD/HND,
// strided) and ragged KV, prefill (q_len = kv_len) and append (q_len < kv_len), odd and mixed
// lengths, empty requests, GQA 1/4/7/8, head dims 64/128/256/192-128, f16/bf16, every mask and
// variant flag, every query tile, split-KV through the merge kernel, determinism, CUDA graphs,
// logits large enough that the lazily rescaled running max moves mid-stream.
// Outputs are NaN-poisoned before each run. Skips without a CUDA device.
//
// Tolerances (unit-variance inputs, float64 reference on the same rounded inputs): bf16 max abs
// <= 2e-2 and relative L2 <= 1e-2 (o is rounded to bf16, P to bf16 before P.V); f16 max abs
// <= 4e-3 and relative L2 <= 2e-3; lse (float32) max abs <= 2e-3.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "flare/reference/attention.h"
#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare {
namespace {

using testing::KVCacheSpec;
using testing::TestKVCache;

struct Case {
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int num_qo_heads = 8;
  int num_kv_heads = 2;
  int head_dim_qk = 128;
  int head_dim_vo = 128;
  PrefillKV kv = PrefillKV::kPaged;
  int page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  bool strided = false;
  DType dtype = DType::kBF16;
  MaskMode mask = MaskMode::kCausal;
  int window_left = -1;
  float soft_cap = 0.0f;
  float sm_scale = 0.0f;  // 0: 1 / sqrt(head_dim_qk)
  bool alibi = false;
  int query_tile = 0;
  int fixed_split_size = 0;
  bool disable_split_kv = false;
  uint64_t seed = 1;
};

// Device copy of a host buffer; views into the host buffer are rebased onto it.
struct DeviceCopy {
  cuda::DeviceBuffer buffer;
  const void* host_base = nullptr;

  DeviceCopy() = default;
  explicit DeviceCopy(const HostTensor& host) {
    const size_t bytes = static_cast<size_t>(host.numel()) * dtype_bytes(host.dtype());
    buffer = cuda::DeviceBuffer(std::max<size_t>(bytes, 16));
    host_base = host.data<std::byte>();
    if (bytes > 0) cuda::memcpy_htod(buffer.data(), host_base, bytes);
  }
  TensorView view(const TensorView& host_view) const {
    return testing::rebase_view(host_view, host_base, buffer.data(), Device::cuda(0));
  }
};

double tolerance_abs(DType dtype) { return dtype == DType::kBF16 ? 2e-2 : 4e-3; }
double tolerance_l2(DType dtype) { return dtype == DType::kBF16 ? 1e-2 : 2e-3; }
constexpr double kLseTolerance = 2e-3;

// Everything one case needs on both sides.
struct Problem {
  Case c;
  TestKVCache cache;
  HostTensor q, qo_indptr, mask_bits, mask_indptr;
  HostTensor o_ref, lse_ref;
  AttentionParams params;
  int64_t total_q = 0;
};

Problem make_problem(const Case& c) {
  Problem p;
  p.c = c;
  KVCacheSpec spec;
  spec.kv_lens = c.kv_lens;
  spec.num_kv_heads = c.num_kv_heads;
  spec.head_dim_qk = c.head_dim_qk;
  spec.head_dim_vo = c.head_dim_vo;
  spec.dtype = c.dtype;
  spec.page_size = c.page_size;
  spec.layout = c.layout;
  spec.strided = c.strided;
  spec.seed = c.seed;
  p.cache = testing::build_kv_cache(spec);
  p.qo_indptr = testing::indptr_tensor(c.q_lens);
  p.total_q = p.qo_indptr.data<int32_t>()[c.q_lens.size()];
  p.q = testing::random_tensor(c.dtype, {p.total_q, c.num_qo_heads, c.head_dim_qk}, c.seed + 10);

  p.params.mask = c.mask;
  p.params.window_left = c.window_left;
  p.params.logits_soft_cap = c.soft_cap;
  p.params.sm_scale = c.sm_scale;
  if (c.alibi) p.params.pos_encoding = PosEncoding::kAlibi;
  if (c.mask == MaskMode::kCustom) {
    std::vector<int32_t> bytes_per_request;
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
      bytes_per_request.push_back(
          static_cast<int32_t>((int64_t{c.q_lens[i]} * c.kv_lens[i] + 7) / 8));
    }
    p.mask_indptr = testing::indptr_tensor(bytes_per_request);
    const int64_t total = p.mask_indptr.data<int32_t>()[c.q_lens.size()];
    p.mask_bits = HostTensor(DType::kU8, {std::max<int64_t>(total, 1)});
    testing::Rng rng(c.seed + 20);
    for (int64_t i = 0; i < total; ++i) {
      p.mask_bits.data<uint8_t>()[i] = static_cast<uint8_t>(rng.uniform_int(0, 255));
    }
    p.params.custom_mask = p.mask_bits.view();
    p.params.mask_indptr = p.mask_indptr.view();
  }

  p.o_ref = HostTensor(DType::kF32, {p.total_q, c.num_qo_heads, c.head_dim_vo});
  p.lse_ref = HostTensor(DType::kF32, {p.total_q, c.num_qo_heads});
  AttentionProblem problem;
  problem.q = p.q.view();
  problem.qo_indptr = p.qo_indptr.view();
  if (c.kv == PrefillKV::kPaged) {
    problem.kv = p.cache.paged;
  } else {
    problem.kv = p.cache.ragged;
  }
  problem.params = p.params;
  ReferenceOptions options;
  options.accumulation = Accumulation::kF64;
  reference_attention(problem, {p.o_ref.view(), p.lse_ref.view()}, options);
  return p;
}

BatchPrefillConfig config_of(const Problem& p) {
  const Case& c = p.c;
  BatchPrefillConfig config;
  config.max_batch = static_cast<int>(c.q_lens.size());
  config.max_total_qo = static_cast<int>(std::max<int64_t>(p.total_q, 1));
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim_qk = c.head_dim_qk;
  config.head_dim_vo = c.head_dim_vo;
  config.kv = c.kv;
  config.page_size = c.page_size;
  config.layout = c.layout;
  config.dtype = c.dtype;
  config.params = p.params;
  config.params.custom_mask.reset();
  config.params.mask_indptr.reset();
  config.query_tile = c.query_tile;
  config.fixed_split_size = c.fixed_split_size;
  config.disable_split_kv = c.disable_split_kv;
  return config;
}

// The device side of a problem: inputs uploaded, outputs poisoned.
struct DeviceProblem {
  DeviceCopy q, qo_indptr, pages, v_pages, page_indptr, page_indices, last_page_len, k_rows, v_rows,
      kv_indptr, mask_bits, o, lse;
  HostTensor o_host, lse_host;
  PagedKV paged;
  RaggedKV ragged;
  std::optional<TensorView> mask;

  explicit DeviceProblem(const Problem& p)
      : q(p.q),
        qo_indptr(p.qo_indptr),
        pages(p.cache.pages_storage),
        v_pages(p.cache.v_pages_storage),
        page_indptr(p.cache.page_indptr),
        page_indices(p.cache.page_indices),
        last_page_len(p.cache.last_page_len),
        k_rows(p.cache.k_ragged_storage),
        v_rows(p.cache.v_ragged_storage),
        kv_indptr(p.cache.ragged_indptr) {
    paged = p.cache.paged;
    paged.k = pages.view(p.cache.paged.k);
    paged.v = v_pages.view(p.cache.paged.v);
    paged.table.indptr = page_indptr.view(p.cache.paged.table.indptr);
    paged.table.indices = page_indices.view(p.cache.paged.table.indices);
    paged.table.last_block_len = last_page_len.view(p.cache.paged.table.last_block_len);
    ragged.k = k_rows.view(p.cache.ragged.k);
    ragged.v = v_rows.view(p.cache.ragged.v);
    ragged.indptr = kv_indptr.view(p.cache.ragged.indptr);
    if (p.c.mask == MaskMode::kCustom) {
      mask_bits = DeviceCopy(p.mask_bits);
      mask = mask_bits.view(p.mask_bits.view());
    }
    o_host = HostTensor(p.c.dtype, p.o_ref.shape());
    lse_host = HostTensor(DType::kF32, p.lse_ref.shape());
    o = DeviceCopy(o_host);
    lse = DeviceCopy(lse_host);
    poison();
  }
  // In place: a captured graph keeps the output addresses.
  void poison() {
    o_host.fill(std::numeric_limits<float>::quiet_NaN());
    lse_host.fill(std::numeric_limits<float>::quiet_NaN());
    cuda::memcpy_htod(o.buffer.data(), o_host.data<std::byte>(),
                      static_cast<size_t>(o_host.numel()) * dtype_bytes(o_host.dtype()));
    cuda::memcpy_htod(lse.buffer.data(), lse_host.data<std::byte>(),
                      static_cast<size_t>(lse_host.numel()) * sizeof(float));
  }
  void run(BatchPrefill& prefill, const Problem& p, cuda::Stream stream,
           const RunOptions& options = {}) {
    const TensorView qv = q.view(p.q.view());
    const TensorView ov = o.view(o_host.view());
    const TensorView lv = lse.view(lse_host.view());
    if (p.c.kv == PrefillKV::kPaged) {
      prefill.run(qv, PagedKVPages::of(paged), ov, lv, stream, mask, options);
    } else {
      prefill.run(qv, ragged.k, ragged.v, ov, lv, stream, mask, options);
    }
  }
  void download() {
    cuda::device_synchronize();
    cuda::memcpy_dtoh(o_host.data<std::byte>(), o.buffer.data(),
                      static_cast<size_t>(o_host.numel()) * dtype_bytes(o_host.dtype()));
    cuda::memcpy_dtoh(lse_host.data<std::byte>(), lse.buffer.data(),
                      static_cast<size_t>(lse_host.numel()) * sizeof(float));
  }
};

void plan(BatchPrefill& prefill, const Problem& p, cuda::Stream stream) {
  const std::vector<int32_t> qo = testing::int32_values(p.qo_indptr.view());
  const std::vector<int32_t> mask_indptr = p.c.mask == MaskMode::kCustom
                                               ? testing::int32_values(p.mask_indptr.view())
                                               : std::vector<int32_t>{};
  if (p.c.kv == PrefillKV::kPaged) {
    prefill.plan(qo, testing::int32_values(p.cache.page_indptr.view()),
                 testing::int32_values(p.cache.last_page_len.view()), stream, mask_indptr);
  } else {
    prefill.plan(qo, testing::int32_values(p.cache.ragged_indptr.view()), {}, stream, mask_indptr);
  }
}

void expect_matches(const Problem& p, const DeviceProblem& d) {
  const testing::ErrorStats o = testing::error_stats(d.o_host.view(), p.o_ref.view());
  EXPECT_LE(o.max_abs, tolerance_abs(p.c.dtype)) << o;
  EXPECT_LE(o.relative_l2, tolerance_l2(p.c.dtype)) << o;
  const testing::ErrorStats lse = testing::error_stats(d.lse_host.view(), p.lse_ref.view());
  EXPECT_LE(lse.max_abs, kLseTolerance) << lse;
}

bool skip_without_gpu() { return !cuda::available(); }

// Plans, runs once on the default stream, compares; returns the prefill for further checks.
void check(const Case& c, const std::function<void(const BatchPrefill&)>& inspect = {}) {
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  d.run(prefill, p, nullptr);
  d.download();
  expect_matches(p, d);
  if (inspect) inspect(prefill);
}

#define SKIP_WITHOUT_GPU() \
  if (skip_without_gpu()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason()

TEST(PrefillGpu, CausalPrefillPagedOddLengthsGqa4) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 97, 511, 1023};
  c.kv_lens = c.q_lens;
  check(c);
}

TEST(PrefillGpu, CausalAppendPagedPageSize1Gqa7) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {1, 7, 128, 33, 5};
  c.kv_lens = {100, 511, 2049, 33, 1023};
  c.num_qo_heads = 7;
  c.num_kv_heads = 1;
  c.page_size = 1;
  check(c);
}

TEST(PrefillGpu, RaggedNoMaskF16HeadDim64Gqa8) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {97, 1, 300, 7};
  c.kv_lens = {97, 50, 511, 1023};
  c.num_qo_heads = 16;
  c.num_kv_heads = 2;
  c.head_dim_qk = c.head_dim_vo = 64;
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.mask = MaskMode::kNone;
  check(c);
}

TEST(PrefillGpu, HeadDim256CausalGqa1) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {300, 17, 64};
  c.kv_lens = {300, 511, 200};
  c.num_qo_heads = c.num_kv_heads = 3;
  c.head_dim_qk = c.head_dim_vo = 256;
  check(c);
}

TEST(PrefillGpu, HeadDim192To128RaggedAndPaged) {
  SKIP_WITHOUT_GPU();
  for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
    Case c;
    c.q_lens = {200, 9};
    c.kv_lens = {333, 9};
    c.head_dim_qk = 192;
    c.kv = kv;
    check(c);
  }
}

TEST(PrefillGpu, CustomMaskTreeAttention) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {5, 33, 64, 1};
  c.kv_lens = {70, 100, 64, 9};
  c.mask = MaskMode::kCustom;
  check(c);
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.query_tile = 64;
  check(c);
}

TEST(PrefillGpu, CustomMaskQueryTile128) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {200, 129};
  c.kv_lens = {333, 129};
  c.mask = MaskMode::kCustom;
  c.query_tile = 128;
  check(c);
}

// Unit-scale logits (sm_scale 1 on unit-variance q, k: standard deviation sqrt(D)) make the
// running row max climb by more than the lazy-rescale threshold long after the first tile, so
// the O rescale runs mid-stream on every query tile shape.
TEST(PrefillGpu, LargeLogitsRescaleMidStream) {
  SKIP_WITHOUT_GPU();
  for (const int tile : {64, 128}) {
    Case c;
    c.q_lens = {1023, 300};
    c.kv_lens = {1023, 700};
    c.sm_scale = 1.0f;
    c.query_tile = tile;
    c.kv = PrefillKV::kRagged;
    SCOPED_TRACE(::testing::Message() << "tile " << tile);
    check(c);
  }
}

TEST(PrefillGpu, SlidingWindowSoftCapAlibiCausal) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {300, 40, 1};
  c.kv_lens = {300, 1000, 77};
  c.num_qo_heads = 8;
  c.num_kv_heads = 8;
  c.window_left = 100;
  c.soft_cap = 30.0f;
  c.alibi = true;
  check(c);
  c.mask = MaskMode::kNone;  // window without causal
  c.alibi = false;
  check(c);
}

TEST(PrefillGpu, EmptyRequestsAndQueriesBeyondTheCache) {
  SKIP_WITHOUT_GPU();
  Case c;
  // q_len 0; kv_len 0 (o = 0, lse = -inf); q_len > kv_len under causal (the first tokens see
  // nothing).
  c.q_lens = {0, 5, 3, 20, 0};
  c.kv_lens = {10, 0, 7, 9, 0};
  check(c);
}

TEST(PrefillGpu, EveryQueryTile) {
  SKIP_WITHOUT_GPU();
  for (const int tile : {16, 32, 64, 128}) {
    for (const int head_dim : {64, 128, 256}) {
      Case c;
      c.q_lens = {77, 130};
      c.kv_lens = {200, 130};
      c.head_dim_qk = c.head_dim_vo = head_dim;
      c.query_tile = tile;
      c.seed = static_cast<uint64_t>(tile + head_dim);
      SCOPED_TRACE(::testing::Message() << "tile " << tile << " D " << head_dim);
      check(c, [tile](const BatchPrefill& prefill) {
        EXPECT_EQ(prefill.last_tiles().query_tile, tile);
      });
    }
  }
}

TEST(PrefillGpu, HndStridedLayout) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {31, 100};
  c.kv_lens = {60, 100};
  c.layout = KVLayout::kHND;
  c.strided = true;
  check(c);
  c.kv = PrefillKV::kRagged;
  check(c);
}

TEST(PrefillGpu, LongCacheShortAppendSplitsKvAndMerges) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {64};
  c.kv_lens = {8191};
  c.num_qo_heads = 8;
  c.num_kv_heads = 1;
  check(c, [](const BatchPrefill& prefill) {
    EXPECT_FALSE(prefill.last_plan().merge_items.empty()) << "expected split-KV";
  });
  c.kv = PrefillKV::kRagged;
  c.mask = MaskMode::kNone;
  check(c,
        [](const BatchPrefill& prefill) { EXPECT_FALSE(prefill.last_plan().merge_items.empty()); });
}

TEST(PrefillGpu, FixedSplitSizeIsDeterministic) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {100, 3, 250};
  c.kv_lens = {900, 700, 250};
  c.fixed_split_size = 64;
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  d.run(prefill, p, nullptr);
  d.download();
  expect_matches(p, d);
  EXPECT_FALSE(prefill.last_plan().merge_items.empty());
  const HostTensor first = testing::to_contiguous(d.o_host.view());
  d.poison();
  d.run(prefill, p, nullptr);
  d.download();
  const size_t bytes = static_cast<size_t>(first.numel()) * dtype_bytes(first.dtype());
  EXPECT_EQ(std::memcmp(first.data<std::byte>(), d.o_host.data<std::byte>(), bytes), 0);
}

TEST(PrefillGpu, CudaGraphReplaysAcrossPlans) {
  SKIP_WITHOUT_GPU();
  Case big;
  big.q_lens = {64, 200, 1};
  big.kv_lens = {1000, 200, 3000};
  Case small = big;
  small.q_lens = {30, 1, 150};
  small.kv_lens = {30, 2500, 151};
  const Problem pb = make_problem(big);
  const Problem ps = make_problem(small);
  BatchPrefillConfig config = config_of(pb);
  config.use_cuda_graph = true;
  config.query_tile = 64;
  BatchPrefill prefill(config);
  DeviceProblem db(pb);
  cuda::OwnedStream stream;
  plan(prefill, pb, stream.get());
  const cuda::Graph graph(stream.get(), [&] { db.run(prefill, pb, stream.get()); });
  graph.launch(stream.get());
  db.download();
  expect_matches(pb, db);

  // The second batch fits the first's buffers: copy it in place and re-plan.
  DeviceProblem ds(ps);
  plan(prefill, ps, stream.get());
  const auto copy = [](const DeviceCopy& from, const DeviceCopy& to, size_t bytes) {
    std::vector<std::byte> host(bytes);
    cuda::memcpy_dtoh(host.data(), from.buffer.data(), bytes);
    cuda::memcpy_htod(to.buffer.data(), host.data(), bytes);
  };
  ASSERT_LE(ps.total_q, pb.total_q);
  ASSERT_LE(ps.cache.pages_storage.numel(), pb.cache.pages_storage.numel());
  const auto bytes_of = [](const HostTensor& t) {
    return static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype());
  };
  copy(ds.q, db.q, bytes_of(ps.q));
  copy(ds.qo_indptr, db.qo_indptr, bytes_of(ps.qo_indptr));
  copy(ds.pages, db.pages, bytes_of(ps.cache.pages_storage));
  copy(ds.v_pages, db.v_pages, bytes_of(ps.cache.v_pages_storage));
  copy(ds.page_indptr, db.page_indptr, bytes_of(ps.cache.page_indptr));
  copy(ds.page_indices, db.page_indices, bytes_of(ps.cache.page_indices));
  copy(ds.last_page_len, db.last_page_len, bytes_of(ps.cache.last_page_len));
  db.poison();
  graph.launch(stream.get());
  db.download();
  // Compare the rows of the smaller batch only.
  const TensorView o_rows = db.o_host.view().slice(0, 0, ps.total_q);
  const TensorView lse_rows = db.lse_host.view().slice(0, 0, ps.total_q);
  const testing::ErrorStats o = testing::error_stats(o_rows, ps.o_ref.view());
  EXPECT_LE(o.max_abs, tolerance_abs(small.dtype)) << o;
  EXPECT_LE(o.relative_l2, tolerance_l2(small.dtype)) << o;
  EXPECT_LE(testing::max_abs_error(lse_rows, ps.lse_ref.view()), kLseTolerance);
}

TEST(PrefillGpu, RunChecksArgumentsBeforeLaunching) {
  SKIP_WITHOUT_GPU();
  Case c;
  c.q_lens = {10};
  c.kv_lens = {20};
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  EXPECT_THROW(d.run(prefill, p, nullptr), Error);  // run() before plan()
  plan(prefill, p, nullptr);
  EXPECT_THROW(prefill.run(d.q.view(p.q.view()), d.ragged.k, d.ragged.v, d.o.view(d.o_host.view()),
                           std::nullopt, nullptr),
               Error);  // ragged KV on a paged prefill
  // A page stride of 2^30 elements (2 GiB per page) exceeds the kernel's 32-bit page offsets.
  PagedKVPages huge = PagedKVPages::of(d.paged);
  huge.k.strides[0] = int64_t{1} << 30;
  EXPECT_FLARE_ERROR(
      prefill.run(d.q.view(p.q.view()), huge, d.o.view(d.o_host.view()), std::nullopt, nullptr),
      ErrorCode::kUnsupported, "2^31 bytes");
  // Fewer page ids than the plan reads: named, nothing launched.
  PagedKVPages short_indices = PagedKVPages::of(d.paged);
  short_indices.indices.shape[0] = 0;
  EXPECT_FLARE_ERROR(prefill.run(d.q.view(p.q.view()), short_indices, d.o.view(d.o_host.view()),
                                 std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "kv indices");
  const std::vector<int32_t> bad_qo = {0, 5, 3};
  const std::vector<int32_t> kv_indptr = {0, 1, 2};
  const std::vector<int32_t> last_page_len = {16, 4};
  EXPECT_THROW(prefill.plan(bad_qo, kv_indptr, last_page_len, nullptr), Error);
}

}  // namespace
}  // namespace flare
