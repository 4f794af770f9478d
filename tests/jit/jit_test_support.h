// Shared by the JIT tests: a fixture with a fresh FLARE_CACHE_DIR and silenced logging per test,
// and the small kernels the tests compile (plain, local-memory, two-entry, spilling, recursive).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "flare/jit/compiler.h"

namespace flare::jit::testing {

class JitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "flare_jit_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    cache_dir_ = pattern;
    setenv("FLARE_CACHE_DIR", cache_dir_.c_str(), 1);
    setenv("FLARE_LOG", "quiet", 1);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(cache_dir_, ignored);
    unsetenv("FLARE_CACHE_DIR");
    unsetenv("FLARE_LOG");
  }
  const std::string& cache_dir() const { return cache_dir_; }

 private:
  std::string cache_dir_;
};

// Scales bf16 input by SCALE and adds a field of a plan record: uses NVRTC-side CUDA headers
// (cuda_bf16.h, cuda_fp8.h) and the embedded header under its "kernels/" spelling while the
// family header names it plainly, so both spellings meet in one unit.
inline KernelSpec simple_spec(const std::string& scale = "2.0f") {
  KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "jit_test_scale";
  spec.label = "jit test scale";
  spec.defines = {{"SCALE", scale}};
  spec.variant_source = R"(
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "kernels/plan_types.cuh"
extern "C" __global__ void jit_test_scale(const __nv_bfloat16* x, const __nv_fp8_e4m3* bias,
                                          const flare::WorkItem* items, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __bfloat162float(x[i]) * SCALE + float(bias[i]) + items[0].kv_end;
}
)";
  return spec;
}

// A runtime-indexed array the compiler cannot keep in registers: 256 floats of local memory.
inline KernelSpec local_memory_spec() {
  KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "jit_test_local";
  spec.label = "jit test local memory";
  spec.variant_source = R"(
extern "C" __global__ void jit_test_local(const int* index, float* y) {
  float table[256];
  for (int i = 0; i < 256; ++i) table[i] = y[i] * i;
  y[threadIdx.x] = table[index[threadIdx.x] & 255];
}
)";
  return spec;
}

// Two entries, one with __launch_bounds__(256) and static shared memory.
inline KernelSpec two_entry_spec() {
  KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "jit_test_bounded;jit_test_plain";
  spec.label = "jit test two entries";
  spec.variant_source = R"(
extern "C" __global__ void __launch_bounds__(256) jit_test_bounded(float* y) {
  __shared__ float tile[512];
  tile[threadIdx.x] = y[threadIdx.x];
  tile[threadIdx.x + 256] = y[threadIdx.x + 256];
  __syncthreads();
  y[threadIdx.x] = tile[511 - threadIdx.x];
}
extern "C" __global__ void jit_test_plain(float* y) { y[threadIdx.x] += 1.0f; }
)";
  return spec;
}

// 64 accumulators live across a loop of unknown length under a 32-register cap
// (__launch_bounds__(256, 8): 65536 / (256 * 8)): ptxas must spill, whatever the arch.
inline KernelSpec spilling_spec() {
  KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "jit_test_spill";
  spec.label = "jit test spills";
  spec.variant_source = R"(
extern "C" __global__ void __launch_bounds__(256, 8)
    jit_test_spill(const float* x, float* y, int n) {
  float acc[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) acc[j] = x[j * 256 + threadIdx.x];
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = acc[j] * acc[(j + 1) % 64] + x[i];
  }
#pragma unroll
  for (int j = 0; j < 64; ++j) y[j * 256 + threadIdx.x] = acc[j];
}
)";
  return spec;
}

// A recursive device function: ptxas cannot inline it, and its frame (with spills) appears in
// ptxas's report only, not in the kernel's stack attributes in the cubin.
inline KernelSpec recursive_callee_spec() {
  KernelSpec spec;
  spec.family_header = "plan_types.cuh";
  spec.entry = "jit_test_recursive";
  spec.label = "jit test recursive callee";
  spec.variant_source = R"(
__device__ int jit_test_fibonacci(int n) {
  return n < 2 ? n : jit_test_fibonacci(n - 1) + jit_test_fibonacci(n - 2);
}
extern "C" __global__ void jit_test_recursive(int* y) {
  y[threadIdx.x] = jit_test_fibonacci(y[threadIdx.x]);
}
)";
  return spec;
}

}  // namespace flare::jit::testing
