// The NVFP4 quantizing append: checks both paths share, the CPU loop over the host quantizer
// (include/flare/format/nvfp4.h), and the launch of kernels/append_paged_kv_nvfp4.cuh.
#include "flare/api/append_paged_kv_nvfp4.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/format/nvfp4.h"
#include "flare/format/validate.h"
#include "flare/jit/module.h"
#include "kernels/append_paged_kv_nvfp4.cuh"
#include "src/api/append_checks.h"

namespace flare {

namespace {

constexpr auto kInvalid = ErrorCode::kInvalidArgument;

struct Strides3 {
  int64_t page, slot, head;
};
Strides3 page_strides(const TensorView& t, KVLayout layout) {
  return layout == KVLayout::kNHD ? Strides3{t.strides[0], t.strides[1], t.strides[2]}
                                  : Strides3{t.strides[0], t.strides[2], t.strides[1]};
}

// The cache's tensors against each other and the appended rows: returns the page size.
int64_t check_cache(const Nvfp4Pages& c, const TensorView& key, const TensorView& value,
                    int64_t rows_needed) {
  validate_tensor(c.k_codes, "k_cache", 4);
  validate_tensor(c.v_codes, "v_cache", 4);
  validate_tensor(c.k_scales, "k_scale_cache", 4);
  validate_tensor(c.v_scales, "v_scale_cache", 4);
  validate_dtype(c.k_codes, "k_cache", DType::kU8);
  validate_dtype(c.v_codes, "v_cache", DType::kU8);
  validate_dtype(c.k_scales, "k_scale_cache", DType::kE4M3);
  validate_dtype(c.v_scales, "v_scale_cache", DType::kE4M3);
  validate_tensor(key, "append_key", 3);
  validate_tensor(value, "append_value", 3);
  FLARE_CHECK(key.dtype == DType::kF16 || key.dtype == DType::kBF16, kInvalid,
              "append_key must be float16 or bfloat16, got ", dtype_name(key.dtype));
  FLARE_CHECK(value.dtype == key.dtype, kInvalid, "append_value must have append_key's dtype ",
              dtype_name(key.dtype), ", got ", dtype_name(value.dtype));
  FLARE_CHECK(key.shape[0] >= rows_needed && value.shape[0] >= rows_needed, kInvalid,
              "append_key and append_value must have at least ", rows_needed, " rows, got ",
              key.shape[0], " and ", value.shape[0]);
  const bool nhd = c.layout == KVLayout::kNHD;
  const int64_t pages = c.k_codes.shape[0];
  const int64_t page_size = c.k_codes.shape[nhd ? 1 : 2];
  const int64_t heads = c.k_codes.shape[nhd ? 2 : 1];
  const auto check_tensor = [&](const TensorView& t, const char* name, int64_t dim,
                                const char* what) {
    FLARE_CHECK(t.shape[0] == pages && t.shape[nhd ? 1 : 2] == page_size &&
                    t.shape[nhd ? 2 : 1] == heads && t.shape[3] == dim,
                kInvalid, name, " must have shape ",
                nhd ? "[pages, page_size, H_kv, " : "[pages, H_kv, page_size, ", what,
                "] = ", nhd ? "[" : "[", pages, ", ", nhd ? page_size : heads, ", ",
                nhd ? heads : page_size, ", ", dim,
                "] (k_cache's pages, page size and heads), got ", t.shape_str());
  };
  for (const auto& [rows, name] :
       {std::pair{key, "append_key"}, std::pair{value, "append_value"}}) {
    FLARE_CHECK(rows.shape[1] == heads, kInvalid, name, " must have ", heads,
                " heads (the cache's H_kv), got ", rows.shape[1]);
    FLARE_CHECK(rows.shape[2] % kNvfp4BlockSize == 0 && rows.shape[2] > 0, kInvalid, name,
                "'s head dim must be a positive multiple of 16 (NVFP4 blocks), got ",
                rows.shape[2]);
  }
  check_tensor(c.k_codes, "k_cache", key.shape[2] / 2, "D / 2");
  check_tensor(c.v_codes, "v_cache", value.shape[2] / 2, "D / 2");
  check_tensor(c.k_scales, "k_scale_cache", key.shape[2] / kNvfp4BlockSize, "D / 16");
  check_tensor(c.v_scales, "v_scale_cache", value.shape[2] / kNvfp4BlockSize, "D / 16");
  const Device& device = c.k_codes.device;
  for (const auto& [t, name] :
       {std::pair{c.v_codes, "v_cache"}, std::pair{c.k_scales, "k_scale_cache"},
        std::pair{c.v_scales, "v_scale_cache"}, std::pair{key, "append_key"},
        std::pair{value, "append_value"}}) {
    FLARE_CHECK(t.device == device, kInvalid, name, " must be on ", device.str(),
                " (the device of k_cache), got ", t.device.str());
  }
  FLARE_CHECK(page_size >= 1, kInvalid, "page size must be >= 1, got ", page_size);
  return page_size;
}

void check_scale_tensor(const TensorView& t, const char* name, const Device& device) {
  validate_dtype(t, name, DType::kF32);
  FLARE_CHECK(t.numel() == 1, kInvalid, name, " must hold one float32, got shape ", t.shape_str());
  FLARE_CHECK(t.device == device || t.device.is_cpu(), kInvalid, name, " must be on ", device.str(),
              " (the device of k_cache) or the CPU, got ", t.device.str());
}

float host_scale(const TensorView& t, const char* name) {
  const float scale = *t.ptr<const float>();
  FLARE_CHECK(std::isfinite(scale) && scale > 0.0f, kInvalid, name,
              " must be a positive finite global decode scale, got ", scale);
  return scale;
}

// Quantizes row (token, head) of `rows` into page `page`, slot `slot` of codes / scales.
void quantize_row(const TensorView& rows, int64_t token, int64_t head, const TensorView& codes,
                  const TensorView& scales, KVLayout layout, int64_t page, int64_t slot,
                  float global) {
  const int64_t dim = rows.shape[2];
  const Strides3 cs = page_strides(codes, layout);
  const Strides3 ss = page_strides(scales, layout);
  auto* code_row =
      static_cast<uint8_t*>(codes.data) + page * cs.page + slot * cs.slot + head * cs.head;
  auto* scale_row =
      static_cast<uint8_t*>(scales.data) + page * ss.page + slot * ss.slot + head * ss.head;
  float block[kNvfp4BlockSize];
  uint8_t packed[kNvfp4BlockSize / 2];
  for (int64_t b = 0; b < dim / kNvfp4BlockSize; ++b) {
    for (int i = 0; i < kNvfp4BlockSize; ++i) {
      block[i] = load_float(rows.data, rows.dtype,
                            token * rows.strides[0] + head * rows.strides[1] +
                                (b * kNvfp4BlockSize + i) * rows.strides[2]);
    }
    nvfp4_quantize_block(block, global, packed, &scale_row[b * scales.strides[3]]);
    for (int i = 0; i < kNvfp4BlockSize / 2; ++i) {
      code_row[(b * kNvfp4BlockSize / 2 + i) * codes.strides[3]] = packed[i];
    }
  }
}

void check_gpu_layout(const Nvfp4Pages& c, const TensorView& key, const TensorView& value) {
  for (const auto& [t, name] :
       {std::pair{c.k_codes, "k_cache"}, std::pair{c.v_codes, "v_cache"},
        std::pair{c.k_scales, "k_scale_cache"}, std::pair{c.v_scales, "v_scale_cache"},
        std::pair{key, "append_key"}, std::pair{value, "append_value"}}) {
    FLARE_CHECK(t.strides[t.ndim - 1] == 1, kInvalid, name,
                " must have a contiguous last dimension on the GPU, got stride ",
                t.strides[t.ndim - 1]);
  }
  for (const auto& [t, name] : {std::pair{c.k_codes, "k_cache"}, std::pair{c.v_codes, "v_cache"}}) {
    const bool aligned = reinterpret_cast<uintptr_t>(t.data) % 8 == 0 && t.strides[0] % 8 == 0 &&
                         t.strides[1] % 8 == 0 && t.strides[2] % 8 == 0;
    FLARE_CHECK(aligned, kInvalid, name,
                " must be 8-byte aligned with strides of multiples of 8 bytes on the GPU (one "
                "block's codes are one 8-byte store), got strides ",
                t.strides[0], ", ", t.strides[1], ", ", t.strides[2]);
  }
  for (const auto& [t, name] : {std::pair{key, "append_key"}, std::pair{value, "append_value"}}) {
    FLARE_CHECK(reinterpret_cast<uintptr_t>(t.data) % 2 == 0, kInvalid, name,
                " must be 2-byte aligned");
  }
}

void fill_common(AppendNvfp4Params& p, const Nvfp4Pages& c, const TensorView& key,
                 const TensorView& value, const Nvfp4GlobalScales& scales, int64_t nnz,
                 int64_t page_size) {
  const auto three = [](int64_t(&out)[3], const Strides3& s, int64_t element) {
    out[0] = s.page * element;
    out[1] = s.slot * element;
    out[2] = s.head * element;
  };
  p.k_codes = static_cast<unsigned char*>(c.k_codes.data);
  p.v_codes = static_cast<unsigned char*>(c.v_codes.data);
  p.k_scales = static_cast<unsigned char*>(c.k_scales.data);
  p.v_scales = static_cast<unsigned char*>(c.v_scales.data);
  p.append_k = static_cast<const unsigned char*>(key.data);
  p.append_v = static_cast<const unsigned char*>(value.data);
  // A scale on the CPU goes by value, checked here; one on the device is read (and checked)
  // by the kernel.
  if (scales.k.device.is_cpu()) {
    p.k_global_value = host_scale(scales.k, "k_scale");
  } else {
    p.k_global = scales.k.ptr<const float>();
  }
  if (scales.v.device.is_cpu()) {
    p.v_global_value = host_scale(scales.v, "v_scale");
  } else {
    p.v_global = scales.v.ptr<const float>();
  }
  three(p.k_code_stride, page_strides(c.k_codes, c.layout), 1);
  three(p.v_code_stride, page_strides(c.v_codes, c.layout), 1);
  three(p.k_scale_stride, page_strides(c.k_scales, c.layout), 1);
  three(p.v_scale_stride, page_strides(c.v_scales, c.layout), 1);
  p.append_k_stride[0] = key.strides[0] * 2;
  p.append_k_stride[1] = key.strides[1] * 2;
  p.append_v_stride[0] = value.strides[0] * 2;
  p.append_v_stride[1] = value.strides[1] * 2;
  p.nnz = nnz;
  p.k_blocks = static_cast<int32_t>(key.shape[2] / kNvfp4BlockSize);
  p.v_blocks = static_cast<int32_t>(value.shape[2] / kNvfp4BlockSize);
  p.num_heads = static_cast<int32_t>(key.shape[1]);
  p.page_size = static_cast<int32_t>(page_size);
  p.num_pages = static_cast<int32_t>(c.k_codes.shape[0]);
  p.bf16 = key.dtype == DType::kBF16 ? 1 : 0;
}

void launch(AppendNvfp4Params& p, const Device& device, cuda::Stream stream) {
  const cuda::DeviceScope scope(device.index);
  p.index_error = append_index_errors(device.index).device_record();
  const jit::KernelSpec spec = append_paged_kv_nvfp4_kernel_spec();
  const cuda::Function function = jit::get_kernel(spec, spec.entry, device.index);
  const int64_t blocks_of_16 =
      std::max<int64_t>(1, p.nnz * p.num_heads * (p.k_blocks + p.v_blocks));
  constexpr int64_t kMaxBlocks = 8192;
  const auto grid = static_cast<unsigned>(std::min<int64_t>(
      kMaxBlocks, (blocks_of_16 + kAppendNvfp4Threads - 1) / kAppendNvfp4Threads));
  void* args[] = {&p};
  cuda::launch(function, grid, 1, 1, kAppendNvfp4Threads, 1, 1, 0, stream, args);
}

void check_pages_fit_int32(const Nvfp4Pages& c, int64_t page_size) {
  FLARE_CHECK(c.k_codes.shape[0] <= INT32_MAX && page_size <= INT32_MAX, kInvalid,
              "the KV cache's pages and page size must fit int32, got ", c.k_codes.shape_str());
}

}  // namespace

void append_paged_kv_nvfp4(const AppendPagedKVInput& input, const Nvfp4Pages& cache,
                           const BlockSparseIndex& table, const Nvfp4GlobalScales& scales,
                           cuda::Stream stream) {
  const int64_t nnz = input.append_key.shape[0];
  const int64_t page_size = check_cache(cache, input.append_key, input.append_value, nnz);
  FLARE_CHECK(input.append_value.shape[0] == nnz, kInvalid, "append_value must have ", nnz,
              " tokens (append_key's), got ", input.append_value.shape[0]);
  for (const auto& [t, name] :
       {std::pair{input.batch_indices, "batch_indices"}, std::pair{input.positions, "positions"}}) {
    validate_dtype(t, name, DType::kI32);
    FLARE_CHECK(t.ndim == 1 && t.shape[0] == nnz, kInvalid, name, " must be 1-D with ", nnz,
                " entries (append_key's tokens), got shape ", t.shape_str());
  }
  const Device device = cache.k_codes.device;
  check_scale_tensor(scales.k, "k_scale", device);
  check_scale_tensor(scales.v, "v_scale", device);
  if (device.is_cpu()) {
    // Every index first (as append_paged_kv_cpu): nothing written on bad input.
    validate_page_table(table, cache.k_codes.shape[0], page_size);
    api_detail::check_append_tokens(input.batch_indices, input.positions, table, page_size);
    const float k_global = host_scale(scales.k, "k_scale");
    const float v_global = host_scale(scales.v, "v_scale");
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t request = api_detail::host_index_entry(input.batch_indices, i);
      if (request < 0) continue;
      const int64_t pos = api_detail::host_index_entry(input.positions, i);
      const int64_t page = api_detail::append_page(table, request, pos, page_size);
      for (int64_t head = 0; head < input.append_key.shape[1]; ++head) {
        quantize_row(input.append_key, i, head, cache.k_codes, cache.k_scales, cache.layout, page,
                     pos % page_size, k_global);
        quantize_row(input.append_value, i, head, cache.v_codes, cache.v_scales, cache.layout, page,
                     pos % page_size, v_global);
      }
    }
    return;
  }
  FLARE_CHECK(device.is_cuda(), kInvalid, "append_paged_kv_nvfp4: unsupported device ",
              device.str());
  check_gpu_layout(cache, input.append_key, input.append_value);
  for (const auto& [t, name] :
       {std::pair{input.batch_indices, "batch_indices"}, std::pair{input.positions, "positions"},
        std::pair{table.indptr, "kv_indptr"}, std::pair{table.indices, "kv_indices"}}) {
    api_detail::check_contiguous_index(t, name);
    FLARE_CHECK(t.device == device, kInvalid, name, " must be on ", device.str(), ", got ",
                t.device.str());
  }
  FLARE_CHECK(table.indptr.shape[0] >= 1, kInvalid,
              "kv_indptr must have at least 1 entry (batch + 1), got 0");
  check_pages_fit_int32(cache, page_size);
  if (nnz == 0 || input.append_key.shape[1] == 0) return;
  AppendNvfp4Params p{};
  fill_common(p, cache, input.append_key, input.append_value, scales, nnz, page_size);
  p.batch_indices = input.batch_indices.ptr<const int32_t>();
  p.positions = input.positions.ptr<const int32_t>();
  p.kv_indptr = table.indptr.ptr<const int32_t>();
  p.kv_indices = table.indices.ptr<const int32_t>();
  p.num_indices = table.indices.shape[0];
  p.batch = static_cast<int32_t>(table.indptr.shape[0] - 1);
  launch(p, device, stream);
}

void append_paged_kv_nvfp4_by_slot(const SlotAppendInput& input, const Nvfp4Pages& cache,
                                   const Nvfp4GlobalScales& scales, cuda::Stream stream) {
  const TensorView& slots = input.slot_mapping;
  FLARE_CHECK(slots.dtype == DType::kI32 || slots.dtype == DType::kI64, kInvalid,
              "slot_mapping must be int32 or int64, got ", dtype_name(slots.dtype));
  FLARE_CHECK(slots.ndim == 1, kInvalid, "slot_mapping must be 1-D, got shape ", slots.shape_str());
  const int64_t nnz = slots.shape[0];
  const int64_t page_size = check_cache(cache, input.append_key, input.append_value, nnz);
  const Device device = cache.k_codes.device;
  FLARE_CHECK(slots.device == device, kInvalid, "slot_mapping must be on ", device.str(), ", got ",
              slots.device.str());
  check_scale_tensor(scales.k, "k_scale", device);
  check_scale_tensor(scales.v, "v_scale", device);
  const int64_t capacity = cache.k_codes.shape[0] * page_size;
  const auto slot = [&](int64_t i) {
    return slots.dtype == DType::kI32
               ? static_cast<int64_t>(slots.ptr<const int32_t>()[i * slots.strides[0]])
               : slots.ptr<const int64_t>()[i * slots.strides[0]];
  };
  if (device.is_cpu()) {
    const float k_global = host_scale(scales.k, "k_scale");
    const float v_global = host_scale(scales.v, "v_scale");
    for (int64_t i = 0; i < nnz; ++i) {
      FLARE_CHECK(slot(i) < capacity, kInvalid, "slot_mapping[", i, "]=", slot(i),
                  " is past the KV cache's ", capacity, " slots (pages x page size)");
    }
    for (int64_t i = 0; i < nnz; ++i) {
      const int64_t s = slot(i);
      if (s < 0) continue;
      for (int64_t head = 0; head < input.append_key.shape[1]; ++head) {
        quantize_row(input.append_key, i, head, cache.k_codes, cache.k_scales, cache.layout,
                     s / page_size, s % page_size, k_global);
        quantize_row(input.append_value, i, head, cache.v_codes, cache.v_scales, cache.layout,
                     s / page_size, s % page_size, v_global);
      }
    }
    return;
  }
  FLARE_CHECK(device.is_cuda(), kInvalid, "append_paged_kv_nvfp4_by_slot: unsupported device ",
              device.str());
  check_gpu_layout(cache, input.append_key, input.append_value);
  FLARE_CHECK(nnz <= 1 || slots.strides[0] == 1, kInvalid,
              "slot_mapping must be contiguous on the GPU, got stride ", slots.strides[0]);
  check_pages_fit_int32(cache, page_size);
  if (nnz == 0 || input.append_key.shape[1] == 0) return;
  AppendNvfp4Params p{};
  fill_common(p, cache, input.append_key, input.append_value, scales, nnz, page_size);
  p.slot_mapping = slots.data;
  p.slot_mapping_64 = slots.dtype == DType::kI64 ? 1 : 0;
  launch(p, device, stream);
}

jit::KernelSpec append_paged_kv_nvfp4_kernel_spec() {
  jit::KernelSpec spec;
  spec.family_header = "append_paged_kv_nvfp4.cuh";
  spec.entry = "flare_append_paged_kv_nvfp4";
  spec.label = "append_paged_kv_nvfp4";
  return spec;
}

}  // namespace flare
