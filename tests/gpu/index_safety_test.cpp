// Bad index data on the device (issue 17): page ids outside the cache are skipped by the decode
// and prefill kernels, which read and write nothing outside their tensors (canary bytes around
// every buffer stay intact, also under compute-sanitizer memcheck: scripts/gpu_check.sh), the
// error is recorded and check() names the argument, request, entry and value; the context then
// runs a correct call. Host-visible bounds (ragged rows, the page-id count) and validation mode
// fail before anything is launched. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "decode_test_support.h"
#include "flare/api/batch_decode.h"
#include "flare/api/batch_prefill.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using gpu_testing::reference_decode;

// A device allocation with kGuard canary bytes on each side of its payload.
class Guarded {
 public:
  static constexpr size_t kGuard = 4096;
  static constexpr unsigned char kCanary = 0x5a;

  explicit Guarded(size_t payload) : bytes_(payload), buffer_(payload + 2 * kGuard) {
    cuda::memset_d8_async(buffer_.data(), kCanary, buffer_.bytes(), nullptr);
    cuda::device_synchronize();
  }
  void* data() const { return static_cast<std::byte*>(buffer_.data()) + kGuard; }
  void upload(const void* host) const {
    if (bytes_ > 0) cuda::memcpy_htod(data(), host, bytes_);
  }
  // `host_view` of `host` (whose bytes were uploaded) moved onto the payload.
  TensorView view_of(const TensorView& host_view, const HostTensor& host) const {
    return testing::rebase_view(host_view, host.data<std::byte>(), data(), Device::cuda(0));
  }
  bool guards_intact() const {
    std::vector<unsigned char> all(buffer_.bytes());
    cuda::memcpy_dtoh(all.data(), buffer_.data(), all.size());
    for (size_t i = 0; i < kGuard; ++i) {
      if (all[i] != kCanary || all[kGuard + bytes_ + i] != kCanary) return false;
    }
    return true;
  }

 private:
  size_t bytes_;
  cuda::DeviceBuffer buffer_;
};

size_t bytes_of(const HostTensor& t) {
  return static_cast<size_t>(t.numel()) * dtype_bytes(t.dtype());
}

Guarded upload_guarded(const HostTensor& host) {
  Guarded g(bytes_of(host));
  g.upload(host.data<std::byte>());
  return g;
}

// A paged cache, its page ids and the outputs of one batch in guarded device memory.
struct GuardedBatch {
  testing::TestKVCache cache;
  gpu_testing::HostQuery q_host;
  std::optional<Guarded> k, v, indices, q, o, lse;
  PagedKVPages pages;
  TensorView q_view, o_view, lse_view;

  GuardedBatch(const std::vector<int32_t>& kv_lens, int64_t qo_heads, int64_t kv_heads,
               int64_t head_dim, int page_size = 16)
      : cache(build(kv_lens, kv_heads, head_dim, page_size)),
        q_host(gpu_testing::random_query(static_cast<int64_t>(kv_lens.size()), qo_heads, head_dim,
                                         DType::kBF16, false, 5)) {
    cuda::set_device(0);  // the device allocations below need a current context on their own
    k.emplace(upload_guarded(cache.pages_storage));
    v.emplace(upload_guarded(cache.v_pages_storage));
    indices.emplace(upload_guarded(cache.page_indices));
    q.emplace(upload_guarded(q_host.storage));
    const int64_t batch = static_cast<int64_t>(kv_lens.size());
    o.emplace(static_cast<size_t>(batch * qo_heads * head_dim) * 2);
    lse.emplace(static_cast<size_t>(batch * qo_heads) * 4);
    pages = {k->view_of(cache.paged.k, cache.pages_storage),
             v->view_of(cache.paged.v, cache.v_pages_storage), cache.paged.layout,
             indices->view_of(cache.page_indices.view(), cache.page_indices)};
    q_view = q->view_of(q_host.view, q_host.storage);
    o_view = TensorView::contiguous(o->data(), DType::kBF16, {batch, qo_heads, head_dim},
                                    Device::cuda(0));
    lse_view = TensorView::contiguous(lse->data(), DType::kF32, {batch, qo_heads}, Device::cuda(0));
  }

  static testing::TestKVCache build(const std::vector<int32_t>& kv_lens, int64_t kv_heads,
                                    int64_t head_dim, int page_size) {
    testing::KVCacheSpec spec;
    spec.kv_lens = kv_lens;
    spec.num_kv_heads = kv_heads;
    spec.head_dim_qk = spec.head_dim_vo = head_dim;
    spec.dtype = DType::kBF16;
    spec.page_size = page_size;
    return testing::build_kv_cache(spec);
  }

  // Page-table entry `entry` set to `id` on the device (the host copy keeps the good ids).
  void corrupt(int64_t entry, int32_t id) const {
    cuda::memcpy_htod(static_cast<int32_t*>(indices->data()) + entry, &id, sizeof(id));
  }
  void restore() const { indices->upload(cache.page_indices.data<std::byte>()); }
  void poison_outputs() const {
    cuda::memset_d8_async(o->data(), 0xff, static_cast<size_t>(o_view.numel()) * 2, nullptr);
    cuda::memset_d8_async(lse->data(), 0xff, static_cast<size_t>(lse_view.numel()) * 4, nullptr);
    cuda::device_synchronize();
  }
  bool all_guards_intact() const {
    return k->guards_intact() && v->guards_intact() && indices->guards_intact() &&
           q->guards_intact() && o->guards_intact() && lse->guards_intact();
  }
  HostTensor o_host() const {
    HostTensor host(DType::kBF16, {o_view.shape[0], o_view.shape[1], o_view.shape[2]});
    cuda::memcpy_dtoh(host.data<std::byte>(), o->data(), bytes_of(host));
    return host;
  }
  std::vector<int32_t> indptr() const { return testing::int32_values(cache.page_indptr.view()); }
  std::vector<int32_t> last() const { return testing::int32_values(cache.last_page_len.view()); }
};

class IndexSafetyGpu : public ::testing::TestWithParam<bool> {  // the tensor-core loop or not
 protected:
  void SetUp() override {
    FLARE_REQUIRE_GPU();
    cuda::set_device(0);
  }
};

BatchDecodeConfig decode_config(bool tensor_cores, int max_batch) {
  BatchDecodeConfig config;
  config.max_batch = max_batch;
  config.num_qo_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim = 64;
  config.page_size = 16;
  config.use_tensor_cores = tensor_cores;
  return config;
}

TEST_P(IndexSafetyGpu, DecodeSkipsOutOfRangePageIdsAndReportsThem) {
  const GuardedBatch b({40, 0, 300, 17}, 8, 2, 64);
  BatchDecode decode(decode_config(GetParam(), 4));
  decode.plan(b.indptr(), b.last(), nullptr);
  const int64_t pages = b.cache.num_pages();
  const int64_t entry = b.indptr()[2] + 5;  // request 2's sixth page
  for (const int32_t bad : {static_cast<int32_t>(pages + 7), -3, INT32_MAX}) {
    b.corrupt(entry, bad);
    b.poison_outputs();
    decode.run(b.q_view, b.pages, b.o_view, b.lse_view, nullptr);
    cuda::device_synchronize();
    EXPECT_TRUE(b.all_guards_intact()) << "page id " << bad;
    const std::string expected =
        "kv_indices[" + std::to_string(entry) + "] = " + std::to_string(bad) + " (request 2)";
    EXPECT_FLARE_ERROR(decode.check(), ErrorCode::kIndexOutOfRange, expected);
    EXPECT_NO_THROW(decode.check());  // the record was cleared
  }
  // The context is alive and the next correct call is exact.
  b.restore();
  b.poison_outputs();
  decode.run(b.q_view, b.pages, b.o_view, b.lse_view, nullptr);
  cuda::device_synchronize();
  const gpu_testing::Reference ref = reference_decode(b.q_host.view, b.cache, {});
  const testing::ErrorStats err = testing::error_stats(b.o_host().view(), ref.o.view());
  EXPECT_LE(err.max_abs, gpu_testing::kOutputToleranceTensorCores) << err;
  EXPECT_NO_THROW(decode.check());
}

TEST_P(IndexSafetyGpu, DecodeValidationModeThrowsBeforeLaunching) {
  const GuardedBatch b({40, 300}, 8, 2, 64);
  BatchDecodeConfig config = decode_config(GetParam(), 2);
  config.validate_indices = true;
  BatchDecode decode(config);
  decode.plan(b.indptr(), b.last(), nullptr);
  b.corrupt(b.indptr()[1] + 2, -1);
  b.poison_outputs();
  EXPECT_FLARE_ERROR(decode.run(b.q_view, b.pages, b.o_view, b.lse_view, nullptr),
                     ErrorCode::kIndexOutOfRange,
                     "kv_indices[" + std::to_string(b.indptr()[1] + 2) + "] = -1 (request 1)");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(b.o_host().view()), b.o_view.numel());  // nothing launched
}

INSTANTIATE_TEST_SUITE_P(Loops, IndexSafetyGpu, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "TensorCores" : "CudaCores";
                         });

BatchPrefillConfig prefill_config(PrefillKV kv, int max_batch, int max_total_qo) {
  BatchPrefillConfig config;
  config.max_batch = max_batch;
  config.max_total_qo = max_total_qo;
  config.num_qo_heads = 8;
  config.num_kv_heads = 2;
  config.head_dim_qk = config.head_dim_vo = 64;
  config.kv = kv;
  config.page_size = 16;
  config.dtype = DType::kBF16;
  config.params.mask = MaskMode::kCausal;
  return config;
}

// One bad page id: its kv_indices entry, the id, the request that reads it.
struct BadPageId {
  int64_t entry;
  int32_t id;
  int request;
};

// Each bad id in turn: the run writes nothing outside its tensors and check() names the entry,
// the id and the request; with the ids restored, the output matches the reference and check()
// passes.
void expect_bad_page_ids_skipped(BatchPrefill& prefill, const GuardedBatch& b,
                                 const std::vector<BadPageId>& bad_ids) {
  for (const BadPageId& bad : bad_ids) {
    b.corrupt(bad.entry, bad.id);
    b.poison_outputs();
    prefill.run(b.q_view, b.pages, b.o_view, b.lse_view, nullptr);
    cuda::device_synchronize();
    EXPECT_TRUE(b.all_guards_intact()) << "page id " << bad.id;
    EXPECT_FLARE_ERROR(prefill.check(), ErrorCode::kIndexOutOfRange,
                       "kv_indices[" + std::to_string(bad.entry) + "] = " +
                           std::to_string(bad.id) + " (request " + std::to_string(bad.request) +
                           ")");
    b.restore();
  }
  b.poison_outputs();
  prefill.run(b.q_view, b.pages, b.o_view, b.lse_view, nullptr);
  cuda::device_synchronize();
  const gpu_testing::Reference ref = reference_decode(b.q_host.view, b.cache, {});
  const testing::ErrorStats err = testing::error_stats(b.o_host().view(), ref.o.view());
  EXPECT_LE(err.max_abs, 1e-2) << err;
  EXPECT_NO_THROW(prefill.check());
}

TEST(IndexSafetyPrefillGpu, PagedPrefillSkipsOutOfRangePageIdsAndReportsThem) {
  FLARE_REQUIRE_GPU();
  // One query token per request (decode-shaped) keeps the float64 reference small; the
  // prefill kernel's full-tile and tail-tile copies both see the bad ids.
  const GuardedBatch b({200, 35, 0}, 8, 2, 64);
  BatchPrefill prefill(prefill_config(PrefillKV::kPaged, 3, 3));
  const std::vector<int32_t> qo = {0, 1, 2, 3};
  prefill.plan(qo, b.indptr(), b.last(), nullptr);
  const auto pages = static_cast<int32_t>(b.cache.num_pages());
  expect_bad_page_ids_skipped(prefill, b, {{3, pages, 0}, {b.indptr()[1] + 2, -100, 1}});
}

// The Hopper family's bulk copies of pages of 64 rows: a bad id in a tile wholly inside the
// request (copied by boxes) and in a tail tile (gathered) is skipped and recorded alike.
TEST(IndexSafetyPrefillGpu, HopperBulkPagesSkipOutOfRangeIdsAndReportThem) {
  FLARE_REQUIRE_GPU();
  const cuda::DeviceProperties props = cuda::device_properties(0);
  if (props.cc_major != 9 || props.cc_minor != 0) GTEST_SKIP() << "needs an sm_90 GPU";
  const GuardedBatch b({300, 35, 0}, 8, 2, 64, 64);
  BatchPrefillConfig config = prefill_config(PrefillKV::kPaged, 3, 3);
  config.page_size = 64;
  config.backend = PrefillBackend::kFA3;
  BatchPrefill prefill(config);
  const std::vector<int32_t> qo = {0, 1, 2, 3};
  prefill.plan(qo, b.indptr(), b.last(), nullptr);
  ASSERT_TRUE(prefill.last_tiles().warpgroup);
  const auto pages = static_cast<int32_t>(b.cache.num_pages());
  // Entry 1: rows 64-127 of request 0, a whole tile's second box; entry 4: its tail tile;
  // request 1's only page: a tail tile.
  expect_bad_page_ids_skipped(prefill, b, {{1, pages, 0}, {4, -7, 0}, {b.indptr()[1], -100, 1}});
}

TEST(IndexSafetyPrefillGpu, RaggedRowsShortOfTheIndptrAreRejectedBeforeLaunching) {
  FLARE_REQUIRE_GPU();
  const GuardedBatch b({200, 35}, 8, 2, 64);
  BatchPrefill prefill(prefill_config(PrefillKV::kRagged, 2, 2));
  const std::vector<int32_t> qo = {0, 1, 2};
  const std::vector<int32_t> kv = {0, 200, 235};
  prefill.plan(qo, kv, {}, nullptr);
  Guarded k_rows(static_cast<size_t>(234 * 2 * 64) * 2),
      v_rows(static_cast<size_t>(234 * 2 * 64) * 2);
  const TensorView k =
      TensorView::contiguous(k_rows.data(), DType::kBF16, {234, 2, 64}, Device::cuda(0));
  const TensorView v =
      TensorView::contiguous(v_rows.data(), DType::kBF16, {234, 2, 64}, Device::cuda(0));
  b.poison_outputs();
  EXPECT_FLARE_ERROR(
      prefill.run(b.q_view.slice(0, 0, 2), k, v, b.o_view.slice(0, 0, 2), std::nullopt, nullptr),
      ErrorCode::kInvalidArgument, "kv_indptr[2]=235");
  cuda::device_synchronize();
  EXPECT_EQ(testing::count_nan(b.o_host().view()), b.o_view.numel());
  EXPECT_TRUE(k_rows.guards_intact() && v_rows.guards_intact());
}

}  // namespace
}  // namespace flare
