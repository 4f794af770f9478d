// The NVFP4 quantizing append on the CPU: every appended row lands quantized (bit for bit as
// nvfp4_quantize_block defines it) in the slot its page table or slot names, nothing else
// changes, bad input is rejected before anything is written; the kernel compiles for the
// shipped architectures without spills.
#include "flare/api/append_paged_kv_nvfp4.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "flare/core/dtype.h"
#include "flare/format/nvfp4.h"
#include "flare/jit/compiler.h"
#include "testing/expect_error.h"
#include "testing/index_arrays.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare {
namespace {

constexpr uint8_t kSentinel = 0x5A;
constexpr int64_t kPages = 6, kPageSize = 3, kHeads = 2, kDimK = 32, kDimV = 64;

struct Cache {
  KVLayout layout;
  HostTensor k_codes, v_codes, k_scales, v_scales;
  Cache(KVLayout l)
      : layout(l),
        k_codes(DType::kU8, shape(l, kDimK / 2)),
        v_codes(DType::kU8, shape(l, kDimV / 2)),
        k_scales(DType::kE4M3, shape(l, kDimK / 16)),
        v_scales(DType::kE4M3, shape(l, kDimV / 16)) {
    for (const HostTensor* t : {&k_codes, &v_codes, &k_scales, &v_scales}) {
      std::memset(t->view().data, kSentinel, static_cast<size_t>(t->view().numel()));
    }
  }
  static std::vector<int64_t> shape(KVLayout l, int64_t last) {
    return l == KVLayout::kNHD ? std::vector<int64_t>{kPages, kPageSize, kHeads, last}
                               : std::vector<int64_t>{kPages, kHeads, kPageSize, last};
  }
  Nvfp4Pages pages() const {
    return {k_codes.view(), v_codes.view(), k_scales.view(), v_scales.view(), layout};
  }
  // Byte `i` of the row (page, slot, head) of t.
  static uint8_t at(const HostTensor& t, KVLayout l, int64_t page, int64_t slot, int64_t head,
                    int64_t i) {
    const TensorView v = t.view();
    const int64_t offset = l == KVLayout::kNHD
                               ? page * v.strides[0] + slot * v.strides[1] + head * v.strides[2]
                               : page * v.strides[0] + head * v.strides[1] + slot * v.strides[2];
    return static_cast<const uint8_t*>(v.data)[offset + i];
  }
};

// Row (token, head) of `rows` quantized as the format defines it.
void expected_row(const HostTensor& rows, int64_t token, int64_t head, float global,
                  std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
  const TensorView r = rows.view();
  const int64_t dim = r.shape[2];
  codes.assign(dim / 2, 0);
  scales.assign(dim / 16, 0);
  for (int64_t b = 0; b < dim / 16; ++b) {
    float x[16];
    for (int i = 0; i < 16; ++i) {
      x[i] = load_float(r.data, r.dtype, token * r.strides[0] + head * r.strides[1] + b * 16 + i);
    }
    nvfp4_quantize_block(x, global, &codes[b * 8], &scales[b]);
  }
}

// Checks every byte of the cache: the slots in `written` hold their token's quantized rows,
// every other byte the sentinel.
void expect_cache(const Cache& c, const HostTensor& key, const HostTensor& value,
                  const std::vector<std::pair<int64_t, int64_t>>& slot_of_token,  // (page, slot)
                  float k_global, float v_global) {
  std::vector<uint8_t> codes, scales;
  for (int64_t page = 0; page < kPages; ++page) {
    for (int64_t slot = 0; slot < kPageSize; ++slot) {
      int64_t token = -1;
      for (size_t t = 0; t < slot_of_token.size(); ++t) {
        if (slot_of_token[t] == std::pair{page, slot}) token = static_cast<int64_t>(t);
      }
      for (int64_t head = 0; head < kHeads; ++head) {
        for (const bool is_k : {true, false}) {
          const HostTensor& code_t = is_k ? c.k_codes : c.v_codes;
          const HostTensor& scale_t = is_k ? c.k_scales : c.v_scales;
          const int64_t dim = is_k ? kDimK : kDimV;
          if (token >= 0)
            expected_row(is_k ? key : value, token, head, is_k ? k_global : v_global, codes,
                         scales);
          for (int64_t i = 0; i < dim / 2; ++i) {
            EXPECT_EQ(Cache::at(code_t, c.layout, page, slot, head, i),
                      token >= 0 ? codes[i] : kSentinel)
                << (is_k ? "k" : "v") << " codes page " << page << " slot " << slot << " head "
                << head << " byte " << i;
          }
          for (int64_t i = 0; i < dim / 16; ++i) {
            EXPECT_EQ(Cache::at(scale_t, c.layout, page, slot, head, i),
                      token >= 0 ? scales[i] : kSentinel)
                << (is_k ? "k" : "v") << " scales page " << page << " slot " << slot;
          }
        }
      }
    }
  }
}

HostTensor float_scalar(float x) {
  HostTensor t(DType::kF32, {1});
  *static_cast<float*>(t.view().data) = x;
  return t;
}

class Nvfp4AppendCpu : public ::testing::TestWithParam<std::tuple<KVLayout, DType>> {};

TEST_P(Nvfp4AppendCpu, BatchIndicesAndPositionsThroughThePageTable) {
  const auto [layout, dtype] = GetParam();
  Cache cache(layout);
  // Two requests: pages {4, 1} and {0}; tokens: request 0 positions 0, 4, request 1 position 2,
  // one padding token (batch index -1).
  HostTensor indptr = testing::int32_tensor({0, 2, 3});
  HostTensor indices = testing::int32_tensor({4, 1, 0});
  HostTensor last = testing::int32_tensor({2, 3});
  const BlockSparseIndex table{kPageSize, indptr.view(), indices.view(), last.view()};
  HostTensor key = testing::random_tensor(dtype, {4, kHeads, kDimK}, 1, 3.0f);
  HostTensor value = testing::random_tensor(dtype, {4, kHeads, kDimV}, 2, 0.02f);
  HostTensor batch = testing::int32_tensor({0, 0, -1, 1});
  HostTensor positions = testing::int32_tensor({0, 4, 0, 2});
  HostTensor k_global = float_scalar(0.5f), v_global = float_scalar(0.01f);
  append_paged_kv_nvfp4({key.view(), value.view(), batch.view(), positions.view()}, cache.pages(),
                        table, {k_global.view(), v_global.view()});
  expect_cache(cache, key, value, {{4, 0}, {1, 1}, {-1, -1}, {0, 2}}, 0.5f, 0.01f);
}

TEST_P(Nvfp4AppendCpu, FlatSlotsInt32AndInt64PaddingAndExtraRows) {
  const auto [layout, dtype] = GetParam();
  for (const DType slot_type : {DType::kI32, DType::kI64}) {
    Cache cache(layout);
    HostTensor key = testing::random_tensor(dtype, {5, kHeads, kDimK}, 3);  // one extra row
    HostTensor value = testing::random_tensor(dtype, {5, kHeads, kDimV}, 4);
    const std::vector<int64_t> slots = {17, -1, 0, 5};
    HostTensor slot_mapping(slot_type, {4});
    for (int i = 0; i < 4; ++i)
      store_float(slot_mapping.view().data, slot_type, i, static_cast<float>(slots[i]));
    HostTensor one = float_scalar(1.0f);
    append_paged_kv_nvfp4_by_slot({key.view(), value.view(), slot_mapping.view()}, cache.pages(),
                                  {one.view(), one.view()});
    expect_cache(cache, key, value, {{5, 2}, {-1, -1}, {0, 0}, {1, 2}}, 1.0f, 1.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(LayoutsAndDtypes, Nvfp4AppendCpu,
                         ::testing::Combine(::testing::Values(KVLayout::kNHD, KVLayout::kHND),
                                            ::testing::Values(DType::kF16, DType::kBF16)),
                         [](const ::testing::TestParamInfo<std::tuple<KVLayout, DType>>& info) {
                           return std::string(kv_layout_name(std::get<0>(info.param))) + "_" +
                                  (std::get<1>(info.param) == DType::kF16 ? "f16" : "bf16");
                         });

TEST(Nvfp4AppendCpuErrors, NamedAndNothingWritten) {
  Cache cache(KVLayout::kNHD);
  HostTensor key = testing::random_tensor(DType::kF16, {2, kHeads, kDimK}, 5);
  HostTensor value = testing::random_tensor(DType::kF16, {2, kHeads, kDimV}, 6);
  HostTensor good = float_scalar(1.0f), zero = float_scalar(0.0f);
  HostTensor slots = testing::int32_tensor({0, int32_t{kPages * kPageSize}});
  const SlotAppendInput past{key.view(), value.view(), slots.view()};
  EXPECT_FLARE_ERROR(append_paged_kv_nvfp4_by_slot(past, cache.pages(), {good.view(), good.view()}),
                     ErrorCode::kInvalidArgument, "slot_mapping[1]=18 is past");
  HostTensor ok_slots = testing::int32_tensor({0, 1});
  const SlotAppendInput ok{key.view(), value.view(), ok_slots.view()};
  EXPECT_FLARE_ERROR(append_paged_kv_nvfp4_by_slot(ok, cache.pages(), {zero.view(), good.view()}),
                     ErrorCode::kInvalidArgument, "k_scale must be a positive finite");
  Nvfp4Pages wrong = cache.pages();
  wrong.v_scales = cache.k_scales.view();  // D / 16 of K, not V
  EXPECT_FLARE_ERROR(append_paged_kv_nvfp4_by_slot(ok, wrong, {good.view(), good.view()}),
                     ErrorCode::kInvalidArgument, "v_scale_cache must have shape");
  HostTensor odd = testing::random_tensor(DType::kF16, {2, kHeads, 24}, 7);
  EXPECT_FLARE_ERROR(append_paged_kv_nvfp4_by_slot({odd.view(), value.view(), ok_slots.view()},
                                                   cache.pages(), {good.view(), good.view()}),
                     ErrorCode::kInvalidArgument, "multiple of 16");
  HostTensor f32 = testing::random_tensor(DType::kF32, {2, kHeads, kDimK}, 8);
  EXPECT_FLARE_ERROR(append_paged_kv_nvfp4_by_slot({f32.view(), value.view(), ok_slots.view()},
                                                   cache.pages(), {good.view(), good.view()}),
                     ErrorCode::kInvalidArgument, "float16 or bfloat16");
  // A position past its request's pages, through the page table.
  HostTensor indptr = testing::int32_tensor({0, 1});
  HostTensor indices = testing::int32_tensor({2});
  HostTensor last = testing::int32_tensor({1});
  const BlockSparseIndex table{kPageSize, indptr.view(), indices.view(), last.view()};
  HostTensor batch = testing::int32_tensor({0, 0});
  HostTensor positions = testing::int32_tensor({1, 3});
  EXPECT_FLARE_ERROR(
      append_paged_kv_nvfp4({key.view(), value.view(), batch.view(), positions.view()},
                            cache.pages(), table, {good.view(), good.view()}),
      ErrorCode::kInvalidArgument, "positions[1]=3 is outside request 0");
  expect_cache(cache, key, value, {}, 1.0f, 1.0f);  // every byte still the sentinel
}

class Nvfp4AppendKernelCompiles : public ::testing::TestWithParam<const char*> {};

TEST_P(Nvfp4AppendKernelCompiles, WithoutSpills) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const jit::KernelSpec spec = append_paged_kv_nvfp4_kernel_spec();
  const jit::CompiledKernel compiled = jit::compile(spec, GetParam());
  ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
  testing::expect_shipped_usage(compiled, spec.label + " on " + GetParam());
}

INSTANTIATE_TEST_SUITE_P(Archs, Nvfp4AppendKernelCompiles, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare
