// Appending tokens to a paged KV cache: the checks both paths share, the CPU copy loop, and the
// launch of kernels/append_paged_kv.cuh (vector width chosen from pointer and stride alignment).
#include "flare/api/append_paged_kv.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "flare/core/error.h"
#include "flare/format/validate.h"
#include "flare/jit/module.h"
#include "kernels/append_paged_kv.cuh"
#include "src/api/append_checks.h"

namespace flare {

namespace {

constexpr auto kInvalid = ErrorCode::kInvalidArgument;

void check_index_array(const TensorView& array, const char* name, int64_t expected_size) {
  validate_dtype(array, name, DType::kI32);
  FLARE_CHECK(array.ndim == 1, kInvalid, name, " must be 1-D, got shape ", array.shape_str());
  FLARE_CHECK(array.shape[0] == expected_size, kInvalid, name, " must have ", expected_size,
              " entries (append_key's tokens), got ", array.shape[0]);
}

void check_same_device(const TensorView& t, const char* name, const Device& device) {
  FLARE_CHECK(t.device == device, kInvalid, name, " must be on ", device.str(),
              " (the device of the KV cache), got ", t.device.str());
}

// Shapes, dtypes and devices of the tokens against the cache; the cache's own page tensors.
void check_shapes(const AppendPagedKVInput& input, const PagedKV& cache) {
  validate_tensor(cache.k, "k_cache", 4);
  validate_tensor(cache.v, "v_cache", 4);
  validate_tensor(input.append_key, "append_key", 3);
  validate_tensor(input.append_value, "append_value", 3);
  const int64_t nnz = input.append_key.shape[0];
  FLARE_CHECK(input.append_value.shape[0] == nnz, kInvalid, "append_value must have ", nnz,
              " tokens (append_key's), got ", input.append_value.shape[0]);
  check_index_array(input.batch_indices, "batch_indices", nnz);
  check_index_array(input.positions, "positions", nnz);
  validate_dtype(input.append_key, "append_key", cache.k.dtype);
  validate_dtype(input.append_value, "append_value", cache.v.dtype);

  const bool nhd = cache.layout == KVLayout::kNHD;
  const int64_t heads = cache.num_kv_heads();
  FLARE_CHECK(cache.v.shape[0] == cache.k.shape[0] &&
                  cache.v.shape[nhd ? 1 : 2] == cache.page_size() &&
                  cache.v.shape[nhd ? 2 : 1] == heads,
              kInvalid, "v_cache must have the pages, page size and heads of k_cache (",
              cache.k.shape_str(), "), got ", cache.v.shape_str());
  FLARE_CHECK(input.append_key.shape[1] == heads, kInvalid, "append_key must have ", heads,
              " heads (the cache's H_kv), got ", input.append_key.shape[1]);
  FLARE_CHECK(input.append_value.shape[1] == heads, kInvalid, "append_value must have ", heads,
              " heads (the cache's H_kv), got ", input.append_value.shape[1]);
  FLARE_CHECK(input.append_key.shape[2] == cache.head_dim_qk(), kInvalid,
              "append_key must have head dim ", cache.head_dim_qk(), " (k_cache's), got ",
              input.append_key.shape[2]);
  FLARE_CHECK(input.append_value.shape[2] == cache.head_dim_vo(), kInvalid,
              "append_value must have head dim ", cache.head_dim_vo(), " (v_cache's), got ",
              input.append_value.shape[2]);

  const Device& device = cache.k.device;
  check_same_device(cache.v, "v_cache", device);
  check_same_device(input.append_key, "append_key", device);
  check_same_device(input.append_value, "append_value", device);
  check_same_device(input.batch_indices, "batch_indices", device);
  check_same_device(input.positions, "positions", device);
  check_same_device(cache.table.indptr, "kv_indptr", device);
  check_same_device(cache.table.indices, "kv_indices", device);
}

// Slot and head strides of a page tensor in its layout.
struct PageStrides {
  int64_t page;
  int64_t slot;
  int64_t head;
};

PageStrides page_strides(const TensorView& pages, KVLayout layout) {
  return layout == KVLayout::kNHD
             ? PageStrides{pages.strides[0], pages.strides[1], pages.strides[2]}
             : PageStrides{pages.strides[0], pages.strides[2], pages.strides[1]};
}

void copy_row(const TensorView& src, int64_t token, int64_t head, const TensorView& pages,
              KVLayout layout, int64_t page, int64_t slot) {
  const size_t element = dtype_bytes(src.dtype);
  const PageStrides strides = page_strides(pages, layout);
  const auto* from = static_cast<const std::byte*>(src.data) +
                     (token * src.strides[0] + head * src.strides[1]) * element;
  auto* to = static_cast<std::byte*>(pages.data) +
             (page * strides.page + slot * strides.slot + head * strides.head) * element;
  std::memcpy(to, from, static_cast<size_t>(src.shape[2]) * element);
}

// The widest vector (bytes, <= 16) that divides every address and byte stride the kernel uses.
int vector_bytes(const AppendPagedKVInput& input, const PagedKV& cache) {
  const auto element = static_cast<int64_t>(dtype_bytes(cache.k.dtype));
  const PageStrides k = page_strides(cache.k, cache.layout);
  const PageStrides v = page_strides(cache.v, cache.layout);
  const int64_t quantities[] = {
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(cache.k.data)),
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(cache.v.data)),
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(input.append_key.data)),
      static_cast<int64_t>(reinterpret_cast<uintptr_t>(input.append_value.data)),
      k.page * element,
      k.slot * element,
      k.head * element,
      v.page * element,
      v.slot * element,
      v.head * element,
      input.append_key.strides[0] * element,
      input.append_key.strides[1] * element,
      input.append_value.strides[0] * element,
      input.append_value.strides[1] * element,
      cache.head_dim_qk() * element,
      cache.head_dim_vo() * element};
  int bytes = 16;
  for (int64_t q : quantities) {
    while (q % bytes != 0) bytes /= 2;
  }
  return bytes;
}

}  // namespace

void append_paged_kv_cpu(const AppendPagedKVInput& input, const PagedKV& cache) {
  FLARE_CHECK(cache.k.device.is_cpu(), kInvalid,
              "append_paged_kv_cpu needs the KV cache on the CPU, got ", cache.k.device.str());
  check_shapes(input, cache);
  validate_paged_kv(cache);

  const int64_t nnz = input.append_key.shape[0];
  const int64_t page_size = cache.page_size();
  api_detail::check_append_tokens(input.batch_indices, input.positions, cache.table, page_size);

  const int64_t heads = cache.num_kv_heads();
  for (int64_t i = 0; i < nnz; ++i) {
    const int64_t request = api_detail::host_index_entry(input.batch_indices, i);
    if (request < 0) continue;
    const int64_t pos = api_detail::host_index_entry(input.positions, i);
    const int64_t page = api_detail::append_page(cache.table, request, pos, page_size);
    for (int64_t head = 0; head < heads; ++head) {
      copy_row(input.append_key, i, head, cache.k, cache.layout, page, pos % page_size);
      copy_row(input.append_value, i, head, cache.v, cache.layout, page, pos % page_size);
    }
  }
}

void append_paged_kv_cuda(const AppendPagedKVInput& input, const PagedKV& cache,
                          cuda::Stream stream) {
  const Device device = cache.k.device;
  FLARE_CHECK(device.is_cuda(), kInvalid,
              "append_paged_kv_cuda needs the KV cache on a CUDA device, got ", device.str());
  check_shapes(input, cache);
  api_detail::check_contiguous_index(input.batch_indices, "batch_indices");
  api_detail::check_contiguous_index(input.positions, "positions");
  api_detail::check_contiguous_index(cache.table.indptr, "kv_indptr");
  api_detail::check_contiguous_index(cache.table.indices, "kv_indices");
  FLARE_CHECK(cache.table.indptr.shape[0] >= 1, kInvalid,
              "kv_indptr must have at least 1 entry (batch + 1), got 0");

  const int64_t nnz = input.append_key.shape[0];
  const int64_t heads = cache.num_kv_heads();
  if (nnz == 0 || heads == 0) return;
  const int64_t int32_max = INT32_MAX;
  FLARE_CHECK(cache.num_pages() <= int32_max && cache.page_size() <= int32_max, kInvalid,
              "the KV cache's pages and page size must fit int32, got ", cache.k.shape_str());

  const auto element = static_cast<int64_t>(dtype_bytes(cache.k.dtype));
  const PageStrides k = page_strides(cache.k, cache.layout);
  const PageStrides v = page_strides(cache.v, cache.layout);
  AppendPagedKVParams params{};
  params.k_pages = static_cast<char*>(cache.k.data);
  params.v_pages = static_cast<char*>(cache.v.data);
  params.append_k = static_cast<const char*>(input.append_key.data);
  params.append_v = static_cast<const char*>(input.append_value.data);
  params.batch_indices = input.batch_indices.ptr<const int32_t>();
  params.positions = input.positions.ptr<const int32_t>();
  params.kv_indptr = cache.table.indptr.ptr<const int32_t>();
  params.kv_indices = cache.table.indices.ptr<const int32_t>();
  params.num_indices = cache.table.indices.shape[0];
  params.k_page_stride = k.page * element;
  params.k_slot_stride = k.slot * element;
  params.k_head_stride = k.head * element;
  params.v_page_stride = v.page * element;
  params.v_slot_stride = v.slot * element;
  params.v_head_stride = v.head * element;
  params.append_k_token_stride = input.append_key.strides[0] * element;
  params.append_k_head_stride = input.append_key.strides[1] * element;
  params.append_v_token_stride = input.append_value.strides[0] * element;
  params.append_v_head_stride = input.append_value.strides[1] * element;
  params.k_row_bytes = cache.head_dim_qk() * element;
  params.v_row_bytes = cache.head_dim_vo() * element;
  params.nnz = nnz;
  params.num_heads = static_cast<int32_t>(heads);
  params.page_size = static_cast<int32_t>(cache.page_size());
  params.batch = static_cast<int32_t>(cache.table.indptr.shape[0] - 1);
  params.num_pages = static_cast<int32_t>(cache.num_pages());

  const int vec = vector_bytes(input, cache);
  const jit::KernelSpec spec = append_paged_kv_kernel_spec(vec);
  const cuda::DeviceScope scope(device.index);
  params.index_error = append_index_errors(device.index).device_record();
  const cuda::Function function = jit::get_kernel(spec, spec.entry, device.index);
  const int64_t vectors = nnz * heads * (params.k_row_bytes + params.v_row_bytes) / vec;
  // Enough blocks to fill any GPU several times over; the grid-stride loop covers the rest.
  constexpr int64_t kMaxBlocks = 8192;
  const auto blocks = static_cast<unsigned>(
      std::min<int64_t>(kMaxBlocks, (vectors + kAppendThreads - 1) / kAppendThreads));
  void* args[] = {&params};
  cuda::launch(function, blocks, 1, 1, kAppendThreads, 1, 1, 0, stream, args);
}

const IndexErrorRecordBuffer& append_index_errors(int device) {
  // One record per device for the process's life; created on first use (under the caller's
  // DeviceScope), never moved.
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<IndexErrorRecordBuffer>> records;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<IndexErrorRecordBuffer>& record = records[device];
  if (!record) record = std::make_unique<IndexErrorRecordBuffer>(device);
  return *record;
}

void check_append_paged_kv(int device, const IndexNames& names) {
  append_index_errors(device).check(names);
}

jit::KernelSpec append_paged_kv_kernel_spec(int vector_bytes) {
  FLARE_CHECK(vector_bytes == 1 || vector_bytes == 2 || vector_bytes == 4 || vector_bytes == 8 ||
                  vector_bytes == 16,
              kInvalid, "append_paged_kv vector width must be 1, 2, 4, 8 or 16 bytes, got ",
              vector_bytes);
  jit::KernelSpec spec;
  spec.family_header = "append_paged_kv.cuh";
  spec.entry = "flare_append_paged_kv";
  spec.defines = {{"FLARE_APPEND_VEC_BYTES", std::to_string(vector_bytes)}};
  spec.label = "append_paged_kv vec=" + std::to_string(vector_bytes) + "B";
  return spec;
}

void append_paged_kv(const AppendPagedKVInput& input, const PagedKV& cache, cuda::Stream stream) {
  if (cache.k.device.is_cuda()) {
    append_paged_kv_cuda(input, cache, stream);
  } else {
    append_paged_kv_cpu(input, cache);
  }
}

}  // namespace flare
