// Next-token sampling of the decode megakernel (issue 22): the parameters, their checks and the
// CPU reference of the kernel's sampler (kernels/llama_decode_sampling.cuh).
//
// temperature 0 is the greedy argmax (the lowest id on ties). temperature T > 0 samples from
// softmax(logits / T), restricted to the top_k most likely tokens (top_k 0: all) and to the
// smallest set of most likely tokens whose probability reaches top_p (top_p 1: all); both
// filters together keep the tokens that pass each. Tokens with equal logits pass or fail a
// filter together. A NaN logit is never sampled; a row of NaN gives -1.
//
// Every draw is a function of (seed, the request's slot in the batch, its position, the token
// id, the rejection round) (kernels/sampling_noise.cuh): a step is deterministic, a replayed
// CUDA graph draws anew as positions advance, and sample_reference reproduces the kernel's
// token from its logits.
#pragma once

#include <cstdint>

namespace flare::model {

// The smallest temperature that samples (logits / T stays finite, and below it the draw is
// the argmax anyway); 0 is greedy.
constexpr float kMinSamplingTemperature = 1e-5f;

struct SamplingParams {
  float temperature = 0.f;  // 0, or finite and >= kMinSamplingTemperature
  int top_k = 0;            // >= 0; 0: off
  float top_p = 1.f;        // (0, 1]; 1: off
  uint64_t seed = 0;
};

// Throws kInvalidArgument naming the field: temperature not 0 and below kMinSamplingTemperature
// or not finite, top_k negative, top_p outside (0, 1], or top_k / top_p set with temperature 0
// (greedy has no filter).
void check_sampling(const SamplingParams& sampling, const char* what);

// The token the megakernel samples for one request's logits [vocab] in slot `request` at
// `position` (the same rounds and draws; sums in double). `rounds`, when given, receives the
// number of draws it took.
int sample_reference(const float* logits, int vocab, const SamplingParams& sampling, int request,
                     int position, int* rounds = nullptr);

}  // namespace flare::model
