// The megakernel's attention stage (kernels/llama_decode_params.cuh): decode attention of each
// request's group of query heads over its paged KV cache, FlashDecoding-style.
//
// Work items are (request, KV head, split): split s of a request of length n covers tokens
// [s * ceil(n / S), ...). Item i goes to CTA i mod grid. In an item, lane group h (head_dim / 8
// lanes, 8 dimensions each: 16 or 32 groups in the CTA; for groups of more than 4 query heads
// head_dim / 4 lanes of 4 dimensions, which keeps the 8 heads' states in registers) takes
// tokens h, h + groups, ...: the
// group's logits for a token are summed over its lanes by shuffles and folded into an online
// softmax (log2 domain). Lane groups of a warp merge by shuffle, warps in shared memory, and the
// item's normalized output and log-sum-exp go to global memory; the last CTA to finish an (request,
// KV head) merges its S partial states in split order (deterministic) into the bf16 attention
// output.
//
// Index safety: a page slot outside the request's kv_indptr range or a page id outside
// [0, num_pages) is skipped (nothing read) and sets error 2.
#pragma once

#include "llama_decode_sync.cuh"

namespace flare::llama::dev {

constexpr int kGroup = FLARE_LLAMA_GROUP;             // query heads per KV head
constexpr int kTokensInFlight = kGroup <= 4 ? 3 : 2;  // tokens a lane group loads before use
                                                      // (4 spills at the 168-register limit)
constexpr int kDimsPerLane = kGroup <= 4 ? 8 : 4;
constexpr int kLanesPerToken = kHeadDim / kDimsPerLane;
constexpr int kTokenGroups = kConsumerWarps * 32 / kLanesPerToken;

// A lane's kDimsPerLane bf16 of a K or V row.
template <int kDims>
struct KvVector;
template <>
struct KvVector<8> {
  uint4 bits;
  __device__ __forceinline__ void load(const unsigned short* p) { bits = load_cg(p); }
  __device__ __forceinline__ void to_float(float (&out)[8]) const { bf16x8_to_float(bits, out); }
};
template <>
struct KvVector<4> {
  uint2 bits;
  __device__ __forceinline__ void load(const unsigned short* p) {
    bits = __ldcg(reinterpret_cast<const uint2*>(p));
  }
  __device__ __forceinline__ void to_float(float (&out)[4]) const {
    bf16x2_to_float2(bits.x, out[0], out[1]);
    bf16x2_to_float2(bits.y, out[2], out[3]);
  }
};

// The slot of `token` in request `b`'s pages, or -1 (error 2 set) when the page table does not
// hold it (a negative token position included).
__device__ __forceinline__ long long kv_slot(const DecodeParams& p, int b, int token) {
  const int first = max(0, min(p.kv_indptr[b], p.num_kv_indices));
  const int last = max(first, min(p.kv_indptr[b + 1], p.num_kv_indices));
  const long long index = token >= 0 ? first + static_cast<long long>(token / p.page_size)
                                     : last;  // a negative position is not held either
  const int page = index < last ? p.kv_indices[index] : -1;
  if (page < 0 || page >= p.num_pages) {
    atomicExch(p.error, 2);
    return -1;
  }
  return static_cast<long long>(page) * p.page_size + token % p.page_size;
}

struct SoftmaxState {
  float m[kGroup], l[kGroup], o[kGroup][kDimsPerLane];
};

// One item's partial state into attn_partials[item]: [group][128 outputs, lse] floats.
__device__ __forceinline__ void attention_item(const DecodeParams& p, const LayerWeights& w,
                                               int item, int step, float* shared) {
  const int splits = p.attention_splits;
  const int b = item / (p.kv_heads * splits), kv_head = item / splits % p.kv_heads,
            split = item % splits;
  const int length = p.positions[b] + step + 1;
  const int per_split = (length + splits - 1) / splits;
  const int begin = split * per_split, end = min(length, begin + per_split);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32,
            token_group = threadIdx.x / kLanesPerToken,
            dim = (lane % kLanesPerToken) * kDimsPerLane;
  const unsigned group_mask = kLanesPerToken == 32 ? 0xffffffffu
                                                   : ((1u << (kLanesPerToken % 32)) - 1u)
                                                         << (lane & ~(kLanesPerToken - 1));

  float q[kGroup][kDimsPerLane];
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    const float* src =
        p.q + (static_cast<long long>(b) * p.heads + kv_head * kGroup + h) * kHeadDim + dim;
#pragma unroll
    for (int i4 = 0; i4 < kDimsPerLane / 4; ++i4) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(src) + i4);
      q[h][4 * i4] = v.x * p.sm_scale_log2;
      q[h][4 * i4 + 1] = v.y * p.sm_scale_log2;
      q[h][4 * i4 + 2] = v.z * p.sm_scale_log2;
      q[h][4 * i4 + 3] = v.w * p.sm_scale_log2;
    }
  }
  SoftmaxState st;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    st.m[h] = negative_infinity();
    st.l[h] = 0.f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) st.o[h][i] = 0.f;
  }

  const long long head_offset = static_cast<long long>(kv_head) * kHeadDim + dim;
  const long long row_elems = static_cast<long long>(p.kv_heads) * kHeadDim;
  for (int base = begin + token_group; base < end; base += kTokenGroups * kTokensInFlight) {
    KvVector<kDimsPerLane> k[kTokensInFlight], v[kTokensInFlight];
    bool valid[kTokensInFlight];
#pragma unroll
    for (int j = 0; j < kTokensInFlight; ++j) {
      const int token = base + kTokenGroups * j;
      const long long slot = token < end ? kv_slot(p, b, token) : -1;
      valid[j] = slot >= 0;
      if (valid[j]) {
        k[j].load(w.k_cache + slot * row_elems + head_offset);
        v[j].load(w.v_cache + slot * row_elems + head_offset);
      }
    }
#pragma unroll
    for (int j = 0; j < kTokensInFlight; ++j) {
      // Uniform across the lane group (same token), so the shuffles below stay within it.
      if (!valid[j]) continue;
      float kf[kDimsPerLane], vf[kDimsPerLane];
      k[j].to_float(kf);
      v[j].to_float(vf);
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) s = fmaf(q[h][i], kf[i], s);
#pragma unroll
        for (int o = kLanesPerToken / 2; o >= 1; o /= 2) s += __shfl_xor_sync(group_mask, s, o);
        const float m = fmaxf(st.m[h], s);
        const float scale = exp2f(st.m[h] - m), e = exp2f(s - m);
        st.m[h] = m;
        st.l[h] = st.l[h] * scale + e;
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) st.o[h][i] = fmaf(st.o[h][i], scale, e * vf[i]);
      }
    }
  }
  // The lane groups of a warp hold the same dimensions: merge them by shuffle.
#pragma unroll
  for (int xor_lanes = kLanesPerToken; xor_lanes < 32; xor_lanes *= 2) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float m_other = __shfl_xor_sync(0xffffffffu, st.m[h], xor_lanes);
      const float l_other = __shfl_xor_sync(0xffffffffu, st.l[h], xor_lanes);
      const float m = fmaxf(st.m[h], m_other);
      const float a = m == negative_infinity() ? 0.f : exp2f(st.m[h] - m);
      const float c = m == negative_infinity() ? 0.f : exp2f(m_other - m);
      st.l[h] = st.l[h] * a + l_other * c;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const float o_other = __shfl_xor_sync(0xffffffffu, st.o[h][i], xor_lanes);
        st.o[h][i] = st.o[h][i] * a + o_other * c;
      }
      st.m[h] = m;
    }
  }
  // Warps through shared memory: [warp][group][128 outputs, m, l].
  consumers_sync();  // the previous item's readers are done with `shared`
  if (lane < kLanesPerToken) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      float* row = shared + (warp * kGroup + h) * (kHeadDim + 2);
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) row[dim + i] = st.o[h][i];
      if (lane == 0) {
        row[kHeadDim] = st.m[h];
        row[kHeadDim + 1] = st.l[h];
      }
    }
  }
  consumers_sync();
  float* out = p.attn_partials + static_cast<long long>(item) * kGroup * (kHeadDim + 1);
  for (int i = threadIdx.x; i < kGroup * kHeadDim; i += kConsumerWarps * 32) {
    const int h = i / kHeadDim, d = i % kHeadDim;
    float m = negative_infinity();
#pragma unroll
    for (int wi = 0; wi < kConsumerWarps; ++wi)
      m = fmaxf(m, shared[(wi * kGroup + h) * (kHeadDim + 2) + kHeadDim]);
    float l = 0.f, o = 0.f;
    if (m != negative_infinity()) {
#pragma unroll
      for (int wi = 0; wi < kConsumerWarps; ++wi) {
        const float* row = shared + (wi * kGroup + h) * (kHeadDim + 2);
        const float scale = exp2f(row[kHeadDim] - m);
        l += row[kHeadDim + 1] * scale;
        o += row[d] * scale;
      }
    }
    out[h * (kHeadDim + 1) + d] = l > 0.f ? o / l : 0.f;
    if (d == 0) out[h * (kHeadDim + 1) + kHeadDim] = l > 0.f ? m + __log2f(l) : negative_infinity();
  }
}

// The last CTA of (b, kv_head) merges the splits' states into attn_out (bf16).
__device__ __forceinline__ void attention_merge(const DecodeParams& p, int b, int kv_head) {
  const int splits = p.attention_splits;
  const float* in = p.attn_partials + static_cast<long long>((b * p.kv_heads + kv_head) * splits) *
                                          kGroup * (kHeadDim + 1);
  for (int i = threadIdx.x; i < kGroup * kHeadDim; i += kConsumerWarps * 32) {
    const int h = i / kHeadDim, d = i % kHeadDim;
    float m = negative_infinity();
    for (int s = 0; s < splits; ++s)
      m = fmaxf(m, __ldcg(in + (s * kGroup + h) * (kHeadDim + 1) + kHeadDim));
    float l = 0.f, o = 0.f;
    if (m != negative_infinity()) {
      for (int s = 0; s < splits; ++s) {
        const float* row = in + (s * kGroup + h) * (kHeadDim + 1);
        const float scale = exp2f(__ldcg(row + kHeadDim) - m);
        l += scale;
        o += __ldcg(row + d) * scale;
      }
    }
    p.attn_out[static_cast<long long>(b) * p.heads * kHeadDim + (kv_head * kGroup + h) * kHeadDim +
               d] = float_to_bf16(l > 0.f ? o / l : 0.f);
  }
}

// This CTA's items of layer `layer`, each followed by the merge when it completes its head.
__device__ __forceinline__ void attention_stage(const DecodeParams& p, int layer, int step,
                                                float* shared) {
  const LayerWeights& w = p.layers[layer];
  const int items = p.batch * p.kv_heads * p.attention_splits;
  unsigned* arrivals = p.counters + kCounterLayerBase + p.num_layers * kStagesPerLayer +
                       layer * kMaxBatch * p.kv_heads;
  __shared__ int last_arrival;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    attention_item(p, w, item, step, shared);
    const int head_index = item / p.attention_splits;  // b * kv_heads + kv_head
    __threadfence();
    consumers_sync();
    if (threadIdx.x == 0) {
      last_arrival = atomicAdd(arrivals + head_index, 1u) ==
                     static_cast<unsigned>(p.attention_splits * (step + 1) - 1);
      __threadfence();
    }
    consumers_sync();
    if (last_arrival) attention_merge(p, head_index / p.kv_heads, head_index % p.kv_heads);
  }
}

}  // namespace flare::llama::dev
