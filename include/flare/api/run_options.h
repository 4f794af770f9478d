// What a run() of BatchDecode or BatchPrefill may change per call without a new plan: the
// scales FlashInfer passes to run(), the LSE's base, and programmatic dependent launch.
#pragma once

#include <span>

#include "flare/core/lse_base.h"
#include "flare/core/tensor.h"

namespace flare {

struct RunOptions {
  // Multiply q.k (FlashInfer's q_scale and k_scale: fp8 calibration scales; the logits are
  // q.k * sm_scale * q_scale * k_scale) and the output (v_scale). Finite.
  float q_scale = 1.0f;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  // The base of the LSE a run() writes (the C++ API's default: the natural log).
  LseBase lse_base = LseBase::kNatural;
  // Programmatic dependent launch: the kernel may start while the stream's previous kernel
  // ends (it waits for that kernel's results before reading anything). Applied on devices of
  // compute capability 9.0 and later, ignored on older ones. Captured runs keep it.
  bool enable_pdl = false;
  // A user variant's scalars (config.variant, include/flare/variant/user_variant.h), in its
  // declared order: exactly one value each, finite. Empty without a user variant.
  std::span<const float> variant_scalars;
  // Its tensors, likewise: one each, of the declared dtype, on the config's CUDA device.
  std::span<const TensorView> variant_tensors;
};

}  // namespace flare
