// `flare attention --device cuda`: decode batches run through BatchDecode on the GPU and match
// the float64 reference on the same rounded inputs (prefill batches:
// attention_cli_cuda_prefill_test.cpp). Skipped on machines without a CUDA device.
#include <gtest/gtest.h>

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

constexpr int64_t kHeadsQo = 8;
constexpr int64_t kHeadsKv = 2;  // GQA 4
constexpr int64_t kHeadDim = 64;
constexpr int64_t kPageSize = 3;
const std::vector<int32_t> kKvLens = {1, 7, 0, 97, 511};
// The GPU writes o in the q dtype: rounding to bf16/f16 dominates (2^-9 relative for bf16).
constexpr double kOutputRelativeL2 = 4e-3;
constexpr double kLseMaxAbs = 1e-3;  // float32 on both sides, same rounded inputs

struct CudaCase {
  std::string name;
  DType dtype;
  DType kv_dtype;
  std::vector<std::string> flags;
  float kv_scale;
};

void PrintTo(const CudaCase& c, std::ostream* os) { *os << c.name; }

class AttentionCliCuda : public ::testing::TestWithParam<CudaCase> {};

HostTensor rounded(const TensorView& values, DType dtype, float scale = 1.0f) {
  const HostTensor contiguous = testing::to_contiguous(values);
  HostTensor out(dtype, contiguous.shape());
  for (int64_t i = 0; i < contiguous.numel(); ++i) out.set(i, contiguous.get(i) / scale);
  return out;
}

TEST_P(AttentionCliCuda, DecodeMatchesReference) {
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
  const CudaCase& c = GetParam();
  ScratchDir scratch;
  testing::KVCacheSpec spec;
  spec.kv_lens = kKvLens;
  spec.num_kv_heads = kHeadsKv;
  spec.head_dim_qk = kHeadDim;
  spec.head_dim_vo = kHeadDim;
  spec.dtype = DType::kF32;
  spec.page_size = kPageSize;
  spec.seed = 41;
  const testing::TestKVCache cache = testing::build_kv_cache(spec);
  const int64_t batch = static_cast<int64_t>(kKvLens.size());
  const HostTensor q = testing::random_tensor(DType::kF32, {batch, kHeadsQo, kHeadDim}, 43);
  const HostTensor qo_indptr = testing::indptr_tensor(std::vector<int32_t>(kKvLens.size(), 1));
  const HostTensor k = testing::to_contiguous(cache.paged.k);
  const HostTensor v = testing::to_contiguous(cache.paged.v);
  cli::write_npy(scratch.file("q.npy"), q.view());
  cli::write_npy(scratch.file("k.npy"), k.view());
  cli::write_npy(scratch.file("v.npy"), v.view());
  cli::write_npy(scratch.file("qo.npy"), qo_indptr.view());
  cli::write_npy(scratch.file("indptr.npy"), cache.page_indptr.view());
  cli::write_npy(scratch.file("indices.npy"), cache.page_indices.view());
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
                                   scratch.file("indptr.npy"),
                                   "--kv-indices",
                                   scratch.file("indices.npy"),
                                   "--kv-last-page-len",
                                   scratch.file("last.npy"),
                                   "--device",
                                   "cuda",
                                   "--out-dir",
                                   scratch.file("out")};
  args.insert(args.end(), c.flags.begin(), c.flags.end());
  const CliResult result = testing::run_cli(args, scratch);
  ASSERT_EQ(result.exit_code, 0) << result.err;

  AttentionParams params;
  params.k_scale = c.kv_scale;
  params.v_scale = c.kv_scale;
  const HostTensor q_in = rounded(q.view(), c.dtype);
  const HostTensor k_in = rounded(k.view(), c.kv_dtype, c.kv_scale);
  const HostTensor v_in = rounded(v.view(), c.kv_dtype, c.kv_scale);
  const PagedKV kv =
      PagedKV::from_separate(k_in.view(), v_in.view(), KVLayout::kNHD, cache.page_indptr.view(),
                             cache.page_indices.view(), cache.last_page_len.view());
  HostTensor o_ref(DType::kF32, q.shape());
  HostTensor lse_ref(DType::kF32, {batch, kHeadsQo});
  reference_attention(AttentionProblem{q_in.view(), qo_indptr.view(), kv, params},
                      AttentionOutput{o_ref.view(), lse_ref.view()},
                      ReferenceOptions{Accumulation::kF64, 0});
  const cli::NpyArray o = cli::read_npy(scratch.file("out/o.npy"));
  const cli::NpyArray lse = cli::read_npy(scratch.file("out/lse.npy"));
  EXPECT_LE(testing::relative_l2_error(o.tensor.view(), o_ref.view()), kOutputRelativeL2);
  EXPECT_LE(testing::max_abs_error(lse.tensor.view(), lse_ref.view()), kLseMaxAbs);
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, AttentionCliCuda,
    ::testing::Values(CudaCase{"bf16", DType::kBF16, DType::kBF16, {"--dtype", "bf16"}, 1.0f},
                      CudaCase{"f16_e4m3",
                               DType::kF16,
                               DType::kE4M3,
                               {"--dtype", "f16", "--kv-dtype", "e4m3", "--k-scale", "0.25",
                                "--v-scale", "0.25"},
                               0.25f}),
    [](const ::testing::TestParamInfo<CudaCase>& info) { return info.param.name; });

}  // namespace
}  // namespace flare
