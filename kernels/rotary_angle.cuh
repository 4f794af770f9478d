// RoPE's angle of a position, shared by the attention kernels' fused rotation (rotary.cuh) and
// apply_rope's kernel (rope_apply.cuh): pos * turns (turns per position as hi + lo, the host's
// double split in two floats) reduced to a fraction of a turn, exact to ~1e-7 turns at any
// position.
#pragma once

namespace flare {

constexpr float kTwoPi = 6.283185307179586f;

// pos * (turns.x + turns.y) less its whole turns, in [-1/2, 1/2] to ~1e-7 turns at any position:
// pos * turns.x is split into its float and its exact rounding error (fmaf), and whole turns
// are dropped before the sum.
__device__ __forceinline__ float rotary_turn_fraction(int pos, float2 turns) {
  const float position = static_cast<float>(pos);    // exact below 2^24
  const float whole = __fmul_rn(position, turns.x);  // never contracted into the fmaf below
  const float error = fmaf(position, turns.x, -whole);
  return (whole - rintf(whole)) + fmaf(position, turns.y, error);
}

}  // namespace flare
