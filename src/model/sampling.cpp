// The CPU reference of the megakernel's sampler (flare/model/sampling.h): the rounds of
// kernels/llama_decode_sampling.cuh on the same draws.
#include "flare/model/sampling.h"

#include <cmath>
#include <limits>

#include "flare/core/error.h"
#include "kernels/sampling_noise.cuh"

namespace flare::model {

void check_sampling(const SamplingParams& s, const char* what) {
  FLARE_CHECK(s.temperature == 0.f ||
                  (std::isfinite(s.temperature) && s.temperature >= kMinSamplingTemperature),
              ErrorCode::kInvalidArgument, what,
              ": temperature must be 0 (greedy) or finite and >= ", kMinSamplingTemperature,
              ", got ", s.temperature);
  FLARE_CHECK(s.top_k >= 0, ErrorCode::kInvalidArgument, what,
              ": top_k must be >= 0 (0: off), got ", s.top_k);
  FLARE_CHECK(s.top_p > 0.f && s.top_p <= 1.f, ErrorCode::kInvalidArgument, what,
              ": top_p must be in (0, 1] (1: off), got ", s.top_p);
  FLARE_CHECK(s.temperature > 0.f || (s.top_k == 0 && s.top_p == 1.f), ErrorCode::kInvalidArgument,
              what, ": top_k (", s.top_k, ") and top_p (", s.top_p,
              ") filter a sample, but temperature 0 is the greedy argmax: pass temperature > 0");
}

int sample_reference(const float* logits, int vocab, const SamplingParams& s, int request,
                     int position, int* rounds) {
  check_sampling(s, "sample_reference");
  if (rounds != nullptr) *rounds = 0;
  if (s.temperature == 0.f) {  // greedy: the lowest id among the largest
    int best = -1;
    for (int i = 0; i < vocab; ++i) {
      if (!std::isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
    }
    return best;
  }
  const float inv_t = 1.f / s.temperature;
  const bool filtered = s.top_k > 0 || s.top_p < 1.f;
  float max_scaled = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] > -std::numeric_limits<float>::infinity()) {  // not NaN, not -inf
      max_scaled = std::fmax(max_scaled, logits[i] * inv_t);
    }
  }
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) {
    if (logits[i] > -std::numeric_limits<float>::infinity()) {
      total += std::exp(static_cast<double>(logits[i] * inv_t) - max_scaled);
    }
  }
  float pivot = -std::numeric_limits<float>::infinity();
  for (int round = 0;; ++round) {
    if (rounds != nullptr) *rounds = round + 1;
    int drawn = -1;
    float best = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < vocab; ++i) {
      if (!(logits[i] > pivot)) continue;
      const float score =
          logits[i] * inv_t + sampling::gumbel_noise(s.seed, i, position, request, round);
      if (drawn < 0 || score > best) {
        best = score;
        drawn = i;
      }
    }
    if (drawn < 0 || !filtered) return drawn;
    double mass = 0.0;
    int count = 0;
    for (int i = 0; i < vocab; ++i) {
      if (logits[i] > logits[drawn]) {
        mass += std::exp(static_cast<double>(logits[i] * inv_t) - max_scaled);
        ++count;
      }
    }
    const bool in_top_p = s.top_p >= 1.f || mass < static_cast<double>(s.top_p) * total;
    const bool in_top_k = s.top_k == 0 || count < s.top_k;
    if (in_top_p && in_top_k) return drawn;
    pivot = logits[drawn];
  }
}

}  // namespace flare::model
