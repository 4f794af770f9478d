// The CI check of every shipped kernel configuration, split into shards: each shard is its own
// CTest test (one process), so `ctest -j` spreads the NVRTC compiles over the machine's cores.
// Every spec of an architecture lands in exactly one shard of it.
#pragma once

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "testing/nvrtc.h"

namespace flare::jit::testing {

struct Shard {
  const char* arch;  // "sm_80" or "sm_90a"
  int index;         // in [0, count)
  int count;
};

inline void PrintTo(const Shard& shard, std::ostream* os) {
  *os << shard.arch << " shard " << shard.index << " of " << shard.count;
}

inline std::string shard_name(const ::testing::TestParamInfo<Shard>& info) {
  return std::string(info.param.arch) + "_shard" + std::to_string(info.param.index);
}

// `count` shards of each shipped architecture.
inline std::vector<Shard> shipped_arch_shards(int count) {
  std::vector<Shard> shards;
  for (const char* arch : {"sm_80", "sm_90a"}) {
    for (int index = 0; index < count; ++index) shards.push_back({arch, index, count});
  }
  return shards;
}

// Every count-th spec from the shard's index: the slowest configurations (the widest head dims,
// adjacent in the shipped lists) spread over the shards.
inline std::vector<KernelSpec> specs_of_shard(const std::vector<KernelSpec>& specs,
                                              const Shard& shard) {
  std::vector<KernelSpec> mine;
  for (size_t i = static_cast<size_t>(shard.index); i < specs.size();
       i += static_cast<size_t>(shard.count)) {
    mine.push_back(specs[i]);
  }
  return mine;
}

class ShippedKernelShard : public JitTest, public ::testing::WithParamInterface<Shard> {
 protected:
  void SetUp() override {
    JitTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

}  // namespace flare::jit::testing
