// `flare attention` end to end: the test writes q, k, v and the index arrays as .npy files,
// runs the built CLI binary, reads o.npy/lse.npy back and compares them with
// reference_attention called in-process in float64 on the same (rounded) inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/jit/cuda_driver.h"
#include "flare/reference/attention.h"
#include "testing/compare.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"
#include "tools/cli_test_support.h"
#include "tools/flare/npy.h"

namespace flare {
namespace {

using testing::CliResult;
using testing::ScratchDir;

// GQA 4, page size 3, odd lengths, one empty request, a request with more queries than keys.
constexpr int64_t kHeadsQo = 8;
constexpr int64_t kHeadsKv = 2;
constexpr int64_t kHeadDim = 40;
constexpr int64_t kPageSize = 3;
const std::vector<int32_t> kQoLens = {1, 7, 1, 5, 3};
const std::vector<int32_t> kKvLens = {1, 7, 0, 23, 2};
// CLI (fp32 accumulation) versus the float64 reference, relative to the reference's scale.
constexpr double kRelativeTolerance = 1e-5;

HostTensor copy_of(const TensorView& view) { return testing::to_contiguous(view); }

// `values` rounded to `dtype` after dividing by `scale` (what the CLI does with float files).
HostTensor rounded(const HostTensor& values, DType dtype, float scale = 1.0f) {
  HostTensor out(dtype, values.shape());
  for (int64_t i = 0; i < values.numel(); ++i) out.set(i, values.get(i) / scale);
  return out;
}

HostTensor to_int64(const HostTensor& int32) {
  HostTensor out(DType::kI64, int32.shape());
  for (int64_t i = 0; i < int32.numel(); ++i) out.data<int64_t>()[i] = int32.data<int32_t>()[i];
  return out;
}

// Random packed masks, one byte-aligned run per request, plus the same bits unpacked.
struct CustomMask {
  HostTensor packed;       // uint8
  HostTensor mask_indptr;  // int32 [batch + 1], bytes
  HostTensor unpacked;     // uint8 0/1, all requests concatenated
};

CustomMask random_mask(uint64_t seed) {
  testing::Rng rng(seed);
  std::vector<int32_t> byte_counts;
  std::vector<uint8_t> packed, unpacked;
  for (size_t r = 0; r < kQoLens.size(); ++r) {
    const int64_t bits = int64_t{kQoLens[r]} * kKvLens[r];
    std::vector<uint8_t> bytes(static_cast<size_t>((bits + 7) / 8), 0);
    for (int64_t b = 0; b < bits; ++b) {
      const bool visible = rng.uniform() < 0.6;
      unpacked.push_back(visible);
      if (visible) bytes[static_cast<size_t>(b / 8)] |= static_cast<uint8_t>(1u << (b % 8));
    }
    byte_counts.push_back(static_cast<int32_t>(bytes.size()));
    packed.insert(packed.end(), bytes.begin(), bytes.end());
  }
  CustomMask mask{HostTensor(DType::kU8, {static_cast<int64_t>(packed.size())}),
                  testing::indptr_tensor(byte_counts),
                  HostTensor(DType::kU8, {static_cast<int64_t>(unpacked.size())})};
  std::copy(packed.begin(), packed.end(), mask.packed.data<uint8_t>());
  std::copy(unpacked.begin(), unpacked.end(), mask.unpacked.data<uint8_t>());
  return mask;
}

// One CLI configuration and the same configuration for the in-process reference.
struct Case {
  std::string name;
  std::vector<std::string> flags;
  std::function<void(AttentionParams&)> params;
  DType dtype = DType::kF32;     // what the CLI rounds q, k, v to (--dtype)
  DType kv_dtype = DType::kF32;  // --kv-dtype
  KVLayout layout = KVLayout::kNHD;
  bool mask = false;       // write a packed custom mask with its indptr
  bool bool_mask = false;  // write the same mask unpacked as '|b1'
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class AttentionCli : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionCli, PagedMatchesInProcessReference) {
  const Case& c = GetParam();
  ScratchDir scratch;
  testing::KVCacheSpec spec;
  spec.kv_lens = kKvLens;
  spec.num_kv_heads = kHeadsKv;
  spec.head_dim_qk = kHeadDim;
  spec.head_dim_vo = kHeadDim;
  spec.dtype = DType::kF32;
  spec.page_size = kPageSize;
  spec.layout = c.layout;
  spec.seed = 17;
  const testing::TestKVCache cache = testing::build_kv_cache(spec);
  const HostTensor q = testing::random_tensor(
      DType::kF32, {testing::indptr_values(kQoLens).back(), kHeadsQo, kHeadDim}, 29);
  const HostTensor qo_indptr = testing::indptr_tensor(kQoLens);
  const HostTensor k = copy_of(cache.paged.k);
  const HostTensor v = copy_of(cache.paged.v);
  const CustomMask mask = random_mask(5);

  cli::write_npy(scratch.file("q.npy"), q.view());
  cli::write_npy(scratch.file("k.npy"), k.view());
  cli::write_npy(scratch.file("v.npy"), v.view());
  cli::write_npy(scratch.file("qo.npy"), qo_indptr.view());
  cli::write_npy(scratch.file("kv_indptr.npy"), cache.page_indptr.view());
  cli::write_npy(scratch.file("kv_indices.npy"), cache.page_indices.view());
  cli::write_npy(scratch.file("last.npy"), cache.last_page_len.view());
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
                                   "--kv-indices",
                                   scratch.file("kv_indices.npy"),
                                   "--kv-last-page-len",
                                   scratch.file("last.npy"),
                                   "--page-size",
                                   std::to_string(kPageSize),
                                   "--layout",
                                   kv_layout_name(c.layout),
                                   "--out-dir",
                                   scratch.file("out")};
  if (c.mask) {
    cli::write_npy(scratch.file("mask.npy"), mask.packed.view());
    cli::write_npy(scratch.file("mask_indptr.npy"), mask.mask_indptr.view());
    args.insert(args.end(), {"--custom-mask", scratch.file("mask.npy"), "--mask-indptr",
                             scratch.file("mask_indptr.npy")});
  }
  if (c.bool_mask) {
    cli::write_npy(scratch.file("bool_mask.npy"), mask.unpacked.view(), {1, true});
    args.insert(args.end(), {"--custom-mask", scratch.file("bool_mask.npy")});
  }
  args.insert(args.end(), c.flags.begin(), c.flags.end());
  const CliResult result = testing::run_cli(args, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("wrote"), std::string::npos) << result.out;

  // The same problem in-process, on inputs rounded as the CLI rounds them.
  AttentionParams params;
  if (c.params) c.params(params);
  if (c.mask || c.bool_mask) {
    params.mask = MaskMode::kCustom;
    params.custom_mask = mask.packed.view();
    params.mask_indptr = mask.mask_indptr.view();
  }
  const HostTensor q_in = rounded(q, c.dtype);
  const HostTensor k_in = rounded(k, c.kv_dtype, params.k_scale);
  const HostTensor v_in = rounded(v, c.kv_dtype, params.v_scale);
  const PagedKV kv =
      PagedKV::from_separate(k_in.view(), v_in.view(), c.layout, cache.page_indptr.view(),
                             cache.page_indices.view(), cache.last_page_len.view());
  HostTensor o_ref(DType::kF32, q.shape());
  HostTensor lse_ref(DType::kF32, {q.shape()[0], kHeadsQo});
  const bool softmax = params.use_softmax;
  reference_attention(
      AttentionProblem{q_in.view(), qo_indptr.view(), kv, params},
      AttentionOutput{o_ref.view(), softmax ? std::optional(lse_ref.view()) : std::nullopt},
      ReferenceOptions{Accumulation::kF64, 0});

  const cli::NpyArray o = cli::read_npy(scratch.file("out/o.npy"));
  ASSERT_EQ(o.descr, "<f4");
  ASSERT_EQ(o.tensor.shape(), o_ref.shape());
  double scale = 0;
  for (int64_t i = 0; i < o_ref.numel(); ++i)
    scale = std::max(scale, std::fabs(double{o_ref.get(i)}));
  ASSERT_GT(scale, 0.0);
  EXPECT_LE(testing::max_abs_error(o.tensor.view(), o_ref.view()), kRelativeTolerance * scale);
  EXPECT_LE(testing::relative_l2_error(o.tensor.view(), o_ref.view()), kRelativeTolerance);
  const bool lse_written = std::filesystem::exists(scratch.file("out/lse.npy"));
  ASSERT_EQ(lse_written, softmax);
  if (softmax) {
    const cli::NpyArray lse = cli::read_npy(scratch.file("out/lse.npy"));
    ASSERT_EQ(lse.tensor.shape(), lse_ref.shape());
    // Equal infinities (empty or fully masked rows: -inf) count as exact.
    EXPECT_LE(testing::max_abs_error(lse.tensor.view(), lse_ref.view()), kRelativeTolerance * 10);
  }
}

std::vector<Case> cases() {
  return {
      {"plain", {}, {}},
      {"causal", {"--causal"}, [](AttentionParams& p) { p.mask = MaskMode::kCausal; }},
      {"causal_window",
       {"--causal", "--window-left", "4"},
       [](AttentionParams& p) {
         p.mask = MaskMode::kCausal;
         p.window_left = 4;
       }},
      {"softcap_scale",
       {"--soft-cap", "2.5", "--sm-scale", "0.3"},
       [](AttentionParams& p) {
         p.logits_soft_cap = 2.5f;
         p.sm_scale = 0.3f;
       }},
      {"alibi", {"--alibi"}, [](AttentionParams& p) { p.pos_encoding = PosEncoding::kAlibi; }},
      {"rope",
       {"--rope", "--rope-theta", "500", "--rope-scale", "2"},
       [](AttentionParams& p) {
         p.pos_encoding = PosEncoding::kRopeLlama;
         p.rope_theta = 500.0f;
         p.rope_scale = 2.0f;
       }},
      {"sigmoid",
       {"--sigmoid", "--sigmoid-bias", "-1.5"},
       [](AttentionParams& p) {
         p.use_softmax = false;
         p.sigmoid_bias = -1.5f;
       }},
      {"packed_mask", {}, {}, DType::kF32, DType::kF32, KVLayout::kNHD, true},
      {"bool_mask", {}, {}, DType::kF32, DType::kF32, KVLayout::kNHD, false, true},
      {"hnd",
       {"--causal"},
       [](AttentionParams& p) { p.mask = MaskMode::kCausal; },
       DType::kF32,
       DType::kF32,
       KVLayout::kHND},
      {"bf16", {"--dtype", "bf16"}, {}, DType::kBF16, DType::kBF16},
      {"f16_e4m3",
       {"--dtype", "f16", "--kv-dtype", "e4m3", "--k-scale", "0.5", "--v-scale", "0.25"},
       [](AttentionParams& p) {
         p.k_scale = 0.5f;
         p.v_scale = 0.25f;
       },
       DType::kF16,
       DType::kE4M3},
      {"e5m2", {"--kv-dtype", "e5m2"}, {}, DType::kF32, DType::kE5M2},
      {"fp64", {"--fp64", "--threads", "1"}, {}},
  };
}

INSTANTIATE_TEST_SUITE_P(Options, AttentionCli, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Ragged KV (no --kv-indices), with the int64 index arrays NumPy writes by default.
TEST(AttentionCliRagged, MatchesInProcessReference) {
  ScratchDir scratch;
  const testing::TestKVCache cache = testing::build_kv_cache(kKvLens, kHeadsKv, kHeadDim, 1, 3);
  const HostTensor q = testing::random_tensor(
      DType::kF16, {testing::indptr_values(kQoLens).back(), kHeadsQo, kHeadDim}, 31);
  const HostTensor qo_indptr = testing::indptr_tensor(kQoLens);
  const HostTensor k = copy_of(cache.ragged.k);
  const HostTensor v = copy_of(cache.ragged.v);
  cli::write_npy(scratch.file("q.npy"), q.view());
  cli::write_npy(scratch.file("k.npy"), k.view());
  cli::write_npy(scratch.file("v.npy"), v.view());
  cli::write_npy(scratch.file("qo.npy"), to_int64(qo_indptr).view());
  cli::write_npy(scratch.file("kv.npy"), to_int64(cache.ragged_indptr).view());
  const CliResult result = testing::run_cli(
      {"attention", "--q", scratch.file("q.npy"), "--k", scratch.file("k.npy"), "--v",
       scratch.file("v.npy"), "--qo-indptr", scratch.file("qo.npy"), "--kv-indptr",
       scratch.file("kv.npy"), "--causal", "--out-dir", scratch.file("out")},
      scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;

  AttentionParams params;
  params.mask = MaskMode::kCausal;
  HostTensor o_ref(DType::kF32, q.shape());
  HostTensor lse_ref(DType::kF32, {q.shape()[0], kHeadsQo});
  reference_attention(
      AttentionProblem{q.view(), qo_indptr.view(),
                       RaggedKV{k.view(), v.view(), cache.ragged_indptr.view()}, params},
      AttentionOutput{o_ref.view(), lse_ref.view()}, ReferenceOptions{Accumulation::kF64, 0});
  const cli::NpyArray o = cli::read_npy(scratch.file("out/o.npy"));
  const cli::NpyArray lse = cli::read_npy(scratch.file("out/lse.npy"));
  EXPECT_LE(testing::relative_l2_error(o.tensor.view(), o_ref.view()), kRelativeTolerance);
  EXPECT_LE(testing::max_abs_error(lse.tensor.view(), lse_ref.view()), kRelativeTolerance * 10);
  // Request 2 has no keys: O = 0 and LSE = -inf.
  const int64_t row = testing::indptr_values(kQoLens)[2];
  EXPECT_EQ(lse.tensor.get(row * kHeadsQo), -INFINITY);
  EXPECT_EQ(o.tensor.get(row * kHeadsQo * kHeadDim), 0.0f);
}

// Writes a small valid paged problem; `mutate` may overwrite any file before the run.
class AttentionCliErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    const testing::TestKVCache cache = testing::build_kv_cache({3, 5}, 1, 8, 2, 7);
    const HostTensor q = testing::random_tensor(DType::kF32, {2, 2, 8}, 9);
    cli::write_npy(file("q.npy"), q.view());
    cli::write_npy(file("k.npy"), copy_of(cache.paged.k).view());
    cli::write_npy(file("v.npy"), copy_of(cache.paged.v).view());
    cli::write_npy(file("qo.npy"), testing::indptr_tensor({1, 1}).view());
    cli::write_npy(file("kv_indptr.npy"), cache.page_indptr.view());
    cli::write_npy(file("kv_indices.npy"), cache.page_indices.view());
    cli::write_npy(file("last.npy"), cache.last_page_len.view());
    num_pages_ = cache.num_pages();
  }
  std::string file(const std::string& name) const { return scratch_.file(name); }
  std::vector<std::string> args() const {
    return {"attention",
            "--q",
            file("q.npy"),
            "--k",
            file("k.npy"),
            "--v",
            file("v.npy"),
            "--qo-indptr",
            file("qo.npy"),
            "--kv-indptr",
            file("kv_indptr.npy"),
            "--kv-indices",
            file("kv_indices.npy"),
            "--kv-last-page-len",
            file("last.npy"),
            "--out-dir",
            file("out")};
  }
  CliResult run(std::vector<std::string> extra = {}) const {
    std::vector<std::string> all = args();
    all.insert(all.end(), extra.begin(), extra.end());
    return testing::run_cli(all, scratch_);
  }
  bool wrote_output() const {
    return std::filesystem::exists(file("out/o.npy")) ||
           std::filesystem::exists(file("out/lse.npy"));
  }

  ScratchDir scratch_;
  int64_t num_pages_ = 0;
};

TEST_F(AttentionCliErrors, ValidInputRuns) {
  const CliResult result = run();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(wrote_output());
}

TEST_F(AttentionCliErrors, PageIndexOutOfRangeExitsOneAndWritesNothing) {
  // Requests of 3 and 5 tokens in pages of 2 use 5 pages.
  cli::write_npy(file("kv_indices.npy"),
                 testing::int32_tensor({0, 1, 2, 3, static_cast<int32_t>(num_pages_ + 4)}).view());
  const CliResult result = run();
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err.rfind("flare: error: ", 0), 0u) << result.err;
  EXPECT_NE(result.err.find("kv_indices[4]=" + std::to_string(num_pages_ + 4)), std::string::npos)
      << result.err;
  EXPECT_FALSE(wrote_output());
}

TEST_F(AttentionCliErrors, LastPageLenOutOfRange) {
  cli::write_npy(file("last.npy"), testing::int32_tensor({1, 3}).view());
  const CliResult result = run();
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("last_page_len"), std::string::npos) << result.err;
  EXPECT_FALSE(wrote_output());
}

TEST_F(AttentionCliErrors, UnsupportedFileNamesTheFile) {
  HostTensor wrong(DType::kI32, {2, 2, 8});
  cli::write_npy(file("q.npy"), wrong.view());
  CliResult result = run();
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--q: expected float32 or float16"), std::string::npos) << result.err;
  testing::write_file_bytes(file("q.npy"), "not an npy file");
  result = run();
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find(file("q.npy") + ": not a valid .npy file"), std::string::npos)
      << result.err;
  EXPECT_FALSE(wrote_output());
}

TEST_F(AttentionCliErrors, PageSizeMismatch) {
  const CliResult result = run({"--page-size", "3"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.err.find("--page-size 3 does not match the page size 2"), std::string::npos)
      << result.err;
  EXPECT_FALSE(wrote_output());
}

TEST_F(AttentionCliErrors, UsageErrorsExitTwoWithAHint) {
  for (const std::vector<std::string>& extra :
       std::vector<std::vector<std::string>>{{"--bogus"},
                                             {"--window-left", "x"},
                                             {"--causal", "--causal"},
                                             {"--rope-theta", "100"},
                                             {"--alibi", "--rope"},
                                             {"--k-scale", "2"},
                                             {"--dtype", "f64"},
                                             {"--fp64", "--device", "cuda"},
                                             {"--device", "gpu"}}) {
    const CliResult result = run(extra);
    EXPECT_EQ(result.exit_code, 2) << extra[0] << ": " << result.err;
    EXPECT_NE(result.err.find("Try 'flare attention --help'"), std::string::npos) << result.err;
  }
  const CliResult missing = testing::run_cli({"attention", "--q", file("q.npy")}, scratch_);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("missing --k"), std::string::npos) << missing.err;
  EXPECT_FALSE(wrote_output());
}

// Without a GPU: kNoCudaDevice. With one: this head dim (8) is not one BatchDecode runs.
TEST_F(AttentionCliErrors, CudaAnswersWithAClearError) {
  const CliResult result = run({"--device", "cuda"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err.rfind("flare: error: ", 0), 0u) << result.err;
  if (!cuda::available()) {
    EXPECT_NE(result.err.find("no usable CUDA device"), std::string::npos) << result.err;
  }
  EXPECT_FALSE(wrote_output());
}

TEST(AttentionCliHelp, DocumentsShapesAndDtypes) {
  ScratchDir scratch;
  const CliResult result = testing::run_cli({"attention", "--help"}, scratch);
  EXPECT_EQ(result.exit_code, 0);
  for (const char* text :
       {"[total_q, H_qo, D_qk]", "[pages, page_size, H_kv, D]", "[pages, H_kv, page_size, D]",
        "[total_kv, H_kv, D]", "'<f4'", "int32", "--custom-mask", "--kv-dtype", "lse.npy"}) {
    EXPECT_NE(result.out.find(text), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace flare
