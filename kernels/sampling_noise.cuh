// Counter-based random numbers for sampling, shared by the host (the reference sampler,
// src/model/sampling.cpp) and NVRTC (the megakernel's sampler, kernels/llama_decode_sampling.cuh),
// so a test can recompute every draw of a step.
//
// Philox4x32-10 (Salmon et al., SC'11; the generator of cuRAND and Random123): a bijection of a
// 128-bit counter under a 64-bit key. The sampler's counter is (vocabulary row, the request's
// position, the request's slot, the rejection round) and its key the caller's seed, so every
// draw is a pure function of those: a replayed CUDA graph draws fresh numbers as the positions
// advance, and no generator state lives on the device.
#pragma once

#ifdef __CUDACC_RTC__
#define FLARE_NOISE_HD __host__ __device__
#define FLARE_NOISE_LOG logf
#else
#include <cmath>
#define FLARE_NOISE_HD
#define FLARE_NOISE_LOG std::log
#endif

namespace flare::sampling {

// Philox4x32-10 of counter `x` under key (k0, k1), in place.
FLARE_NOISE_HD inline void philox4x32_10(unsigned (&x)[4], unsigned k0, unsigned k1) {
  for (int round = 0; round < 10; ++round) {
    const unsigned long long p0 = 0xD2511F53ull * x[0], p1 = 0xCD9E8D57ull * x[2];
    const unsigned hi0 = static_cast<unsigned>(p0 >> 32), lo0 = static_cast<unsigned>(p0);
    const unsigned hi1 = static_cast<unsigned>(p1 >> 32), lo1 = static_cast<unsigned>(p1);
    x[0] = hi1 ^ x[1] ^ k0;
    x[1] = lo1;
    x[2] = hi0 ^ x[3] ^ k1;
    x[3] = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// A uniform float in (0, 1): 23 random bits, centred in their interval (exact in float, so
// never 0 or 1).
FLARE_NOISE_HD inline float uniform_open(unsigned bits) {
  return (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
}

// The standard Gumbel draw -log(-log(u)) of vocabulary row `row` for the request in slot
// `request` at position `position`, rejection round `round`. argmax_i(logit_i / T + gumbel_i)
// is a sample of softmax(logits / T) (the Gumbel-max trick).
FLARE_NOISE_HD inline float gumbel_noise(unsigned long long seed, int row, int position,
                                         int request, int round) {
  unsigned x[4] = {static_cast<unsigned>(row), static_cast<unsigned>(position),
                   static_cast<unsigned>(request), static_cast<unsigned>(round)};
  philox4x32_10(x, static_cast<unsigned>(seed), static_cast<unsigned>(seed >> 32));
  return -FLARE_NOISE_LOG(-FLARE_NOISE_LOG(uniform_open(x[0])));
}

}  // namespace flare::sampling

#undef FLARE_NOISE_LOG
