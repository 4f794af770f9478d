// The megakernel's sampler (temperature, top-k, top-p), after the LM head has written the logits
// (kernels/llama_decode.cuh). The host's reference (src/model/sampling.cpp) runs the same rounds
// on the same draws (kernels/sampling_noise.cuh).
//
// Rejection sampling with the Gumbel-max trick, as FlashInfer's sorting-free samplers do it.
// Round r of request b draws the candidate s = argmax over rows i with logit_i > pivot_b of
// logit_i / T + gumbel(seed, i, position_b, b, r), a sample of softmax(logits / T) restricted to
// those rows. s lies in the top-k / top-p set exactly when fewer than k rows have a larger logit
// and their probability mass is below top_p; then it is the token. Otherwise every row whose
// logit is at most logit_s is outside the set too: pivot_b = logit_s, and the next round draws
// again. Conditioned on acceptance each round's draw is proportional to the probabilities within
// the set, so the token is an exact sample of the renormalized top-k / top-p distribution. Each
// rejection removes at least the candidate, and the most likely row is always accepted, so the
// rounds end; a round costs two grid-wide waits (the draw, then the mass above it), and
// temperature alone takes one.
//
// Each CTA scans the logits of its own LM-head rows; per-CTA partials go to sample_partials and
// every CTA reduces all of them in CTA order, so all CTAs reach the same decisions (and the step
// stays deterministic) without another round trip.
#pragma once

#include "llama_decode_sync.cuh"
#include "sampling_noise.cuh"

namespace flare::llama::dev {

// A candidate token: its score and id (0x7fffffff: none); ties go to the lower id.
struct Candidate {
  float score;
  int id;
  __device__ __forceinline__ void take(float s, int i) {
    if (s > score || (s == score && i < id)) {
      score = s;
      id = i;
    }
  }
};

// The block-wide reduction of the consumer warps: each thread's 4 values -> warp lanes 0 ->
// shared [warp][4] -> every thread reads all warps' in warp order (deterministic). `combine`
// folds b into a.
template <class Combine>
__device__ __forceinline__ void consumers_reduce4(float (&v)[4], float* shared, Combine combine) {
#pragma unroll
  for (int o = 16; o >= 1; o /= 2) {
    float other[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) other[i] = __shfl_xor_sync(0xffffffffu, v[i], o);
    combine(v, other);
  }
  consumers_sync();  // the previous reduction's readers are done
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) shared[threadIdx.x / 32 * 4 + i] = v[i];
  }
  consumers_sync();
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = shared[i];
  for (int w = 1; w < kConsumerWarps; ++w) {
    float other[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) other[i] = shared[w * 4 + i];
    combine(v, other);
  }
}

// (score, id as float bits, max, sum of exp(x - max)): the best candidate and a softmax sum.
struct CombineDraw {
  __device__ __forceinline__ void operator()(float (&a)[4], const float (&b)[4]) const {
    const int ia = __float_as_int(a[1]), ib = __float_as_int(b[1]);
    if (b[0] > a[0] || (b[0] == a[0] && ib < ia)) {
      a[0] = b[0];
      a[1] = b[1];
    }
    const float m = fmaxf(a[2], b[2]);
    if (m != negative_infinity()) {
      a[3] = a[3] * expf(a[2] - m) + b[3] * expf(b[2] - m);
      a[2] = m;
    }
  }
};
// (mass, count, -, -): sums.
struct CombineSums {
  __device__ __forceinline__ void operator()(float (&a)[4], const float (&b)[4]) const {
    a[0] += b[0];
    a[1] += b[1];
  }
};

// The rounds for every request of step `step`; writes its row of next_tokens. `shared` holds at
// least 4 * kConsumerWarps floats. The LM head counter is the phase counter: phase n of the
// launch (counted across its steps in `phase`) is complete when it reaches n * gridDim.x.
__device__ __forceinline__ void sample_tokens(const DecodeParams& p, float* shared, int step,
                                              unsigned& phase) {
  __shared__ float pivot[kMaxBatch], logit_max[kMaxBatch], total[kMaxBatch], drawn_logit[kMaxBatch];
  __shared__ int drawn[kMaxBatch], token[kMaxBatch], pending;
  int begin, end;
  partition_range(op_blocks(p, kOpLmHead), gridDim.x, blockIdx.x, begin, end);
  const int row_begin = begin * kBlockRows, row_end = min(end * kBlockRows, p.vocab);
  const float inv_t = 1.f / p.temperature;
  const bool filtered = p.top_k > 0 || p.top_p < 1.f;
  unsigned* counter = lm_head_counter(p);
  const auto grid_exchange = [&]() {  // publishes this CTA's partials, waits for all CTAs'
    consumers_signal(counter);
    ++phase;
    consumers_wait(counter, phase * gridDim.x, p.error);
  };
  if (threadIdx.x < kMaxBatch) {
    pivot[threadIdx.x] = negative_infinity();
    token[threadIdx.x] = -2;  // -2: not decided
  }
  consumers_sync();
  for (int round = 0;; ++round) {
    // The draw: this CTA's best candidate (and in round 0 its softmax max and sum) per request.
    for (int b = 0; b < p.batch; ++b) {
      if (token[b] != -2) continue;  // uniform: shared, written before the last sync
      const float* logits = p.logits + static_cast<long long>(b) * p.vocab;
      const int position = p.positions[b] + step;
      Candidate best{negative_infinity(), 0x7fffffff};
      float m = negative_infinity(), z = 0.f;
      for (int row = row_begin + static_cast<int>(threadIdx.x); row < row_end;
           row += kConsumerWarps * 32) {
        const float l = __ldcg(logits + row);
        if (!(l > pivot[b])) continue;  // NaN never a candidate
        const float s = __fmul_rn(l, inv_t);
        best.take(__fadd_rn(s, sampling::gumbel_noise(p.seed, row, position, b, round)), row);
        if (round == 0) {
          const float m_new = fmaxf(m, s);
          z = z * expf(m - m_new) + expf(s - m_new);
          m = m_new;
        }
      }
      float v[4] = {best.score, __int_as_float(best.id), m, z};
      consumers_reduce4(v, shared, CombineDraw{});
      if (threadIdx.x == 0) {
        *reinterpret_cast<float4*>(p.sample_partials +
                                   (static_cast<long long>(blockIdx.x) * kMaxBatch + b) * 8) =
            make_float4(v[0], v[1], v[2], v[3]);
      }
    }
    grid_exchange();
    for (int b = 0; b < p.batch; ++b) {
      if (token[b] != -2) continue;
      float v[4] = {negative_infinity(), __int_as_float(0x7fffffff), negative_infinity(), 0.f};
      for (int c = static_cast<int>(threadIdx.x); c < static_cast<int>(gridDim.x);
           c += kConsumerWarps * 32) {
        const float* part = p.sample_partials + (static_cast<long long>(c) * kMaxBatch + b) * 8;
        float other[4] = {__ldcg(part), __ldcg(part + 1), __ldcg(part + 2), __ldcg(part + 3)};
        // CombineDraw keeps the lower id on equal scores whatever the order, and the sums are
        // folded in CTA order within a thread, then in thread order: the same in every CTA.
        CombineDraw{}(v, other);
      }
      consumers_reduce4(v, shared, CombineDraw{});
      if (threadIdx.x == 0) {
        const int id = __float_as_int(v[1]);
        if (round == 0) {
          logit_max[b] = v[2];
          total[b] = v[3];
        }
        drawn[b] = id;
        drawn_logit[b] =
            id == 0x7fffffff ? 0.f : __ldcg(p.logits + static_cast<long long>(b) * p.vocab + id);
        if (id == 0x7fffffff)
          token[b] = -1;  // every logit NaN
        else if (!filtered)
          token[b] = id;
      }
    }
    consumers_sync();
    if (!filtered) break;
    // The check: the mass and count of rows above each candidate.
    for (int b = 0; b < p.batch; ++b) {
      if (token[b] != -2) continue;
      const float* logits = p.logits + static_cast<long long>(b) * p.vocab;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      for (int row = row_begin + static_cast<int>(threadIdx.x); row < row_end;
           row += kConsumerWarps * 32) {
        const float l = __ldcg(logits + row);
        if (l > drawn_logit[b]) {
          v[0] += expf(__fmul_rn(l, inv_t) - logit_max[b]);
          v[1] += 1.f;
        }
      }
      consumers_reduce4(v, shared, CombineSums{});
      if (threadIdx.x == 0) {
        *reinterpret_cast<float2*>(p.sample_partials +
                                   (static_cast<long long>(blockIdx.x) * kMaxBatch + b) * 8 + 4) =
            make_float2(v[0], v[1]);
      }
    }
    grid_exchange();
    for (int b = 0; b < p.batch; ++b) {
      if (token[b] != -2) continue;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      for (int c = static_cast<int>(threadIdx.x); c < static_cast<int>(gridDim.x);
           c += kConsumerWarps * 32) {
        const float* part = p.sample_partials + (static_cast<long long>(c) * kMaxBatch + b) * 8 + 4;
        v[0] += __ldcg(part);
        v[1] += __ldcg(part + 1);
      }
      consumers_reduce4(v, shared, CombineSums{});
      if (threadIdx.x == 0) {
        const bool in_top_p = p.top_p >= 1.f || v[0] < p.top_p * total[b];
        const bool in_top_k = p.top_k == 0 || v[1] < static_cast<float>(p.top_k);
        if (in_top_p && in_top_k)
          token[b] = drawn[b];
        else
          pivot[b] = drawn_logit[b];
      }
    }
    if (threadIdx.x == 0) {
      int left = 0;
      for (int b = 0; b < p.batch; ++b) left += token[b] == -2;
      pending = left;
    }
    consumers_sync();
    if (pending == 0) break;
  }
  if (blockIdx.x != 0) return;
  if (threadIdx.x < p.batch) p.next_tokens[step * p.batch + threadIdx.x] = token[threadIdx.x];
  consumers_signal(step_counter(p));  // the next step's embedding reads them
}

}  // namespace flare::llama::dev
