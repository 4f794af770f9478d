// EXPECT_FLARE_ERROR: asserts that a statement throws flare::Error with a given code and a
// message containing a given substring (GoogleTest non-fatal failure otherwise).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "flare/core/error.h"

// Any other exception escapes and fails the test with its message.
#define EXPECT_FLARE_ERROR(statement, expected_code, substring)                             \
  do {                                                                                      \
    try {                                                                                   \
      statement;                                                                            \
      ADD_FAILURE() << "expected flare::Error (" << ::flare::error_code_name(expected_code) \
                    << ") from: " #statement;                                               \
    } catch (const ::flare::Error& flare_error_) {                                          \
      EXPECT_EQ(flare_error_.code(), expected_code) << flare_error_.what();                 \
      EXPECT_THAT(std::string(flare_error_.what()), ::testing::HasSubstr(substring));       \
    }                                                                                       \
  } while (0)
