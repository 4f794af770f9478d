// Compiles the shipped decode kernels whose label contains argv[2] for argv[1] (sm_80 / sm_90a)
// and writes each cubin to argv[3]_<n>.cubin with its ptxas usage: for reading where a
// configuration spills (cuobjdump -sass, grep STL/LDL).
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/jit/compiler.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s <arch> <label substring> <out prefix>\n", argv[0]);
    return 2;
  }
  const std::string arch = argv[1];
  const size_t shared =
      arch == "sm_80" ? flare::kSm80SharedBytesPerBlock : flare::kSm90SharedBytesPerBlock;
  std::vector<flare::jit::KernelSpec> specs;
  std::set<std::string> seen;
  for (const flare::BatchDecodeConfig& config : flare::shipped_decode_configs()) {
    const flare::BatchDecodeKernels k = flare::batch_decode_kernels(config, shared);
    if (k.decode.label.find(argv[2]) == std::string::npos) continue;
    if (seen.insert(k.decode.translation_unit()).second) specs.push_back(k.decode);
  }
  const auto results = flare::jit::precompile(specs, arch, 2);
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string path = std::string(argv[3]) + "_" + std::to_string(i) + ".cubin";
    std::ofstream(path, std::ios::binary) << results[i].cubin;
    std::printf("%s: %s spill %lld regs %d\n", path.c_str(), specs[i].label.c_str(),
                static_cast<long long>(results[i].usage[0].spill_bytes),
                results[i].usage[0].registers);
  }
}
