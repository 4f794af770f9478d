// The resource budget every shipped kernel configuration must meet, as the CI config tests
// assert it (no GPU needed): zero spills, zero local memory, registers within the budget.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "flare/jit/compiler.h"

namespace flare::testing {

// Checks every entry of `compiled`; `where` names the configuration and arch in failures.
// `allowed_spill_bytes` (spill stores + loads) is for a configuration whose spill was read in
// its SASS and lies outside the hot loop; the caller documents which and why.
inline void expect_shipped_usage(const jit::CompiledKernel& compiled, const std::string& where,
                                 int max_registers = 255, int allowed_spill_bytes = 0) {
  for (const jit::ResourceUsage& usage : compiled.usage) {
    EXPECT_GE(usage.spill_bytes, 0) << where << " " << usage.entry << "\n" << compiled.log;
    EXPECT_LE(usage.spill_bytes, allowed_spill_bytes) << where << " " << usage.entry << "\n"
                                                      << compiled.log;
    EXPECT_LE(usage.local_bytes, allowed_spill_bytes)  // the stack frame: 8-byte aligned
        << where << " " << usage.entry << "\n"
        << compiled.log;
    EXPECT_GT(usage.registers, 0) << where << " " << usage.entry;
    EXPECT_LE(usage.registers, max_registers) << where << " " << usage.entry;
  }
  // ptxas serializes warpgroup MMAs (C7518, C7520: every MMA of the kernel waits for the one
  // before) or injects waits between them (C7517) when the kernel's structure hides what is in
  // flight; either undoes the Hopper family's overlap without failing a numeric test.
  for (const char* code : {"(C7517)", "(C7518)", "(C7519)", "(C7520)"}) {
    EXPECT_EQ(compiled.log.find(code), std::string::npos) << where << "\n" << compiled.log;
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
