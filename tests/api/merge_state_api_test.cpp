// The merge API without a GPU: CPU tensors run the reference operator (bitwise), the CUDA path
// rejects bad shapes, dtypes and devices before touching the driver, and every shipped kernel
// configuration compiles with NVRTC for sm_80 and sm_90a without spills or local memory.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "flare/api/merge_state.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/reference/merge.h"
#include "jit/jit_test_support.h"
#include "kernels/merge_state.cuh"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  const size_t bytes = static_cast<size_t>(a.numel()) * dtype_bytes(a.dtype());
  return a.numel() == b.numel() &&
         std::memcmp(a.data<std::byte>(), b.data<std::byte>(), bytes) == 0;
}

// [seq, H] LSEs in [-8, 8] with empty (-inf) rows.
HostTensor random_lse(std::vector<int64_t> shape, uint64_t seed) {
  HostTensor s = testing::random_tensor(DType::kF32, shape, seed, 4.0f);
  for (int64_t i = 0; i < s.numel(); i += 5) s.set(i, -kInf);
  return s;
}

TEST(MergeStateDispatch, CpuTensorsRunTheReferenceOperator) {
  const int64_t seq = 7, heads = 3, dim = 64;
  const HostTensor v_a = testing::random_tensor(DType::kBF16, {seq, heads, dim}, 1);
  const HostTensor v_b = testing::random_tensor(DType::kBF16, {seq, heads, dim}, 2);
  const HostTensor s_a = random_lse({seq, heads}, 3), s_b = random_lse({seq, heads}, 4);

  HostTensor v_out(DType::kBF16, {seq, heads, dim}), s_out(DType::kF32, {seq, heads});
  HostTensor v_ref(DType::kBF16, {seq, heads, dim}), s_ref(DType::kF32, {seq, heads});
  merge_state(v_a.view(), s_a.view(), v_b.view(), s_b.view(), v_out.view(), s_out.view(), nullptr);
  merge_state(v_a.view(), s_a.view(), v_b.view(), s_b.view(), v_ref.view(), s_ref.view());
  EXPECT_TRUE(same_bytes(v_out, v_ref));
  EXPECT_TRUE(same_bytes(s_out, s_ref));

  HostTensor mask(DType::kU8, {seq});
  for (int64_t i = 0; i < seq; ++i) mask.data<uint8_t>()[i] = static_cast<uint8_t>(i % 2);
  HostTensor v_in_place = testing::to_contiguous(v_a.view());
  HostTensor s_in_place = testing::to_contiguous(s_a.view());
  HostTensor v_in_place_ref = testing::to_contiguous(v_a.view());
  HostTensor s_in_place_ref = testing::to_contiguous(s_a.view());
  merge_state_in_place(v_in_place.view(), s_in_place.view(), v_b.view(), s_b.view(), mask.view(),
                       nullptr);
  merge_state_in_place(v_in_place_ref.view(), s_in_place_ref.view(), v_b.view(), s_b.view(),
                       mask.view());
  EXPECT_TRUE(same_bytes(v_in_place, v_in_place_ref));
  EXPECT_TRUE(same_bytes(s_in_place, s_in_place_ref));

  const HostTensor v = testing::random_tensor(DType::kF16, {seq, 5, heads, dim}, 5);
  const HostTensor s = random_lse({seq, 5, heads}, 6);
  HostTensor v_merged(DType::kF16, {seq, heads, dim}), s_merged(DType::kF32, {seq, heads});
  HostTensor v_merged_ref(DType::kF16, {seq, heads, dim}), s_merged_ref(DType::kF32, {seq, heads});
  merge_states(v.view(), s.view(), v_merged.view(), s_merged.view(), nullptr);
  merge_states(v.view(), s.view(), v_merged_ref.view(), s_merged_ref.view());
  EXPECT_TRUE(same_bytes(v_merged, v_merged_ref));
  EXPECT_TRUE(same_bytes(s_merged, s_merged_ref));

  const HostTensor flat = testing::to_contiguous(v.view().select(0, 0));  // [5, H, D] states
  const HostTensor flat_s = testing::to_contiguous(s.view().select(0, 0));
  HostTensor indptr(DType::kI32, {3});
  indptr.data<int32_t>()[0] = 0;
  indptr.data<int32_t>()[1] = 2;
  indptr.data<int32_t>()[2] = 5;
  HostTensor v_ragged(DType::kF16, {2, heads, dim}), s_ragged(DType::kF32, {2, heads});
  HostTensor v_ragged_ref(DType::kF16, {2, heads, dim}), s_ragged_ref(DType::kF32, {2, heads});
  merge_states_ragged(flat.view(), flat_s.view(), indptr.view(), v_ragged.view(), s_ragged.view(),
                      nullptr);
  merge_states_ragged(flat.view(), flat_s.view(), indptr.view(), v_ragged_ref.view(),
                      s_ragged_ref.view());
  EXPECT_TRUE(same_bytes(v_ragged, v_ragged_ref));
  EXPECT_TRUE(same_bytes(s_ragged, s_ragged_ref));
}

TEST(MergeStateDispatch, CpuFirstTensorWithACudaTensorIsRejected) {
  HostTensor v(DType::kF32, {2, 2, 8}), s(DType::kF32, {2, 2});
  TensorView v_cuda = v.view();
  v_cuda.device = Device::cuda(0);
  EXPECT_FLARE_ERROR(merge_state(v.view(), s.view(), v_cuda, s.view(), v.view(), s.view(), nullptr),
                     ErrorCode::kInvalidArgument, "v_b must be on the CPU");
}

// Views on cuda:0 over host memory the checks never dereference: each bad argument must be
// rejected before the driver is reached, so these run without a GPU.
class MergeStateCudaChecks : public ::testing::Test {
 protected:
  static constexpr int64_t kSeq = 5, kHeads = 3, kDim = 64;

  MergeStateCudaChecks()
      : v_storage_(DType::kF32, {kSeq, 4, kHeads, kDim}),
        s_storage_(DType::kF32, {kSeq, 4, kHeads}) {}

  TensorView on_cuda(TensorView t, int device = 0) const {
    t.device = Device::cuda(device);
    return t;
  }
  TensorView v(DType dtype = DType::kF16) const {
    TensorView t = on_cuda(v_storage_.view().select(1, 0));
    t.dtype = dtype;
    return t;
  }
  TensorView s() const { return on_cuda(s_storage_.view().select(1, 0)); }
  TensorView stacked_v() const {
    TensorView t = on_cuda(v_storage_.view());
    t.dtype = DType::kF16;
    return t;
  }
  TensorView stacked_s() const { return on_cuda(s_storage_.view()); }

  void expect_pair_rejected(const TensorView& v_b, const TensorView& s_b, const TensorView& v_out,
                            const TensorView& s_out, const std::string& message) const {
    EXPECT_FLARE_ERROR(merge_state(v(), s(), v_b, s_b, v_out, s_out, nullptr),
                       ErrorCode::kInvalidArgument, message);
  }

  HostTensor v_storage_, s_storage_;
};

TEST_F(MergeStateCudaChecks, PairArgumentsAreChecked) {
  expect_pair_rejected(v(DType::kBF16), s(), v(), s(),
                       "v_b dtype must be v_a's float16 on the GPU, got bfloat16");
  expect_pair_rejected(v(), s_storage_.view().select(1, 0), v(), s(),
                       "s_b must be on cuda:0 (the device of v_a), got cpu");
  expect_pair_rejected(v(), s(), on_cuda(v(), 1), s(), "v_out must be on cuda:0");
  expect_pair_rejected(v().slice(0, 0, 4), s().slice(0, 0, 4), v(), s(),
                       "v_b must have the shape of v_a");
  expect_pair_rejected(v(), s().slice(1, 0, 2), v(), s(),
                       "s_b must have the shape of v_b without its last dimension");
  TensorView s_f16 = s();
  s_f16.dtype = DType::kF16;
  expect_pair_rejected(v(), s(), v(), s_f16, "s_out dtype must be float32, got float16");
  expect_pair_rejected(v(), s(), v().select(0, 0), s(), "v_out must have rank 3");
  EXPECT_FLARE_ERROR(
      merge_state(v(DType::kE4M3), s(), v(DType::kE4M3), s(), v(DType::kE4M3), s(), nullptr),
      ErrorCode::kInvalidArgument,
      "v_a dtype must be float32, float16 or bfloat16, got float8_e4m3");
}

TEST_F(MergeStateCudaChecks, MaskIsChecked) {
  HostTensor mask(DType::kU8, {kSeq});
  EXPECT_FLARE_ERROR(merge_state_in_place(v(), s(), v(), s(), mask.view(), nullptr),
                     ErrorCode::kInvalidArgument, "mask must be on cuda:0 (the device of v)");
  EXPECT_FLARE_ERROR(
      merge_state_in_place(v(), s(), v(), s(), on_cuda(mask.view().slice(0, 0, 2)), nullptr),
      ErrorCode::kInvalidArgument, "mask must have shape [seq] = [5], got [2]");
  TensorView int_mask = on_cuda(mask.view());
  int_mask.dtype = DType::kI32;
  EXPECT_FLARE_ERROR(merge_state_in_place(v(), s(), v(), s(), int_mask, nullptr),
                     ErrorCode::kInvalidArgument, "mask dtype must be uint8, got int32");
  EXPECT_FLARE_ERROR(merge_state_in_place(v(), s(), v(DType::kF32), s(), std::nullopt, nullptr),
                     ErrorCode::kInvalidArgument, "v_other dtype must be v's float16");
}

TEST_F(MergeStateCudaChecks, StackedArgumentsAreChecked) {
  EXPECT_FLARE_ERROR(merge_states(v(), s(), v(), s(), nullptr), ErrorCode::kInvalidArgument,
                     "v must have rank 4 [seq, num_states, num_heads, head_dim], got rank 3");
  EXPECT_FLARE_ERROR(merge_states(stacked_v(), stacked_s(), v().slice(2, 0, 32), s(), nullptr),
                     ErrorCode::kInvalidArgument,
                     "v_out must have shape [seq, num_heads, head_dim] = [5, 3, 64]");
  EXPECT_FLARE_ERROR(merge_states(stacked_v(), stacked_s(), v(DType::kBF16), s(), nullptr),
                     ErrorCode::kInvalidArgument, "v_out dtype must be v's float16 on the GPU");
  EXPECT_FLARE_ERROR(merge_states(stacked_v(), stacked_s().slice(1, 0, 3), v(), s(), nullptr),
                     ErrorCode::kInvalidArgument, "s must have the shape of v without its last");
  EXPECT_FLARE_ERROR(merge_states(stacked_v(), stacked_s(), v(), on_cuda(s(), 2), nullptr),
                     ErrorCode::kInvalidArgument, "s_out must be on cuda:0 (the device of v)");
}

TEST_F(MergeStateCudaChecks, RaggedArgumentsAreChecked) {
  // v [total 5, 3, 64] (the rows view) merged into 2 rows by indptr [3] on the device.
  HostTensor indptr_storage(DType::kI32, {3});
  const TensorView indptr = on_cuda(indptr_storage.view());
  const TensorView v_out = v().slice(0, 0, 2), s_out = s().slice(0, 0, 2);
  const auto rejects = [&](const TensorView& ranges, const TensorView& out_v,
                           const std::string& message) {
    EXPECT_FLARE_ERROR(merge_states_ragged(v(), s(), ranges, out_v, s_out, nullptr),
                       ErrorCode::kInvalidArgument, message);
  };
  rejects(indptr_storage.view(), v_out, "indptr must be on cuda:0 (the device of v), got cpu");
  rejects(indptr.slice(0, 0, 2), v_out,
          "indptr must have shape [seq + 1] = [3] (seq from v_out), got [2]");
  TensorView indptr_i64 = indptr;
  indptr_i64.dtype = DType::kI64;
  rejects(indptr_i64, v_out, "indptr dtype must be int32, got int64");
  TensorView strided = indptr;
  strided.strides[0] = 2;
  rejects(strided, v_out, "indptr must be contiguous on the GPU, got stride 2");
  rejects(indptr, v().slice(0, 0, 2).slice(2, 0, 32),
          "v_out must have shape [seq, num_heads, head_dim] = [2, 3, 64]");
  rejects(indptr, v(DType::kBF16).slice(0, 0, 2), "v_out dtype must be v's float16 on the GPU");
  EXPECT_FLARE_ERROR(merge_states_ragged(stacked_v(), stacked_s(), indptr, v_out, s_out, nullptr),
                     ErrorCode::kInvalidArgument,
                     "v must have rank 3 [total_states, num_heads, head_dim], got rank 4");
  TensorView v_big = v(), s_big = s();
  v_big.shape[0] = s_big.shape[0] = int64_t{1} << 31;
  EXPECT_FLARE_ERROR(merge_states_ragged(v_big, s_big, indptr, v_out, s_out, nullptr),
                     ErrorCode::kUnsupported, "total_states below 2^31, got 2147483648");
}

TEST_F(MergeStateCudaChecks, TwoToThe31RowsAreUnsupported) {
  // Views over 2^31 rows (never dereferenced): rejected before the driver is reached.
  TensorView v_big = v();
  TensorView s_big = s();
  v_big.shape[0] = s_big.shape[0] = (int64_t{1} << 31) / kHeads + 1;
  EXPECT_FLARE_ERROR(merge_state(v_big, s_big, v_big, s_big, v_big, s_big, nullptr),
                     ErrorCode::kUnsupported, "fewer than 2^31 rows (seq * num_heads)");
}

TEST_F(MergeStateCudaChecks, EmptyInputsLaunchNothing) {
  // No rows: valid arguments return without needing a device.
  merge_state(v().slice(0, 0, 0), s().slice(0, 0, 0), v().slice(0, 0, 0), s().slice(0, 0, 0),
              v().slice(0, 0, 0), s().slice(0, 0, 0), nullptr);
  merge_states(stacked_v().slice(2, 0, 0), stacked_s().slice(2, 0, 0), v().slice(1, 0, 0),
               s().slice(1, 0, 0), nullptr);
}

TEST_F(MergeStateCudaChecks, ValidArgumentsWithoutADeviceAreAnErrorValue) {
  if (cuda::available()) GTEST_SKIP() << "a CUDA device is present (tests/gpu runs the kernels)";
  EXPECT_FLARE_ERROR(merge_state(v(), s(), v(), s(), v(), s(), nullptr), ErrorCode::kNoCudaDevice,
                     "");
}

TEST(MergeStateKernelSpec, RejectsUnshippedConfigurations) {
  EXPECT_FLARE_ERROR(merge_state_kernel_spec(DType::kE4M3, 16), ErrorCode::kInvalidArgument,
                     "merge kernels take float32, float16 or bfloat16 v, got float8_e4m3");
  EXPECT_FLARE_ERROR(merge_state_kernel_spec(DType::kF16, 8), ErrorCode::kInvalidArgument,
                     "vector width for float16 must be 16 or 2 bytes, got 8");
  EXPECT_FLARE_ERROR(merge_state_kernel_spec(DType::kF32, 2), ErrorCode::kInvalidArgument,
                     "must be 16 or 4 bytes, got 2");
}

TEST(MergeStateKernelSpec, ShippedSpecsCoverEveryDtypeAndVectorWidth) {
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_merge_state_kernel_specs()) {
    EXPECT_EQ(spec.family_header, "merge_state.cuh");
    EXPECT_EQ(spec.entry, "flare_merge_state_pair;flare_merge_states");
    units.insert(spec.translation_unit());
  }
  EXPECT_EQ(units.size(), 6u);  // {f32, f16, bf16} x {16 bytes, one element}
}

class ShippedMergeStateKernels : public jit::testing::JitTest,
                                 public ::testing::WithParamInterface<const char*> {};

TEST_P(ShippedMergeStateKernels, CompileWithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::string arch = GetParam();
  // A memory-bound kernel wants many warps per SM: at most 64 registers keep 32 of them.
  constexpr int kMaxRegisters = 64;
  for (const jit::KernelSpec& spec : shipped_merge_state_kernel_specs()) {
    const jit::CompiledKernel compiled = jit::compile(spec, arch);
    ASSERT_EQ(compiled.usage.size(), 2u) << spec.label;
    EXPECT_EQ(compiled.usage[0].entry, "flare_merge_state_pair");
    EXPECT_EQ(compiled.usage[1].entry, "flare_merge_states");
    testing::expect_shipped_usage(compiled, spec.label + " on " + arch, kMaxRegisters);
    for (const jit::ResourceUsage& usage : compiled.usage) {
      const std::string where = spec.label + " " + usage.entry + " on " + arch;
      EXPECT_EQ(usage.static_shared_bytes, 0) << where;
      EXPECT_EQ(usage.max_threads, kMergeStateThreads) << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Archs, ShippedMergeStateKernels, ::testing::Values("sm_80", "sm_90a"),
                         testing::ArchName());

}  // namespace
}  // namespace flare
