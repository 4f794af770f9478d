// The whole-model decode megakernel (issue 22): one persistent launch per decode step of a
// Llama model. The design, the parameter block and the counters are described in
// kernels/llama_decode_params.cuh; the weight pipeline and the tensor-core product in
// llama_decode_matvec.cuh; attention in llama_decode_attention.cuh. This file holds the stages
// in order and their epilogues.
//
// Numerics (the reference in python/flare/_llama_reference.py follows the same rules): the
// residual stream is float32; RMSNorm(x) W^T is rsqrt(mean(x^2) + eps) * (bf16(gamma * x) W^T)
// (Hugging Face rounds x * rsqrt(...) to bf16 before gamma: the same math, one rounding fewer,
// and the stage that writes x can write the bf16 input of the next product); products
// accumulate in float32; q stays float32 after
// RoPE (float32 cos / sin), K and V are rounded to bf16 into the cache, the attention output and
// SiLU(gate) * up to bf16 (the inputs of the next products); logits are float32.
//
// Compile-time defines: FLARE_LLAMA_HEAD_DIM (64 or 128), FLARE_LLAMA_GROUP (query heads per KV
// head), FLARE_LLAMA_STAGES (pipeline depth), FLARE_LLAMA_ACT_ROWS and FLARE_LLAMA_ACT_COLS (the
// shared activation area: the batch capacity, 0 for none, and the widest input),
// FLARE_LLAMA_WEIGHT_BITS (the layers' projections: 16 for bf16, 4 for 4-bit codes and scales),
// FLARE_LLAMA_MULTI_STEP (1: the generate() kernel, whose stages loop over p.num_steps steps; 0:
// one step, the step() kernel. The loop keeps a few values live across every stage, which
// spills 16-104 bytes: the one-step kernel, whose loop folds away, has no spills).
#pragma once

#include "llama_decode_params.cuh"

#ifdef __CUDACC_RTC__

#include "llama_decode_attention.cuh"
#include "llama_decode_matvec.cuh"
#include "llama_decode_sampling.cuh"

namespace flare::llama::dev {

__device__ __forceinline__ void trace_mark(const DecodeParams& p, int event) {
  if (p.trace != nullptr && threadIdx.x == 0) {
    p.trace[static_cast<long long>(blockIdx.x) * trace_events(p.num_layers) + event] =
        static_cast<long long>(global_time_ns());
  }
}
// Trace event of layer `layer`'s stage `stage`: 0 its wait done, 1 its signal.
__device__ __forceinline__ int trace_event(int layer, int stage, int signalled) {
  return 2 + 2 * (layer * kStagesPerLayer + stage) + signalled;
}

__device__ __forceinline__ unsigned* stage_counter(const DecodeParams& p, int layer, int stage) {
  return p.counters + kCounterLayerBase + layer * kStagesPerLayer + stage;
}

// A product's input: bf16 activations [request][cols] written earlier in the step by other
// CTAs (gamma * x by the residual stages, the attention output, SiLU(gate) * up). With
// FLARE_LLAMA_ACT_ROWS > 0 each stage first copies them into shared memory (one L2 round trip
// a stage: SharedInput); otherwise every chunk's fragments come from L2 (Bf16Input), whose
// latency under the weight stream bounds each chunk (measured: 195 against 233 tok/s, 8B
// batch 1, H200).
constexpr int kActRows = FLARE_LLAMA_ACT_ROWS;
static_assert(kActRows == 0 || (kActRows >= 1 && kActRows <= kMaxBatch), "activation rows");

struct Bf16Input {
  const unsigned short* a;
  int cols;
  __device__ __forceinline__ uint4 operator()(int g, int column) const {
    return load_cg(a + static_cast<long long>(g) * cols + column);
  }
};

struct SharedInput {
  unsigned base;        // shared address of request 0's row
  unsigned row_stride;  // cols * 2 + kRowPadBytes: rows g and g + 1 half a line apart
  __device__ __forceinline__ uint4 operator()(int g, int column) const {
    return shared_load_v4(base + g * row_stride + column * 2);
  }
};

// The input of a stage that multiplies `cols` columns of `src` (bf16 [batch][cols], global).
__device__ __forceinline__ auto stage_input(const DecodeParams& p, const unsigned short* src,
                                            int cols, unsigned activation_area) {
  if constexpr (kActRows > 0) {
    const unsigned row_stride = static_cast<unsigned>(cols * 2 + kRowPadBytes);
    const int units = cols / 8;
    for (int i = threadIdx.x; i < p.batch * units; i += kConsumerWarps * 32) {
      const int b = i / units, u = i % units;
      const uint4 v = load_cg(src + static_cast<long long>(b) * cols + 8 * u);
      shared_store_v4(activation_area + b * row_stride + 16 * u, v);
    }
    consumers_sync();
    return SharedInput{activation_area, row_stride};
  } else {
    return Bf16Input{src, cols};
  }
}

// The 4-bit products' input (llama_decode_matvec.cuh): each 8-column unit in the 4-bit order.
// In shared memory, rows are cols * 2 + 32 bytes and unit u of a row sits at u ^ ((u >> 3) & 1):
// of the 8 lanes of a quarter warp (2 requests x 4 lanes t reading units 4t + j of a step),
// lanes t and t + 2 would otherwise hit the same banks. Needs cols % 1024 == 0 (4-bit models).
struct SharedInt4Input {
  unsigned base, row_stride;
  __device__ __forceinline__ uint4 operator()(int g, int unit) const {
    return shared_load_v4(base + g * row_stride + 16 * (unit ^ ((unit >> 3) & 1)));
  }
};
struct L2Int4Input {
  const unsigned short* a;
  int cols;
  __device__ __forceinline__ uint4 operator()(int g, int unit) const {
    return int4_unit_order(load_cg(a + static_cast<long long>(g) * cols + 8 * unit));
  }
};
__device__ __forceinline__ auto stage_input_int4(const DecodeParams& p, const unsigned short* src,
                                                 int cols, unsigned activation_area) {
  if constexpr (kActRows > 0) {
    const unsigned row_stride = static_cast<unsigned>(cols * 2 + 32);
    const int units = cols / 8;
    for (int i = threadIdx.x; i < p.batch * units; i += kConsumerWarps * 32) {
      const int b = i / units, u = i % units;
      const uint4 v = int4_unit_order(load_cg(src + static_cast<long long>(b) * cols + 8 * u));
      shared_store_v4(activation_area + b * row_stride + 16 * (u ^ ((u >> 3) & 1)), v);
    }
    consumers_sync();
    return SharedInt4Input{activation_area, row_stride};
  } else {
    return L2Int4Input{src, cols};
  }
}

// A stage's products, block by block: bf16 weights (the LM head, and the layers of a bf16
// model) with fragments prefetched a chunk ahead; 4-bit weights with the 4-bit input.
template <class LoadA>
struct Bf16Products {
  Activations<LoadA> x;
  __device__ __forceinline__ Bf16Products(const LoadA& load, int cols, int batch)
      : x(load, cols, batch) {}
  __device__ __forceinline__ void block(const Ring& ring, unsigned& it, float (&d)[4]) {
    block_product(ring, x, it, d);
  }
};
template <class Input>
struct Int4Products {
  Input input;
  int cols, batch;
  __device__ __forceinline__ void block(const Ring& ring, unsigned& it, float (&d)[4]) {
    block_product_int4(ring, input, cols, batch, it, d);
  }
};
template <int kBits>
__device__ __forceinline__ auto stage_products(const DecodeParams& p, const unsigned short* src,
                                               int cols, unsigned activation_area) {
  if constexpr (kBits == 4) {
    const auto input = stage_input_int4(p, src, cols, activation_area);
    return Int4Products<decltype(input)>{input, cols, p.batch};
  } else {
    const auto input = stage_input(p, src, cols, activation_area);
    return Bf16Products<decltype(input)>(input, cols, p.batch);
  }
}

// RMSNorm's per-request scale: inv_rms[b] = rsqrt(mean(x_b^2) + eps) from the CTAs' partial
// sums of squares of `version`, added in CTA order by warp b (deterministic). The normed
// stages multiply by bf16(gamma * x) (written with x) and apply this scale to their outputs:
// RMSNorm(x) W^T = inv_rms * ((gamma * x) W^T). Called after a stage's first block of products
// (the partial sums' latency overlaps them), before the reduction's barrier publishes it.
__device__ __forceinline__ void compute_inv_rms(const DecodeParams& p, int version,
                                                float* inv_rms) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp < p.batch) {
    const float* partials =
        p.norm_partials + static_cast<long long>(version) * gridDim.x * kMaxBatch;
    float s = 0.f;
    for (int c = lane; c < static_cast<int>(gridDim.x); c += 32)
      s += __ldcg(partials + c * kMaxBatch + warp);
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) inv_rms[warp] = rsqrtf(s / p.hidden + p.rms_eps);
  }
}

// Sum of `v` over the 8 consumer threads of one request (threads 8g..8g+7), to thread 8g.
__device__ __forceinline__ float sum_over_rows(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  return v;
}

// Stage 0: x = embedding rows of the tokens (this CTA's column range), bf16(gamma * x) for the
// first layer's RMSNorm, and the partial sums of squares. Step i > 0 of a launch embeds step
// i - 1's next tokens.
__device__ __forceinline__ void embed_stage(const DecodeParams& p, float* scratch, int step) {
  int begin, end;
  partition_range(p.hidden / 8, gridDim.x, blockIdx.x, begin, end);
  for (int b = 0; b < kMaxBatch; ++b) {
    float s = 0.f;
    if (b < p.batch) {
      const int token = step == 0 ? p.tokens[b] : __ldcg(p.next_tokens + (step - 1) * p.batch + b);
      const bool ok = token >= 0 && token < p.vocab;
      if (!ok && threadIdx.x == 0) atomicExch(p.error, 1);
      for (int u = begin + threadIdx.x; u < end; u += kConsumerWarps * 32) {
        float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (ok) {
          const uint4 e = __ldg(
              reinterpret_cast<const uint4*>(p.embed + static_cast<long long>(token) * p.hidden) +
              u);
          bf16x8_to_float(e, v);
        }
        float* dst = p.x + static_cast<long long>(b) * p.hidden + 8 * u;
        *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
        float gamma[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(p.layers[0].attn_norm) + u), gamma);
        *reinterpret_cast<uint4*>(p.xg + static_cast<long long>(b) * p.hidden + 8 * u) =
            make_uint4(float2_to_16bit2<kCodeBF16>(gamma[0] * v[0], gamma[1] * v[1]),
                       float2_to_16bit2<kCodeBF16>(gamma[2] * v[2], gamma[3] * v[3]),
                       float2_to_16bit2<kCodeBF16>(gamma[4] * v[4], gamma[5] * v[5]),
                       float2_to_16bit2<kCodeBF16>(gamma[6] * v[6], gamma[7] * v[7]));
#pragma unroll
        for (int i = 0; i < 8; ++i) s += v[i] * v[i];
      }
    }
#pragma unroll
    for (int o = 16; o >= 1; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = s;
    consumers_sync();
    if (threadIdx.x == 0) {
      float total = 0.f;
      for (int w = 0; w < kConsumerWarps; ++w) total += scratch[w];
      p.norm_partials[blockIdx.x * kMaxBatch + b] = total;
    }
    consumers_sync();
  }
  consumers_signal(p.counters + kCounterEmbed);
}

// A residual projection (O or down): x += W a for this CTA's blocks, bf16(gamma_next * x) for
// the next RMSNorm, and the partial sums of squares of the new rows into norm_partials[version].
__device__ __forceinline__ void residual_stage(const DecodeParams& p, const Ring& ring, int op,
                                               int version, const unsigned short* src,
                                               const unsigned short* gamma_next, unsigned& it,
                                               float* reduce, unsigned& parity,
                                               unsigned activation_area) {
  auto products = stage_products<kWeightBits>(p, src, op_cols(p, op), activation_area);
  int begin, end;
  partition_range(op_blocks(p, op), gridDim.x, blockIdx.x, begin, end);
  const int g = threadIdx.x / kBlockRows, n = threadIdx.x % kBlockRows;
  float squares = 0.f;
  for (int block = begin; block < end; ++block) {
    float d[4];
    products.block(ring, it, d);
    const float v = reduce_block(reduce, parity, d);
    if (threadIdx.x < kMaxBatch * kBlockRows && g < p.batch) {
      const long long at = static_cast<long long>(g) * p.hidden + block * kBlockRows + n;
      const float updated = __ldcg(p.x + at) + v;
      p.x[at] = updated;
      p.xg[at] = float_to_bf16(bf16_to_float(gamma_next[block * kBlockRows + n]) * updated);
      squares += updated * updated;
    }
  }
  if (threadIdx.x < kMaxBatch * kBlockRows) {
    squares = sum_over_rows(squares);
    if (n == 0) {
      p.norm_partials[(static_cast<long long>(version) * gridDim.x + blockIdx.x) * kMaxBatch + g] =
          squares;
    }
  }
}

// QKV with RoPE: q to p.q (float32), k and v into the cache slot of the request's position.
__device__ __forceinline__ void qkv_stage(const DecodeParams& p, const Ring& ring, int layer,
                                          int step, unsigned& it, float* reduce, unsigned& parity,
                                          float* inv_rms, unsigned activation_area) {
  const LayerWeights& w = p.layers[layer];
  auto products = stage_products<kWeightBits>(p, p.xg, p.hidden, activation_area);
  int begin, end;
  partition_range(op_blocks(p, kOpQkv), gridDim.x, blockIdx.x, begin, end);
  const int g = threadIdx.x / kBlockRows, n = threadIdx.x % kBlockRows;
  const int q_rows = p.heads * kHeadDim, kv_rows = p.kv_heads * kHeadDim;
  for (int block = begin; block < end; ++block) {
    float d[4];
    products.block(ring, it, d);
    if (block == begin) compute_inv_rms(p, 2 * layer, inv_rms);
    // inv_rms is read after reduce_block's barrier, which publishes it.
    const float sum = reduce_block(reduce, parity, d);
    const float v = sum * inv_rms[g % kMaxBatch];
    const float partner = __shfl_xor_sync(0xffffffffu, v, 1);
    if (threadIdx.x >= kMaxBatch * kBlockRows || g >= p.batch) continue;
    const int row = qkv_block_row(block, n, kHeadDim);
    const int pos = p.positions[g] + step;
    float out = v;
    if (row < q_rows + kv_rows) {  // q or k: rotate the pair (d, d + head_dim / 2)
      const int pair = (row % kHeadDim) % (kHeadDim / 2);
      // The angle is float32 (pos * inv_freq rounded, as the reference forms it); its turns
      // are reduced in double and sincospif needs no Payne-Hanek table (local memory).
      const float angle = static_cast<float>(pos) * p.rope_inv_freq[pair];
      const double turns = static_cast<double>(angle) * 0.15915494309189535;
      float s, c;
      sincospif(static_cast<float>(2.0 * (turns - rint(turns))), &s, &c);
      out = n % 2 == 0 ? v * c - partner * s : v * c + partner * s;
    }
    if (row < q_rows) {
      p.q[static_cast<long long>(g) * q_rows + row] = out;
      continue;
    }
    const long long slot = kv_slot(p, g, pos);
    if (slot < 0) continue;
    const bool is_k = row < q_rows + kv_rows;
    const int r = row - q_rows - (is_k ? 0 : kv_rows);  // kv_head * 128 + d
    (is_k ? w.k_cache : w.v_cache)[slot * kv_rows + r] = float_to_bf16(out);
  }
}

// Gate/up: SiLU(gate) * up to mlp_act (bf16).
__device__ __forceinline__ void gate_up_stage(const DecodeParams& p, const Ring& ring, int layer,
                                              unsigned& it, float* reduce, unsigned& parity,
                                              float* inv_rms, unsigned activation_area) {
  auto products = stage_products<kWeightBits>(p, p.xg, p.hidden, activation_area);
  int begin, end;
  partition_range(op_blocks(p, kOpGateUp), gridDim.x, blockIdx.x, begin, end);
  const int g = threadIdx.x / kBlockRows, n = threadIdx.x % kBlockRows;
  for (int block = begin; block < end; ++block) {
    float d[4];
    products.block(ring, it, d);
    if (block == begin) compute_inv_rms(p, 2 * layer + 1, inv_rms);
    const float gate_sum = reduce_block(reduce, parity, d);  // its barrier publishes inv_rms
    const float r = inv_rms[g % kMaxBatch];
    const float gate = gate_sum * r;
    products.block(ring, it, d);
    const float up = reduce_block(reduce, parity, d) * r;
    if (threadIdx.x < kMaxBatch * kBlockRows && g < p.batch) {
      const float silu = gate / (1.f + __expf(-gate));
      p.mlp_act[static_cast<long long>(g) * p.intermediate + block * kBlockRows + n] =
          float_to_bf16(silu * up);
    }
  }
}

// LM head: logits, then the next tokens: this CTA's best (logit, id) per request and the last
// CTA's argmax, or with a temperature the sampler's rounds.
__device__ __forceinline__ void lm_head_stage(const DecodeParams& p, const Ring& ring, int step,
                                              unsigned& phase, unsigned& it, float* reduce,
                                              unsigned& parity, float* inv_rms,
                                              unsigned activation_area) {
  auto products = stage_products<16>(p, p.xg, p.hidden, activation_area);
  int begin, end;
  partition_range(op_blocks(p, kOpLmHead), gridDim.x, blockIdx.x, begin, end);
  const int g = threadIdx.x / kBlockRows, n = threadIdx.x % kBlockRows;
  float best = negative_infinity();
  int best_id = 0x7fffffff;
  for (int block = begin; block < end; ++block) {
    float d[4];
    products.block(ring, it, d);
    if (block == begin) compute_inv_rms(p, 2 * p.num_layers, inv_rms);
    const float sum = reduce_block(reduce, parity, d);  // its barrier publishes inv_rms
    const float v = sum * inv_rms[g % kMaxBatch];
    const int row = block * kBlockRows + n;
    if (threadIdx.x < kMaxBatch * kBlockRows && g < p.batch && row < p.vocab) {
      p.logits[static_cast<long long>(g) * p.vocab + row] = v;
      if (v > best) {  // rows rise within a thread: ties keep the lower id; NaN never wins
        best = v;
        best_id = row;
      }
    }
  }
  if (p.temperature > 0.f) {  // sampled: every CTA takes part (llama_decode_sampling.cuh)
    consumers_sync();         // this CTA's logits are written
    sample_tokens(p, reduce, step, phase);
    return;
  }
  if (threadIdx.x < kMaxBatch * kBlockRows) {
#pragma unroll
    for (int o = 1; o < kBlockRows; o *= 2) {
      const float other = __shfl_xor_sync(0xffffffffu, best, o);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (other > best || (other == best && other_id < best_id)) {
        best = other;
        best_id = other_id;
      }
    }
    if (n == 0) {
      float* slot = p.argmax_partials + (static_cast<long long>(blockIdx.x) * kMaxBatch + g) * 2;
      slot[0] = best;
      slot[1] = __int_as_float(best_id);
    }
  }
  __threadfence();
  consumers_sync();
  __shared__ int last;
  if (threadIdx.x == 0) {
    last = atomicAdd(lm_head_counter(p), 1u) == gridDim.x * (step + 1) - 1;
    __threadfence();
  }
  consumers_sync();
  if (!last) return;
  if (threadIdx.x < p.batch) {
    float top = negative_infinity();
    int top_id = 0x7fffffff;
    for (int c = 0; c < static_cast<int>(gridDim.x); ++c) {
      const float* slot =
          p.argmax_partials + (static_cast<long long>(c) * kMaxBatch + threadIdx.x) * 2;
      const float v = __ldcg(slot);
      const int id = __float_as_int(__ldcg(slot + 1));
      if (v > top || (v == top && id < top_id)) {
        top = v;
        top_id = id;
      }
    }
    p.next_tokens[step * p.batch + threadIdx.x] =
        top_id == 0x7fffffff ? -1 : top_id;  // -1: every logit NaN
  }
  consumers_signal(step_counter(p));  // the next step's embedding reads them
}

__device__ __forceinline__ void consume_all(const DecodeParams& p, const Ring& ring,
                                            float* attention_shared, float* reduce,
                                            float* inv_rms) {
  const unsigned activation_area = shared_address(attention_shared);  // shared with attention
  unsigned it = 0, parity = 0, phase = 0;
  const unsigned grid = gridDim.x;
  for (int step = 0; step < launch_steps(p); ++step) {
    // Step i > 0 embeds step i - 1's tokens, once they are written.
    if (step > 0) consumers_wait(step_counter(p), static_cast<unsigned>(step), p.error);
    trace_mark(p, 0);
    embed_stage(p, reduce, step);
    trace_mark(p, 1);
    // Each stage waits for the whole previous one (its counter reaching the grid size once per
    // step so far), runs, and signals its own counter.
    const unsigned target = grid * (step + 1);
    const auto wait = [&](const unsigned* counter, int layer, int stage) {
      consumers_wait(counter, target, p.error);
      trace_mark(p, trace_event(layer, stage, 0));
    };
    const auto signal = [&](int layer, int stage) {
      consumers_signal(stage_counter(p, layer, stage));
      trace_mark(p, trace_event(layer, stage, 1));
    };
    for (int layer = 0; layer < p.num_layers; ++layer) {
      wait(layer == 0 ? p.counters + kCounterEmbed : stage_counter(p, layer - 1, kStageDown), layer,
           kStageQkv);
      qkv_stage(p, ring, layer, step, it, reduce, parity, inv_rms, activation_area);
      signal(layer, kStageQkv);

      wait(stage_counter(p, layer, kStageQkv), layer, kStageAttention);
      attention_stage(p, layer, step, attention_shared);
      signal(layer, kStageAttention);

      wait(stage_counter(p, layer, kStageAttention), layer, kStageO);
      residual_stage(p, ring, kOpO, 2 * layer + 1, p.attn_out, p.layers[layer].mlp_norm, it, reduce,
                     parity, activation_area);
      signal(layer, kStageO);

      wait(stage_counter(p, layer, kStageO), layer, kStageGateUp);
      gate_up_stage(p, ring, layer, it, reduce, parity, inv_rms, activation_area);
      signal(layer, kStageGateUp);

      wait(stage_counter(p, layer, kStageGateUp), layer, kStageDown);
      residual_stage(p, ring, kOpDown, 2 * layer + 2, p.mlp_act,
                     layer + 1 < p.num_layers ? p.layers[layer + 1].attn_norm : p.final_norm, it,
                     reduce, parity, activation_area);
      signal(layer, kStageDown);
    }
    consumers_wait(stage_counter(p, p.num_layers - 1, kStageDown), target, p.error);
    trace_mark(p, trace_events(p.num_layers) - 2);
    lm_head_stage(p, ring, step, phase, it, reduce, parity, inv_rms, activation_area);
    trace_mark(p, trace_events(p.num_layers) - 1);
  }
}

}  // namespace flare::llama::dev

extern "C" __global__ void __launch_bounds__(flare::llama::kThreads, 1)
    flare_llama_decode(const flare::llama::DecodeParams p) {
  using namespace flare::llama;
  extern __shared__ __align__(128) unsigned char shared[];
  constexpr int kStages = dev::kStages;
  const int area_bytes =
      union_shared_bytes(dev::kGroup, dev::kHeadDim, dev::kActRows, FLARE_LLAMA_ACT_COLS);
  float* attention_area =
      reinterpret_cast<float*>(shared + kStages * stage_bytes(dev::kWeightBits));
  float* reduce = attention_area + area_bytes / 4;
  float* inv_rms = reduce + 2 * kConsumerWarps * kMaxBatch * kBlockRows;
  const unsigned barriers =
      dev::shared_address(shared) +
      static_cast<unsigned>(shared_bytes(kStages, dev::kGroup, dev::kHeadDim, dev::kActRows,
                                         FLARE_LLAMA_ACT_COLS, dev::kWeightBits) -
                            2 * kStages * 8);
  const dev::Ring ring{dev::shared_address(shared), barriers, barriers + 8 * kStages};
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) {
      flare::sm90::barrier_init(ring.full + 8 * i, 1);
      flare::sm90::barrier_init(ring.empty + 8 * i, kConsumerWarps);
    }
    flare::sm90::barrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x / 32 == kConsumerWarps) {
    dev::produce_all(p, ring);
  } else {
    dev::consume_all(p, ring, attention_area, reduce, inv_rms);
  }
}

#endif  // __CUDACC_RTC__
