// The base of a log-sum-exp (LSE) tensor. flare computes natural logs; FlashInfer's Python
// convention is base 2 (m + log2 d). Kernels convert where they store an LSE, the reference
// merge where it reads and writes one: no extra pass.
#pragma once

namespace flare {

enum class LseBase : int { kNatural, kBase2 };

// The factor that turns a natural-log LSE into one of `base`.
inline float lse_scale(LseBase base) {
  return base == LseBase::kBase2 ? 1.4426950408889634f : 1.0f;  // log2(e)
}

// The factor that turns an LSE of `base` into a natural log.
inline float lse_to_natural(LseBase base) {
  return base == LseBase::kBase2 ? 0.6931471805599453f : 1.0f;  // ln(2)
}

}  // namespace flare
