// BatchPrefill::plan_cascade on the GPU (issue 20, composable formats in one launch): against
// each level's float64 reference merged with ⊕ (tests/testing/cascade_case.h) for decode and
// append stages, two and three levels, empty shared groups, GQA 1/4/8, page sizes 1/16, both
// kernel families; a CUDA-graph replay across re-plans with changing suffixes; bad levels and
// unsupported configs refused before anything is staged; out-of-range page ids recorded.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "gpu/prefill_test_support.h"
#include "testing/cascade_case.h"

namespace flare {
namespace {

using prefill_testing::DeviceCopy;

struct CascadeShape {
  const char* name;
  int levels, requests, q_min, q_max, max_prefix, max_suffix;
  bool causal;
  int kv_heads;
  int query_tile;  // 0: the heuristic; 64: the Hopper family on sm_90
};

const CascadeShape kShapes[] = {
    {"decode", 2, 19, 1, 1, 700, 60, false, 2, 0},
    {"decode_causal", 2, 33, 1, 1, 300, 45, true, 2, 0},
    {"append_causal", 2, 6, 1, 17, 400, 70, true, 2, 0},
    {"three_levels", 3, 21, 1, 5, 200, 40, true, 2, 0},
    {"append_tile64", 2, 5, 3, 40, 500, 90, true, 1, 64},
    {"decode_tile128", 2, 40, 1, 1, 900, 30, false, 2, 128},
};

// The levels' arrays for plan_cascade: each level's groups, page ranges of the pool's one
// page-id array.
struct LevelArrays {
  std::vector<std::vector<int32_t>> kv_indptr, last;
  std::vector<CascadeLevel> levels;

  explicit LevelArrays(const testing::CascadeCase& c) {
    const std::vector<int32_t> last_all = testing::int32_values(c.cache.last_page_len.view());
    size_t group = 0;
    for (size_t l = 0; l < c.spec.qo_indptr.size(); ++l) {
      const size_t groups = c.spec.kv_len[l].size();
      kv_indptr.emplace_back(
          c.page_indptr.begin() + static_cast<std::ptrdiff_t>(group),
          c.page_indptr.begin() + static_cast<std::ptrdiff_t>(group + groups + 1));
      last.emplace_back(last_all.begin() + static_cast<std::ptrdiff_t>(group),
                        last_all.begin() + static_cast<std::ptrdiff_t>(group + groups));
      group += groups;
    }
    for (size_t l = 0; l < kv_indptr.size(); ++l) {
      levels.push_back({c.spec.qo_indptr[l], kv_indptr[l], last[l]});
    }
  }
};

// The device side: q, the pages and the page ids uploaded, o and lse NaN.
struct DeviceCascade {
  // Device 0 current before the uploads, whatever ran before in this process (a BatchPrefill
  // restores its caller's context, which may be none).
  struct CurrentDevice {
    CurrentDevice() { cuda::set_device(0); }
  } current_device;
  DeviceCopy q, k, v, ids, o, lse;
  HostTensor o_host, lse_host;
  TensorView qv, ov, lv;
  PagedKVPages pages;

  explicit DeviceCascade(const testing::CascadeCase& c)
      : q(c.q), k(c.cache.pages_storage), v(c.cache.v_pages_storage), ids(c.cache.page_indices) {
    const int64_t heads = c.q.shape()[1];
    o_host = HostTensor(c.q.dtype(), {c.total_q, heads, c.q.shape()[2]});
    lse_host = HostTensor(DType::kF32, {c.total_q, heads});
    o = DeviceCopy(o_host);
    lse = DeviceCopy(lse_host);
    qv = q.view(c.q.view());
    ov = o.view(o_host.view());
    lv = lse.view(lse_host.view());
    pages = {k.view(c.cache.paged.k), v.view(c.cache.paged.v), c.cache.paged.layout,
             ids.view(c.cache.page_indices.view())};
    poison();
  }
  void poison() { prefill_testing::poison_outputs(o_host, lse_host, o, lse); }
  void download() { prefill_testing::download_outputs(o_host, lse_host, o, lse); }
};

BatchPrefillConfig cascade_config(const testing::CascadeCase& c, int levels, int query_tile) {
  BatchPrefillConfig config;
  int groups = 0;
  for (const auto& kv : c.spec.kv_len) groups += static_cast<int>(kv.size());
  config.max_batch = groups;
  config.max_total_qo = static_cast<int>(c.total_q);
  config.num_qo_heads = static_cast<int>(c.q.shape()[1]);
  config.num_kv_heads = static_cast<int>(c.cache.paged.num_kv_heads());
  config.head_dim_qk = config.head_dim_vo = static_cast<int>(c.q.shape()[2]);
  config.kv = PrefillKV::kPaged;
  config.page_size = static_cast<int>(c.cache.paged.page_size());
  config.layout = c.cache.paged.layout;
  config.dtype = c.q.dtype();
  config.params.mask = c.spec.causal ? MaskMode::kCausal : MaskMode::kNone;
  config.query_tile = query_tile;
  config.backend = prefill_testing::backend_of(prefill_testing::Case{});
  config.max_levels = levels;
  return config;
}

void expect_oracle(const testing::CascadeCase& c, const DeviceCascade& d, const std::string& what,
                   int64_t tokens = -1) {
  const int64_t heads = c.q.shape()[1];
  HostTensor want_o(DType::kF32, {c.total_q, heads, c.q.shape()[2]});
  HostTensor want_lse(DType::kF32, {c.total_q, heads});
  c.oracle(want_o.view(), want_lse.view());
  const int64_t rows = tokens < 0 ? c.total_q : tokens;
  const testing::ErrorStats o =
      testing::error_stats(d.o_host.view().slice(0, 0, rows), want_o.view());
  EXPECT_LE(o.max_abs, prefill_testing::tolerance_abs(c.q.dtype())) << what << " o: " << o;
  EXPECT_LE(o.relative_l2, prefill_testing::tolerance_l2(c.q.dtype())) << what << " o: " << o;
  EXPECT_LE(testing::max_abs_error(d.lse_host.view().slice(0, 0, rows), want_lse.view()),
            prefill_testing::kLseTolerance)
      << what;
}

using Param = std::tuple<int, int, int, DType>;  // shape, group, page size, dtype

class CascadeGpu : public ::testing::TestWithParam<Param> {};

TEST_P(CascadeGpu, MatchesLevelsMerged) {
  SKIP_WITHOUT_GPU();
  const auto [shape_index, group, page_size, dtype] = GetParam();
  const CascadeShape& s = kShapes[shape_index];
  const uint64_t seed = 500 + static_cast<uint64_t>(shape_index * 13 + group * 3 + page_size);
  const testing::CascadeCase c(testing::random_cascade(s.levels, s.requests, s.q_min, s.q_max,
                                                       s.max_prefix, s.max_suffix, s.causal, seed),
                               group * s.kv_heads, s.kv_heads, 128, page_size, dtype, seed);
  BatchPrefill prefill(cascade_config(c, s.levels, s.query_tile));
  DeviceCascade d(c);
  const LevelArrays arrays(c);
  prefill.plan_cascade(arrays.levels, nullptr);
  prefill.run(d.qv, d.pages, d.ov, d.lv, nullptr);
  d.download();
  expect_oracle(c, d, std::string(s.name) + (prefill.last_tiles().warpgroup ? " (fa3)" : " (fa2)"));
  prefill.check();
}

INSTANTIATE_TEST_SUITE_P(Shapes, CascadeGpu,
                         ::testing::Combine(::testing::Range(0, 6), ::testing::Values(1, 4, 8),
                                            ::testing::Values(1, 16),
                                            ::testing::Values(DType::kBF16)));
INSTANTIATE_TEST_SUITE_P(F16, CascadeGpu,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Values(4),
                                            ::testing::Values(16), ::testing::Values(DType::kF16)));

// Table 5's structure: 64 decode requests under one shared prefix and a level whose groups have
// no KV at all (a request without a prefix) next to a shared one.
TEST(CascadeGpuStructure, SharedPrefixAndEmptyGroups) {
  SKIP_WITHOUT_GPU();
  testing::CascadeSpec spec;
  std::vector<int32_t> per_request(65);
  for (int i = 0; i <= 64; ++i) per_request[static_cast<size_t>(i)] = i;
  spec.qo_indptr = {{0, 40, 64}, per_request};
  spec.kv_len = {{1029, 0}, std::vector<int32_t>(64, 0)};
  for (int i = 0; i < 64; ++i) spec.kv_len[1][static_cast<size_t>(i)] = i % 5 == 0 ? 0 : 100 + i;
  spec.causal = true;
  const testing::CascadeCase c(spec, 32, 32, 128, 16, DType::kBF16, 77);
  BatchPrefill prefill(cascade_config(c, 2, 0));
  DeviceCascade d(c);
  const LevelArrays arrays(c);
  prefill.plan_cascade(arrays.levels, nullptr);
  prefill.run(d.qv, d.pages, d.ov, d.lv, nullptr);
  d.download();
  expect_oracle(c, d, "shared prefix");
}

// Replays of one captured run() across re-plans: the second cascade's suffixes are shorter
// and its data is copied into the first's buffers.
TEST(CascadeGpuStructure, CudaGraphReplaysAcrossPlans) {
  SKIP_WITHOUT_GPU();
  testing::CascadeSpec first = testing::random_cascade(2, 12, 1, 3, 500, 80, true, 31);
  testing::CascadeSpec second = first;
  for (int32_t& kv : second.kv_len[1]) kv /= 2;
  second.kv_len[0][0] = 0;  // and one shared group loses its prefix
  const testing::CascadeCase a(first, 8, 2, 128, 16, DType::kBF16, 5);
  const testing::CascadeCase b(second, 8, 2, 128, 16, DType::kBF16, 6);
  BatchPrefillConfig config = cascade_config(a, 2, 64);  // either family
  config.use_cuda_graph = true;
  BatchPrefill prefill(config);
  DeviceCascade da(a);
  cuda::OwnedStream stream;
  const LevelArrays arrays_a(a);
  prefill.plan_cascade(arrays_a.levels, stream.get());
  const cuda::Graph graph(stream.get(),
                          [&] { prefill.run(da.qv, da.pages, da.ov, da.lv, stream.get()); });
  graph.launch(stream.get());
  da.download();
  expect_oracle(a, da, "first plan");

  DeviceCascade db(b);
  const auto copy = [](const DeviceCopy& from, const DeviceCopy& to, const HostTensor& t) {
    const size_t bytes = static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype());
    std::vector<std::byte> host(bytes);
    cuda::memcpy_dtoh(host.data(), from.buffer.data(), bytes);
    cuda::memcpy_htod(to.buffer.data(), host.data(), bytes);
  };
  ASSERT_LE(b.cache.pages_storage.numel(), a.cache.pages_storage.numel());
  copy(db.q, da.q, b.q);
  copy(db.k, da.k, b.cache.pages_storage);
  copy(db.v, da.v, b.cache.v_pages_storage);
  copy(db.ids, da.ids, b.cache.page_indices);
  const LevelArrays arrays_b(b);
  prefill.plan_cascade(arrays_b.levels, stream.get());
  da.poison();
  graph.launch(stream.get());
  da.download();
  expect_oracle(b, da, "second plan");
}

TEST(CascadeGpuStructure, BadLevelsAndConfigsAreRefused) {
  SKIP_WITHOUT_GPU();
  const testing::CascadeCase c(testing::random_cascade(2, 6, 1, 2, 100, 20, true, 3), 8, 2, 128, 16,
                               DType::kBF16, 9);
  const LevelArrays arrays(c);
  const auto expect_error = [](ErrorCode code, const std::string& text, auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no error for: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  BatchPrefill one_level(cascade_config(c, 1, 0));
  expect_error(ErrorCode::kInvalidArgument, "1 to max_levels = 1 levels, got 2",
               [&] { one_level.plan_cascade(arrays.levels, nullptr); });
  BatchPrefill prefill(cascade_config(c, 2, 0));
  std::vector<int32_t> shifted = arrays.kv_indptr[1];
  for (int32_t& x : shifted) x += 1;
  std::vector<CascadeLevel> gap = arrays.levels;
  gap[1].kv_indptr = shifted;
  expect_error(ErrorCode::kInvalidArgument, "level 1: kv_indptr[0] must be",
               [&] { prefill.plan_cascade(gap, nullptr); });
  std::vector<int32_t> bad_last = arrays.last[1];
  bad_last[0] = 17;
  std::vector<CascadeLevel> last_too_long = arrays.levels;
  last_too_long[1].kv_last_page_len = bad_last;
  if (arrays.kv_indptr[1][1] > arrays.kv_indptr[1][0]) {
    expect_error(ErrorCode::kInvalidArgument, "level 1: kv_last_page_len[0] must be in [1, 16]",
                 [&] { prefill.plan_cascade(last_too_long, nullptr); });
  }
  std::vector<int32_t> short_qo = c.spec.qo_indptr[1];
  short_qo.back() -= 1;
  std::vector<CascadeLevel> uneven = arrays.levels;
  uneven[1].qo_indptr = short_qo;
  expect_error(ErrorCode::kInvalidArgument, "every level must cover the batch's tokens",
               [&] { prefill.plan_cascade(uneven, nullptr); });

  BatchPrefillConfig alibi = cascade_config(c, 2, 0);
  alibi.params.pos_encoding = PosEncoding::kAlibi;
  BatchPrefill with_alibi(alibi);
  expect_error(ErrorCode::kUnsupported, "takes no window, ALiBi or RoPE",
               [&] { with_alibi.plan_cascade(arrays.levels, nullptr); });
  BatchPrefillConfig ragged = cascade_config(c, 2, 0);
  ragged.kv = PrefillKV::kRagged;
  BatchPrefill ragged_prefill(ragged);
  expect_error(ErrorCode::kUnsupported, "needs paged 16-bit K/V",
               [&] { ragged_prefill.plan_cascade(arrays.levels, nullptr); });
}

// A page id outside the cache in a shared level: nothing outside the tensors is read (the
// kernel reads page 0 and records the id) and check() names it.
TEST(CascadeGpuStructure, OutOfRangePageIdIsRecorded) {
  SKIP_WITHOUT_GPU();
  const testing::CascadeCase c(testing::random_cascade(2, 8, 1, 1, 200, 30, false, 4), 8, 2, 128,
                               16, DType::kBF16, 11);
  BatchPrefill prefill(cascade_config(c, 2, 0));
  DeviceCascade d(c);
  const LevelArrays arrays(c);
  std::vector<int32_t> ids = testing::int32_values(c.cache.page_indices.view());
  ASSERT_FALSE(ids.empty());
  ids[0] = 1 << 30;
  cuda::memcpy_htod(d.ids.buffer.data(), ids.data(), ids.size() * sizeof(int32_t));
  prefill.plan_cascade(arrays.levels, nullptr);
  prefill.run(d.qv, d.pages, d.ov, d.lv, nullptr);
  cuda::device_synchronize();
  try {
    prefill.check();
    ADD_FAILURE() << "the out-of-range page id was not recorded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIndexOutOfRange) << e.what();
  }
}

}  // namespace
}  // namespace flare
