// append_paged_kv_cuda against the CPU version: the same case (tests/testing/append_kv_case.h)
// appended on the GPU gives the complete cache byte for byte, for every layout, dtype and
// vector width; out-of-range tokens are skipped without writing and recorded for
// check_append_paged_kv. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "flare/api/append_paged_kv.h"
#include "flare/jit/cuda_driver.h"
#include "testing/append_kv_case.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

using testing::AppendCase;
using testing::make_append_case;

// A host buffer's bytes on the device.
struct DeviceCopy {
  cuda::DeviceBuffer buffer;

  explicit DeviceCopy(const HostTensor& host)
      : buffer(std::max<size_t>(1, AppendCase::storage_bytes(host))) {
    if (AppendCase::storage_bytes(host) > 0) {
      cuda::memcpy_htod(buffer.data(), host.data<std::byte>(), AppendCase::storage_bytes(host));
    }
  }
  TensorView view_of(const TensorView& host_view, const HostTensor& host) const {
    return testing::rebase_view(host_view, host.data<std::byte>(), buffer.data(), Device::cuda(0));
  }
  void copy_back(HostTensor& host) const {
    if (AppendCase::storage_bytes(host) > 0) {
      cuda::memcpy_dtoh(host.data<std::byte>(), buffer.data(), AppendCase::storage_bytes(host));
    }
  }
};

// Runs c's append on device 0 and copies the pages back into c.target's storage.
void append_on_gpu(AppendCase& c, bool combined) {
  const DeviceCopy k_pages(c.target_k_storage);
  const DeviceCopy v_pages(c.target_v_storage);
  const DeviceCopy append_k(c.append_k_storage);
  const DeviceCopy append_v(c.append_v_storage);
  const DeviceCopy batch_indices(c.batch_indices);
  const DeviceCopy positions(c.positions);
  const DeviceCopy indptr(c.complete.page_indptr);
  const DeviceCopy indices(c.complete.page_indices);
  const DeviceCopy last_page_len(c.complete.last_page_len);

  PagedKV cache = c.target;
  cache.k = k_pages.view_of(c.target.k, c.target_k_storage);
  cache.v = combined ? k_pages.view_of(c.target.v, c.target_k_storage)
                     : v_pages.view_of(c.target.v, c.target_v_storage);
  cache.table.indptr = indptr.view_of(cache.table.indptr, c.complete.page_indptr);
  cache.table.indices = indices.view_of(cache.table.indices, c.complete.page_indices);
  cache.table.last_block_len =
      last_page_len.view_of(cache.table.last_block_len, c.complete.last_page_len);
  const AppendPagedKVInput input{append_k.view_of(c.append_k, c.append_k_storage),
                                 append_v.view_of(c.append_v, c.append_v_storage),
                                 batch_indices.view_of(c.batch_indices.view(), c.batch_indices),
                                 positions.view_of(c.positions.view(), c.positions)};
  append_paged_kv_cuda(input, cache, nullptr);
  cuda::device_synchronize();
  k_pages.copy_back(c.target_k_storage);
  v_pages.copy_back(c.target_v_storage);
}

class AppendPagedKVGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
    cuda::set_device(0);
  }
};

struct GpuCase {
  KVLayout layout;
  int64_t page_size;
  DType dtype;
  int64_t head_dim;  // with the dtype, sets the row size and so the vector width
  bool combined;
  bool strided;
};

TEST_F(AppendPagedKVGpu, MatchesTheCompleteCacheBytewise) {
  const GpuCase cases[] = {
      {KVLayout::kNHD, 16, DType::kBF16, 128, true, false},  // 16-byte vectors
      {KVLayout::kHND, 3, DType::kF16, 64, false, true},
      {KVLayout::kNHD, 1, DType::kE4M3, 64, true, false},
      {KVLayout::kHND, 16, DType::kF32, 4, false, false},    // 16-byte rows
      {KVLayout::kNHD, 3, DType::kF16, 4, false, true},      // 8-byte rows
      {KVLayout::kHND, 1, DType::kE5M2, 2, true, false},     // 2-byte rows
  };
  for (const GpuCase& g : cases) {
    testing::KVCacheSpec spec;
    spec.num_kv_heads = 4;
    spec.head_dim_qk = g.head_dim;
    spec.head_dim_vo = g.head_dim;
    spec.dtype = g.dtype;
    spec.page_size = g.page_size;
    spec.layout = g.layout;
    spec.combined = g.combined;
    spec.strided = g.strided;
    AppendCase c = make_append_case(spec, {0, 5, 0, 96, 7, 1}, {0, 2, 7, 1, 0, 510}, 3);
    append_on_gpu(c, g.combined);
    EXPECT_TRUE(c.target_matches_complete())
        << kv_layout_name(g.layout) << " page " << g.page_size << " " << dtype_name(g.dtype)
        << " D=" << g.head_dim << ": first differing byte " << c.first_difference();
  }
}

TEST_F(AppendPagedKVGpu, SkipsTokensWithOutOfRangeIndices) {
  testing::KVCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.head_dim_qk = 16;
  spec.head_dim_vo = 16;
  spec.page_size = 3;
  AppendCase c = make_append_case(spec, {4, 0, 2}, {3, 5, 1});
  // The complete cache minus one token: that token's indices point outside its pages, at a
  // request that does not exist, or at a negative position; the kernel must skip it and the
  // slot keeps its poison.
  const int64_t token = c.last_appended_token();
  const std::vector<std::byte> poisoned = c.target_bytes();
  for (auto [batch_index, position] : {std::pair{3, 0}, std::pair{0, 1000}, std::pair{1, -1}}) {
    AppendCase bad = make_append_case(spec, {4, 0, 2}, {3, 5, 1});
    bad.batch_indices.data<int32_t>()[token] = batch_index;
    bad.positions.data<int32_t>()[token] = position;
    append_on_gpu(bad, false);
    // The skipped token is recorded, named by its argument, and the record clears.
    EXPECT_FLARE_ERROR(check_append_paged_kv(0), ErrorCode::kIndexOutOfRange,
                       batch_index == 3 ? "batch_indices[" : "positions[");
    EXPECT_NO_THROW(check_append_paged_kv(0));
    AppendCase good_except_token = make_append_case(spec, {4, 0, 2}, {3, 5, 1});
    good_except_token.batch_indices.data<int32_t>()[token] = -1;
    append_paged_kv_cpu(good_except_token.input(), good_except_token.target);
    EXPECT_TRUE(bad.target_bytes() == good_except_token.target_bytes())
        << "batch index " << batch_index << ", position " << position;
    EXPECT_FALSE(bad.target_bytes() == poisoned);
  }
}

}  // namespace
}  // namespace flare
