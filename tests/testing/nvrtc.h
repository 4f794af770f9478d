// For the tests that compile kernels: NVRTC (CUDA toolkit) is opened at run time, so they skip
// where it cannot be loaded (a machine with only a C++ compiler), naming why. Where CMake found
// NVRTC when it configured the tests (CI, GPU machines; FLARE_TESTS_REQUIRE_NVRTC), they fail
// instead: a broken toolkit must not pass as skipped kernel checks.
#pragma once

#include <gtest/gtest.h>

#include "src/jit/nvrtc_api.h"

#ifndef FLARE_TESTS_REQUIRE_NVRTC
#error "FLARE_TESTS_REQUIRE_NVRTC must be defined by the build (CMakeLists.txt)"
#endif

// A statement for a test body or a fixture's SetUp: returns from it when NVRTC is missing.
#define FLARE_SKIP_WITHOUT_NVRTC()                                                            \
  do {                                                                                        \
    const ::flare::jit::nvrtc::Toolkit& flare_toolkit = ::flare::jit::nvrtc::toolkit();       \
    if (flare_toolkit.api == nullptr) {                                                       \
      if (FLARE_TESTS_REQUIRE_NVRTC) {                                                        \
        FAIL() << "NVRTC was found when the tests were configured but cannot be loaded: "     \
               << flare_toolkit.unavailable_reason;                                           \
      }                                                                                       \
      GTEST_SKIP() << "needs NVRTC to compile kernels: " << flare_toolkit.unavailable_reason; \
    }                                                                                         \
  } while (false)
