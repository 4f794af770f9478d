// Compiles one Hopper prefill kernel (ragged, bf16, causal, 16 heads, D 128, 128 x 128 tiles:
// bench_variants' shape) for sm_90a, with logits soft-cap argv[1] (0: none), and writes the
// cubin to argv[2] with its ptxas usage: for reading its SASS (nvdisasm from PyPI's
// nvidia-cuda-nvdisasm works without a GPU) next to ncu's per-opcode counts
// (experiments/ncu_hopper_vs_fa3.sh NCU_OPCODES=1).
// Build: g++ -O2 -std=c++20 -Iinclude -I. experiments/dump_prefill_cubin.cpp -Lbuild -lflare
//   -Wl,-rpath,build -o /tmp/dump_prefill_cubin
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <soft cap, 0 for none> <out.cubin>\n", argv[0]);
    return 2;
  }
  flare::BatchPrefillConfig config;
  config.max_batch = 16;
  config.max_total_qo = 16 * 8192;
  config.num_qo_heads = config.num_kv_heads = 16;
  config.head_dim_qk = config.head_dim_vo = 128;
  config.kv = flare::PrefillKV::kRagged;
  config.dtype = flare::DType::kBF16;
  config.params.mask = flare::MaskMode::kCausal;
  config.params.sm_scale = 0.088388f;
  config.params.logits_soft_cap = std::strtof(argv[1], nullptr);
  const flare::PrefillTiles tiles{128, 128, true};
  const flare::jit::KernelSpec spec = flare::batch_prefill_kernels(config, tiles).prefill;
  const auto results = flare::jit::precompile({spec}, "sm_90a", 1);
  std::ofstream(argv[2], std::ios::binary) << results[0].cubin;
  std::printf("%s: %s spill %lld regs %d\n", argv[2], spec.label.c_str(),
              static_cast<long long>(results[0].usage[0].spill_bytes),
              results[0].usage[0].registers);
}
