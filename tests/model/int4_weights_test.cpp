// The 4-bit weight format's CPU reference (flare/model/int4_weights.h): hand-computed codes and
// nibble order, the rounding bound on random weights, zero groups, and argument errors.
#include "flare/model/int4_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "flare/core/dtype.h"
#include "testing/expect_error.h"

namespace flare::model {
namespace {

TEST(Int4Weights, HandComputedGroupAndNibbleOrder) {
  std::vector<float> w(256, 0.f);
  w[0] = 0.7f;    // largest: scale = bf16(0.1) = 0.10009765625, code 7 + 8 = 15
  w[1] = -0.7f;   // -7 + 8 = 1
  w[2] = 0.35f;   // 0.35 / 0.10009765625 = 3.4966 -> 3, code 11
  w[3] = -0.05f;  // -0.4995 -> 0, code 8
  // Group 1 (columns 128-255) all zero: scale 0, codes 8.
  const Int4Weight q = quantize_int4(w.data(), 1, 256);
  ASSERT_EQ(q.codes.size(), 128u);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], 0x3DCD);  // bf16(0.1f): 0.10009765625
  EXPECT_EQ(q.scales[1], 0);
  EXPECT_EQ(q.codes[0], 0x1F);  // column 0 low nibble (15), column 1 high nibble (1)
  EXPECT_EQ(q.codes[1], 0x8B);  // column 2: 11, column 3: 8
  EXPECT_EQ(q.codes[64], 0x88);
  const std::vector<float> back = dequantize_int4(q);
  EXPECT_EQ(back[0], 0.10009765625f * 7);
  EXPECT_EQ(back[1], 0.10009765625f * -7);
  EXPECT_EQ(back[2], 0.10009765625f * 3);
  EXPECT_EQ(back[3], 0.f);
  EXPECT_EQ(back[200], 0.f);
}

TEST(Int4Weights, RandomWeightsWithinHalfAStep) {
  const int64_t rows = 9, cols = 384;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = normal(rng);
  w[5] = 0.5f;  // an outlier widens its group's step
  const Int4Weight q = quantize_int4(w.data(), rows, cols);
  const std::vector<float> back = dequantize_int4(q);
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t k = 0; k < cols; ++k) {
      const float scale = bf16_bits_to_float(q.scales[static_cast<size_t>(n * 3 + k / 128)]);
      const size_t i = static_cast<size_t>(n * cols + k);
      EXPECT_LE(std::fabs(back[i] - w[i]), 0.5f * scale * (1.f + 1.f / 64)) << n << " " << k;
    }
  }
  EXPECT_EQ(int4_bytes(4096, 4096), 4096 * 2048 + 4096 * 32 * 2);
}

TEST(Int4Weights, ErrorsNameTheProblem) {
  std::vector<float> w(200, 0.f);
  EXPECT_FLARE_ERROR(quantize_int4(w.data(), 2, 100), ErrorCode::kInvalidArgument,
                     "cols a positive multiple of 128, got [2, 100]");
  std::vector<float> bad(128, 0.f);
  bad[17] = std::nanf("");
  EXPECT_FLARE_ERROR(quantize_int4(bad.data(), 1, 128), ErrorCode::kInvalidArgument,
                     "weight[0][17] is not finite");
}

}  // namespace
}  // namespace flare::model
