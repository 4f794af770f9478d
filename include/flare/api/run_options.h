// What a run() of BatchDecode or BatchPrefill may change per call without a new plan: the
// scales FlashInfer passes to run(), the LSE's base, and programmatic dependent launch.
#pragma once

namespace flare {

// The base of the log-sum-exp a run() writes. flare's C++ API computes the natural log; the
// Python layer asks for base 2, FlashInfer's convention (m + log2 d). Converted where the
// kernels store it: no extra pass.
enum class LseBase : int { kNatural, kBase2 };

struct RunOptions {
  // Multiply q.k (FlashInfer's q_scale and k_scale: fp8 calibration scales; the logits are
  // q.k * sm_scale * q_scale * k_scale) and the output (v_scale). Finite.
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  LseBase lse_base = LseBase::kNatural;
  // Programmatic dependent launch: the kernel may start while the stream's previous kernel
  // ends (it waits for that kernel's results before reading anything). Applied on devices of
  // compute capability 9.0 and later, ignored on older ones. Captured runs keep it.
  bool enable_pdl = false;
};

// The factor a kernel applies to a natural-log LSE to store it in `base`.
inline float lse_scale(LseBase base) {
  return base == LseBase::kBase2 ? 1.4426950408889634f : 1.0f;  // log2(e)
}

}  // namespace flare
