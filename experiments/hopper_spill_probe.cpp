// Spills of the shipped Hopper prefill units whose label contains argv[1] (all with no
// argument), compiled here with NVRTC for sm_90a (FLARE_PROBE_ARCH=sm_80: the mma.sync family's
// units): a quick check of a kernel change before the full compile test (ctest -R
// ShippedPrefillKernels, ~3 minutes on two cores). With FLARE_PROBE_CUBINS=<dir>, each unit's
// cubin is written there as <index>.cubin (nvdisasm it, or cmp two trees' cubins: a refactor
// whose cubins are byte-identical needs no GPU run); with FLARE_PROBE_LIST=1, the units'
// labels are listed and nothing compiled; with FLARE_PROBE_FA2=1 the mma.sync family's units for
// sm_90a; with FLARE_PROBE_BF16=1, every unit in bfloat16 (the
// shipped soft-cap units are float16; the fixed-offset softmax is bfloat16's), and with
// FLARE_PROBE_SOFT_CAP_ALONE=1 the soft-capped units without their window and ALiBi (=alibi:
// without ALiBi only).
// Build: g++ -O2 -std=c++20 -Iinclude -I. experiments/hopper_spill_probe.cpp -Lbuild -lflare
//   -Wl,-rpath,build -o /tmp/hopper_spill_probe   (one line)
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/jit/compiler.h"

int main(int argc, char** argv) {
  const std::string filter = argc > 1 ? argv[1] : "";
  std::vector<flare::jit::KernelSpec> specs;
  std::set<std::string> seen;
  // FLARE_PROBE_ARCH=sm_80: the mma.sync family's units instead, for sm_80.
  const char* arch_env = std::getenv("FLARE_PROBE_ARCH");
  const std::string arch = arch_env != nullptr ? arch_env : "sm_90a";
  for (const flare::ShippedPrefillConfig& shipped : flare::shipped_prefill_configs()) {
    // FLARE_PROBE_FA2=1: the mma.sync family's units on any arch (sm_90a included).
    const bool fa2 = std::getenv("FLARE_PROBE_FA2") != nullptr || arch != "sm_90a";
    if (shipped.tiles.warpgroup == fa2) continue;
    flare::BatchPrefillConfig config = shipped.config;
    if (std::getenv("FLARE_PROBE_BF16") != nullptr && config.dtype == flare::DType::kF16) {
      config.dtype = flare::DType::kBF16;
    }
    if (std::getenv("FLARE_PROBE_SOFT_CAP_ALONE") != nullptr && config.params.logits_soft_cap > 0) {
      if (std::string(std::getenv("FLARE_PROBE_SOFT_CAP_ALONE")) != "alibi") {
        config.params.window_left = -1;
      }
      config.params.pos_encoding = flare::PosEncoding::kNone;
    }
    const flare::jit::KernelSpec spec = flare::batch_prefill_kernels(config, shipped.tiles).prefill;
    if (spec.label.find(filter) == std::string::npos) continue;
    if (seen.insert(spec.translation_unit()).second) specs.push_back(spec);
  }
  if (std::getenv("FLARE_PROBE_LIST") != nullptr) {  // the units' labels only, no compile
    for (const auto& spec : specs) std::printf("%s\n", spec.label.c_str());
    return 0;
  }
  const auto results = flare::jit::precompile(specs, arch, 2);
  int spilling = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& usage = results[i].usage[0];
    spilling += usage.spill_bytes > 0;
    std::printf("%5lld B spilled, %3d registers: %s\n", static_cast<long long>(usage.spill_bytes),
                usage.registers, specs[i].label.c_str());
    if (const char* dir = std::getenv("FLARE_PROBE_CUBINS")) {
      std::ofstream(std::string(dir) + "/" + std::to_string(i) + ".cubin", std::ios::binary)
          << results[i].cubin;
    }
  }
  std::printf("%d of %zu units spill\n", spilling, specs.size());
  return spilling > 0;
}
