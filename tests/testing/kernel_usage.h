// The resource budget every shipped kernel configuration must meet, as the CI config tests
// assert it (no GPU needed): zero spills, zero local memory, registers within the budget.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "flare/jit/compiler.h"

namespace flare::testing {

// Checks every entry of `compiled`; `where` names the configuration and arch in failures.
inline void expect_shipped_usage(const jit::CompiledKernel& compiled, const std::string& where,
                                 int max_registers = 255) {
  for (const jit::ResourceUsage& usage : compiled.usage) {
    EXPECT_EQ(usage.spill_bytes, 0) << where << " " << usage.entry << "\n" << compiled.log;
    EXPECT_EQ(usage.local_bytes, 0) << where << " " << usage.entry << "\n" << compiled.log;
    EXPECT_GT(usage.registers, 0) << where << " " << usage.entry;
    EXPECT_LE(usage.registers, max_registers) << where << " " << usage.entry;
  }
}

// The value of a compile-time define of `spec` ("" when absent).
inline std::string define_value(const jit::KernelSpec& spec, const std::string& name) {
  for (const auto& [key, value] : spec.defines) {
    if (key == name) return value;
  }
  return "";
}

}  // namespace flare::testing
