// `flare attention --device cuda` on prefill and append batches (any query lengths, paged or
// ragged KV): BatchPrefill's o.npy and lse.npy against the in-process float64 reference on the
// same rounded inputs; and the options the GPU prefill does not run, which are named in the
// error (without a CUDA device, its absence is named first). The round trips skip without a
// CUDA device.
//
// The tool NaN-poisons its device outputs and the KV builder NaN-poisons unused pages and
// slots, so a row the kernel never writes, or a key it reads outside a request, fails the
// comparison. Tolerances (unit-variance inputs, as tests/gpu/prefill_test.cpp): o max abs
// <= 2e-2 in bf16 and <= 4e-3 in f16 (o rounded to the dtype, P rounded before P.V); lse
// (float32 on both sides) max abs <= 2e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"
#include "flare/reference/attention.h"
#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"
#include "tools/cli_test_support.h"
#include "tools/flare/npy.h"

namespace flare {
namespace {

using testing::CliResult;
using testing::ScratchDir;

constexpr double kLseMaxAbs = 2e-3;
double output_max_abs(DType dtype) { return dtype == DType::kBF16 ? 2e-2 : 4e-3; }

enum class Mask { kNone, kCausal, kCustomPacked, kCustomBool };

struct PrefillCase {
  std::string name;
  bool paged = true;
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int64_t heads_qo = 8;
  int64_t heads_kv = 2;
  int64_t head_dim_qk = 128;
  int64_t head_dim_vo = 128;
  int64_t page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  DType dtype = DType::kBF16;
  Mask mask = Mask::kCausal;
  int32_t window_left = -1;
  float soft_cap = 0.0f;
  bool alibi = false;
};

void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

HostTensor rounded(const TensorView& values, DType dtype) {
  const HostTensor contiguous = testing::to_contiguous(values);
  HostTensor out(dtype, contiguous.shape());
  for (int64_t i = 0; i < contiguous.numel(); ++i) out.set(i, contiguous.get(i));
  return out;
}

// Random 0/1 bytes (about 60% visible) for every request's q_len x kv_len mask, concatenated,
// and the same bits packed little-endian per request (flare's and FlashInfer's layout).
struct CustomMask {
  HostTensor bools;   // uint8 [sum(q_len * kv_len)]
  HostTensor packed;  // uint8 [mask_indptr[batch]] (at least 1 byte)
  HostTensor indptr;  // int32 [batch + 1], bytes
};

CustomMask random_mask(const std::vector<int32_t>& q_lens, const std::vector<int32_t>& kv_lens,
                       uint64_t seed) {
  std::vector<int32_t> bits, bytes;
  int64_t total_bits = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    bits.push_back(q_lens[i] * kv_lens[i]);
    bytes.push_back((bits.back() + 7) / 8);
    total_bits += bits.back();
  }
  CustomMask mask;
  mask.indptr = testing::indptr_tensor(bytes);
  const std::vector<int32_t> byte_offsets = testing::indptr_values(bytes);
  mask.bools = HostTensor(DType::kU8, {total_bits});
  mask.packed = HostTensor(DType::kU8, {std::max<int64_t>(byte_offsets.back(), 1)});
  std::fill_n(mask.packed.data<uint8_t>(), mask.packed.numel(), uint8_t{0});
  testing::Rng rng(seed);
  int64_t flat = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    for (int32_t b = 0; b < bits[i]; ++b, ++flat) {
      const bool visible = rng.uniform() < 0.6;
      mask.bools.data<uint8_t>()[flat] = visible ? 1 : 0;
      if (visible)
        mask.packed.data<uint8_t>()[byte_offsets[i] + b / 8] |= static_cast<uint8_t>(1u << (b % 8));
    }
  }
  return mask;
}

const char* dtype_flag(DType dtype) { return dtype == DType::kBF16 ? "bf16" : "f16"; }

class AttentionCliCudaPrefill : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(AttentionCliCudaPrefill, MatchesReference) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const PrefillCase& c = GetParam();
  ScratchDir scratch;
  testing::KVCacheSpec spec;
  spec.kv_lens = c.kv_lens;
  spec.num_kv_heads = c.heads_kv;
  spec.head_dim_qk = c.head_dim_qk;
  spec.head_dim_vo = c.head_dim_vo;
  spec.dtype = DType::kF32;  // rounded to c.dtype by the tool (--dtype) and below
  spec.page_size = c.page_size;
  spec.layout = c.layout;
  spec.seed = 51;
  const testing::TestKVCache cache = testing::build_kv_cache(spec);
  const HostTensor qo_indptr = testing::indptr_tensor(c.q_lens);
  const int64_t total_q = testing::indptr_values(c.q_lens).back();
  const HostTensor q =
      testing::random_tensor(DType::kF32, {total_q, c.heads_qo, c.head_dim_qk}, 53);
  const HostTensor k = testing::to_contiguous(c.paged ? cache.paged.k : cache.ragged.k);
  const HostTensor v = testing::to_contiguous(c.paged ? cache.paged.v : cache.ragged.v);
  cli::write_npy(scratch.file("q.npy"), q.view());
  cli::write_npy(scratch.file("k.npy"), k.view());
  cli::write_npy(scratch.file("v.npy"), v.view());
  cli::write_npy(scratch.file("qo.npy"), qo_indptr.view());
  std::vector<std::string> args = {"attention",
                                   "--q",
                                   scratch.file("q.npy"),
                                   "--k",
                                   scratch.file("k.npy"),
                                   "--v",
                                   scratch.file("v.npy"),
                                   "--qo-indptr",
                                   scratch.file("qo.npy"),
                                   "--kv-indptr",
                                   scratch.file("kv_indptr.npy"),
                                   "--dtype",
                                   dtype_flag(c.dtype),
                                   "--device",
                                   "cuda",
                                   "--out-dir",
                                   scratch.file("out")};
  if (c.paged) {
    cli::write_npy(scratch.file("kv_indptr.npy"), cache.page_indptr.view());
    cli::write_npy(scratch.file("indices.npy"), cache.page_indices.view());
    cli::write_npy(scratch.file("last.npy"), cache.last_page_len.view());
    args.insert(args.end(), {"--kv-indices", scratch.file("indices.npy"), "--kv-last-page-len",
                             scratch.file("last.npy"), "--layout", kv_layout_name(c.layout)});
  } else {
    cli::write_npy(scratch.file("kv_indptr.npy"), cache.ragged_indptr.view());
  }

  AttentionParams params;
  const CustomMask mask = random_mask(c.q_lens, c.kv_lens, 57);
  switch (c.mask) {
    case Mask::kNone:
      break;
    case Mask::kCausal:
      params.mask = MaskMode::kCausal;
      args.push_back("--causal");
      break;
    case Mask::kCustomPacked:
    case Mask::kCustomBool:
      params.mask = MaskMode::kCustom;
      params.custom_mask = mask.packed.view();
      params.mask_indptr = mask.indptr.view();
      if (c.mask == Mask::kCustomBool) {
        cli::write_npy(scratch.file("mask.npy"), mask.bools.view(), {.as_bool = true});
      } else {
        cli::write_npy(scratch.file("mask.npy"), mask.packed.view());
        cli::write_npy(scratch.file("mask_indptr.npy"), mask.indptr.view());
        args.insert(args.end(), {"--mask-indptr", scratch.file("mask_indptr.npy")});
      }
      args.insert(args.end(), {"--custom-mask", scratch.file("mask.npy")});
      break;
  }
  if (c.window_left >= 0) {
    params.window_left = c.window_left;
    args.insert(args.end(), {"--window-left", std::to_string(c.window_left)});
  }
  if (c.soft_cap > 0) {
    params.logits_soft_cap = c.soft_cap;
    args.insert(args.end(), {"--soft-cap", std::to_string(c.soft_cap)});
  }
  if (c.alibi) {
    params.pos_encoding = PosEncoding::kAlibi;
    args.push_back("--alibi");
  }
  const CliResult result = testing::run_cli(args, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("cuda:0"), std::string::npos) << result.out;

  const HostTensor q_in = rounded(q.view(), c.dtype);
  const HostTensor k_in = rounded(k.view(), c.dtype);
  const HostTensor v_in = rounded(v.view(), c.dtype);
  KVCache kv;
  if (c.paged) {
    kv = PagedKV::from_separate(k_in.view(), v_in.view(), c.layout, cache.page_indptr.view(),
                                cache.page_indices.view(), cache.last_page_len.view());
  } else {
    kv = RaggedKV{k_in.view(), v_in.view(), cache.ragged_indptr.view()};
  }
  HostTensor o_ref(DType::kF32, {total_q, c.heads_qo, c.head_dim_vo});
  HostTensor lse_ref(DType::kF32, {total_q, c.heads_qo});
  reference_attention(AttentionProblem{q_in.view(), qo_indptr.view(), kv, params},
                      AttentionOutput{o_ref.view(), lse_ref.view()},
                      ReferenceOptions{Accumulation::kF64, 0});
  const cli::NpyArray o = cli::read_npy(scratch.file("out/o.npy"));
  const cli::NpyArray lse = cli::read_npy(scratch.file("out/lse.npy"));
  ASSERT_EQ(o.tensor.shape(), o_ref.shape());
  ASSERT_EQ(lse.tensor.shape(), lse_ref.shape());
  EXPECT_EQ(testing::count_nan(o.tensor.view()), 0) << "rows the kernel never wrote";
  EXPECT_LE(testing::max_abs_error(o.tensor.view(), o_ref.view()), output_max_abs(c.dtype));
  EXPECT_LE(testing::max_abs_error(lse.tensor.view(), lse_ref.view()), kLseMaxAbs);
}

std::vector<PrefillCase> cases() {
  std::vector<PrefillCase> all;
  PrefillCase c;
  // Append (q_len < kv_len), prefill (q_len == kv_len), one token, a request without queries,
  // one without keys (o = 0, lse = -inf); GQA 4, pages of 16.
  c.name = "paged_causal_bf16_gqa4_page16";
  c.q_lens = {1, 7, 0, 97, 33, 3};
  c.kv_lens = {1, 20, 5, 511, 33, 0};
  all.push_back(c);

  c = PrefillCase{};
  c.name = "paged_causal_f16_hnd_page1_gqa1";
  c.q_lens = {7, 1, 64};
  c.kv_lens = {7, 97, 200};
  c.heads_qo = 4;
  c.heads_kv = 4;
  c.head_dim_qk = c.head_dim_vo = 64;
  c.page_size = 1;
  c.layout = KVLayout::kHND;
  c.dtype = DType::kF16;
  all.push_back(c);

  // Decode-shaped (one query token per request) but with a custom mask: the prefill runs it.
  c = PrefillCase{};
  c.name = "paged_one_token_custom_bool_mask_gqa8_page3";
  c.q_lens = {1, 1, 1};
  c.kv_lens = {5, 17, 1};
  c.heads_qo = 8;
  c.heads_kv = 1;
  c.head_dim_qk = c.head_dim_vo = 64;
  c.page_size = 3;
  c.mask = Mask::kCustomBool;
  all.push_back(c);

  c = PrefillCase{};
  c.name = "paged_window_softcap_alibi_bf16_d256_gqa8_page3";
  c.q_lens = {40, 1, 9};
  c.kv_lens = {130, 60, 9};
  c.heads_qo = 8;
  c.heads_kv = 1;
  c.head_dim_qk = c.head_dim_vo = 256;
  c.page_size = 3;
  c.window_left = 31;
  c.soft_cap = 20.0f;
  c.alibi = true;
  all.push_back(c);

  c = PrefillCase{};
  c.name = "ragged_causal_bf16_gqa4";
  c.paged = false;
  c.q_lens = {97, 1, 0, 40, 7};
  c.kv_lens = {97, 300, 9, 511, 0};
  all.push_back(c);

  c = PrefillCase{};
  c.name = "ragged_no_mask_f16_gqa4";
  c.paged = false;
  c.q_lens = {17, 5};
  c.kv_lens = {33, 5};
  c.head_dim_qk = c.head_dim_vo = 64;
  c.dtype = DType::kF16;
  c.mask = Mask::kNone;
  all.push_back(c);

  c = PrefillCase{};
  c.name = "ragged_custom_packed_mask_f16_gqa7";
  c.paged = false;
  c.q_lens = {5, 13, 2, 0};
  c.kv_lens = {5, 40, 9, 3};
  c.heads_qo = 7;
  c.heads_kv = 1;
  c.head_dim_qk = c.head_dim_vo = 64;
  c.dtype = DType::kF16;
  c.mask = Mask::kCustomPacked;
  all.push_back(c);

  c = PrefillCase{};
  c.name = "ragged_causal_window_d192_128_bf16";
  c.paged = false;
  c.q_lens = {33, 17};
  c.kv_lens = {100, 17};
  c.head_dim_qk = 192;
  c.head_dim_vo = 128;
  c.window_left = 20;
  all.push_back(c);
  return all;
}

INSTANTIATE_TEST_SUITE_P(Batches, AttentionCliCudaPrefill, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) {
                           return info.param.name;
                         });

// A two-request ragged prefill (q_len 2 and 3) that is valid on the CPU, for the error tests.
class AttentionCliCudaPrefillErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    cli::write_npy(file("q.npy"), testing::random_tensor(DType::kF32, {5, 2, 64}, 61).view());
    cli::write_npy(file("k.npy"), testing::random_tensor(DType::kF32, {9, 1, 64}, 62).view());
    cli::write_npy(file("v.npy"), testing::random_tensor(DType::kF32, {9, 1, 64}, 63).view());
    cli::write_npy(file("qo.npy"), testing::indptr_tensor({2, 3}).view());
    cli::write_npy(file("kv.npy"), testing::indptr_tensor({4, 5}).view());
  }
  std::string file(const std::string& name) const { return scratch_.file(name); }
  CliResult run(const std::vector<std::string>& extra) const {
    std::vector<std::string> args = {"attention",    "--q",         file("q.npy"),  "--k",
                                     file("k.npy"),  "--v",         file("v.npy"),  "--qo-indptr",
                                     file("qo.npy"), "--kv-indptr", file("kv.npy"), "--out-dir",
                                     file("out")};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::run_cli(args, scratch_);
  }

  ScratchDir scratch_;
};

// With a GPU, what BatchPrefill does not run is named by its option; without one, the missing
// GPU is named instead, before any of them.
TEST_F(AttentionCliCudaPrefillErrors, UnsupportedOptionsAreNamed) {
  const std::pair<std::vector<std::string>, const char*> cases[] = {
      {{"--dtype", "bf16", "--rope"}, "the GPU prefill does not support RoPE (--rope)"},
      {{"--dtype", "f16", "--kv-dtype", "e4m3"}, "the GPU prefill does not support fp8 KV"},
      {{"--dtype", "bf16", "--kv-dtype", "f16"}, "q, k and v in one dtype"},
      {{}, "float16 or bfloat16"},  // the float32 files' own dtype
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> extra = flags;
    extra.insert(extra.end(), {"--device", "cuda"});
    const CliResult result = run(extra);
    EXPECT_EQ(result.exit_code, 1) << flags.size() << ": " << result.err;
    EXPECT_EQ(result.err.rfind("flare: error: ", 0), 0u) << result.err;
    if (cuda::available()) {
      EXPECT_NE(result.err.find(message), std::string::npos) << result.err;
    } else {
      EXPECT_NE(result.err.find("no usable CUDA device"), std::string::npos) << result.err;
      EXPECT_EQ(result.err.find(message), std::string::npos) << result.err;
    }
    EXPECT_FALSE(std::filesystem::exists(file("out/o.npy")));
  }
  // The same inputs run on the CPU.
  EXPECT_EQ(run({"--dtype", "bf16", "--rope"}).exit_code, 0);
}

TEST_F(AttentionCliCudaPrefillErrors, HeadDimTheKernelLacks) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  cli::write_npy(file("q.npy"), testing::random_tensor(DType::kF32, {5, 2, 32}, 64).view());
  cli::write_npy(file("k.npy"), testing::random_tensor(DType::kF32, {9, 1, 32}, 65).view());
  cli::write_npy(file("v.npy"), testing::random_tensor(DType::kF32, {9, 1, 32}, 66).view());
  const CliResult result = run({"--dtype", "f16", "--device", "cuda"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("head dims must be"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace flare
