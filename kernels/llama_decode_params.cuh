// The whole-model decode megakernel's interface (issue 22, FlashFormer: paper 004), shared by
// the host (src/model/) and NVRTC (kernels/llama_decode.cuh): the parameter block, the row
// blocks every weight matrix is cut into, and the partition of those blocks over the CTAs.
//
// One decode step of a Llama model is one persistent launch: a CTA per SM, each with one
// producer warp streaming weight chunks through a ring of shared-memory stages (bulk async
// copies completing on mbarriers) and 8 consumer warps doing the math. Per layer:
//   QKV (RMSNorm folded into the input read, RoPE and the KV-cache append in the epilogue)
//   -> attention over the paged cache (split by request, KV head and KV chunk; the last CTA to
//      finish a head merges the splits) -> O projection + residual -> gate/up (RMSNorm folded,
//   SiLU(gate) * up in the epilogue) -> down projection + residual;
// then the final RMSNorm, the LM head and a deterministic greedy argmax or sample. Each of these
// stages ends in a device counter that the next one waits for (every stage reads the whole output
// of the one before, except attention, which is per head); weights carry no dependency, so the
// producer keeps loading the next operator's (and the next layer's) chunks across the waits.
//
// A matrix [N, K] (row-major, nn.Linear's layout, used in place) is cut into blocks of
// kBlockRows = 8 rows (the n dimension of mma.m16n8k16; the batch of at most 8 requests is the
// m dimension), and each block into chunks of at most 2 KiB a row: one chunk is one pipeline
// stage (8 bulk copies, one per row, into rows padded so tensor-core operand reads hit distinct
// banks). A chunk is 1024 columns of bf16 weights, or 4096 columns of 4-bit weights
// (flare/model/int4_weights.h's format; the layers' projections of a model are all bf16 or all
// 4-bit, FLARE_LLAMA_WEIGHT_BITS, and the LM head is bf16 in both), whose stage also holds the
// chunk's 32 scales of each row. The blocks of each operator are split evenly over the CTAs
// (contiguous ranges, sizes differing by at most one); a CTA owns whole rows, so every dot product
// is summed in one CTA in a fixed order: the step is deterministic.
#pragma once

#include "fixed_width_ints.cuh"

#ifdef __CUDACC_RTC__
#define FLARE_LLAMA_HD __host__ __device__
#else
#define FLARE_LLAMA_HD
#endif

namespace flare::llama {

constexpr int kBlockRows = 8;         // rows of a weight block (mma n)
constexpr int kMaxBatch = 8;          // requests per step (mma m, rows 8-15 unused)
constexpr int kChunkCols = 1024;      // columns of a bf16 chunk at most (2 KiB a row)
constexpr int kInt4ChunkCols = 4096;  // columns of a 4-bit chunk at most (2 KiB of codes a row)
constexpr int kInt4GroupCols = 128;   // columns sharing one bf16 scale
constexpr int kChunkRowBytes = 2048;  // a stage row's weight bytes at most
constexpr int kScaleRowBytes = 80;    // a 4-bit stage row's 32 scales, padded: rows 20 words
                                      // apart, so 4 lanes reading rows 2t (or 2t + 1) of a
                                      // group hit distinct banks
constexpr int kRowPadBytes = 64;      // shared row stride = chunk bytes + 64: rows g and g + 1
                                      // start half a 128-byte line apart (conflict-free reads)
constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp

// The operators whose weights stream through the pipeline, in the order of one layer.
enum Op : int { kOpQkv = 0, kOpO = 1, kOpGateUp = 2, kOpDown = 3, kOpLmHead = 4, kNumOps = 5 };

// Device counters, zeroed before each launch (one memset); stage s of layer l is
// counters[kCounterLayerBase + l * kStagesPerLayer + s], incremented once by every CTA in each
// step of the launch (step i waits for it to reach (i + 1) x gridDim.x).
enum Counter : int {
  kCounterEmbed = 0,
  kCounterLayerBase = 1,
};
enum LayerStage : int {
  kStageQkv = 0,
  kStageAttention = 1,
  kStageO = 2,
  kStageGateUp = 3,
  kStageDown = 4,
  kStagesPerLayer = 5,
};

// Per-layer weights (device pointers). A projection [N, K] is bf16 (unsigned short bits) or,
// in a 4-bit model, uint8 codes [N, K / 2] with bf16 scales [N, K / 128].
enum Projection : int { kWq, kWk, kWv, kWo, kWGate, kWUp, kWDown, kNumProjections };
struct LayerWeights {
  // q [heads * head_dim, hidden], k and v [kv_heads * head_dim, hidden], o [hidden, heads *
  // head_dim], gate and up [intermediate, hidden], down [hidden, intermediate]
  const void* w[kNumProjections];
  const unsigned short* scales[kNumProjections];  // 4-bit only (null for bf16)
  const unsigned short* attn_norm;                // [hidden]
  const unsigned short* mlp_norm;                 // [hidden]
  unsigned short* k_cache;  // [num_pages, page_size, kv_heads, head_dim] (NHD)
  unsigned short* v_cache;  // same
};

struct DecodeParams {
  // model
  const LayerWeights* layers;        // [num_layers], device memory
  const unsigned short* embed;       // [vocab, hidden]
  const unsigned short* final_norm;  // [hidden]
  const unsigned short* lm_head;     // [vocab, hidden] (the embedding when tied)
  const float* rope_inv_freq;        // [head_dim / 2], Llama-3.1 scaling applied on the host
  int num_layers;
  int head_dim;  // 64 or 128 (FLARE_LLAMA_HEAD_DIM)
  int hidden;
  int intermediate;
  int heads;
  int kv_heads;
  int vocab;
  float rms_eps;
  float sm_scale_log2;  // softmax scale * log2(e)

  // the step
  int batch;                  // 1..kMaxBatch
  const int32_t* tokens;      // [batch] input token ids
  const int32_t* positions;   // [batch] position of the input token = KV length before it
  const int32_t* kv_indptr;   // [batch + 1] into kv_indices
  const int32_t* kv_indices;  // page ids; request b's pages cover positions[b] + 1 tokens
  int num_kv_indices;
  int num_pages;
  int page_size;
  int attention_splits;  // KV chunks per (request, KV head)
  int num_steps;         // decode steps this launch runs: step i takes the previous step's
                         // tokens (tokens for i = 0) at positions[b] + i

  // sampling (kernels/llama_decode_sampling.cuh): temperature 0 is the greedy argmax
  float temperature;
  int top_k;                // 0: off
  float top_p;              // 1: off
  unsigned long long seed;  // the draws' key (kernels/sampling_noise.cuh)

  // outputs
  float* logits;         // [batch, vocab] float32
  int32_t* next_tokens;  // [num_steps, batch] the argmax of the logits (lowest id on ties), or
                         // the sample; logits are the last step's

  // scratch (LlamaDecoder owns it)
  float* x;                  // [kMaxBatch, hidden] residual stream, float32
  float* norm_partials;      // [(2 * num_layers + 1), gridDim.x, kMaxBatch] sums of squares
  float* q;                  // [kMaxBatch, heads, head_dim] roped queries
  float* attn_partials;      // [batch * kv_heads * splits, group, head_dim + 1]: o, lse
  unsigned short* attn_out;  // [kMaxBatch, heads * head_dim] bf16
  unsigned short* mlp_act;   // [kMaxBatch, intermediate] bf16: SiLU(gate) * up
  unsigned short* xg;        // [kMaxBatch, hidden] bf16(gamma * x): the next RMSNorm's input
                             // before its per-request scale (written with x)
  float* argmax_partials;    // [gridDim.x, kMaxBatch, 2]: best logit, its id (as float bits)
  float* sample_partials;    // [gridDim.x, kMaxBatch, 8]: the sampler's per-CTA partials
  unsigned* counters;        // stage counters, then attention arrivals, then the LM-head one
  int32_t* error;            // set (never cleared by the kernel) on an invalid index: 1 token
                             // id, 2 a page table that does not cover the position
  // Profiling (null normally): [gridDim.x][trace_events(num_layers)] globaltimer ns of each
  // CTA's stage boundaries: kernel start, embedding signalled, per layer (wait done, signalled)
  // for QKV, attention, O, gate/up, down; the LM head's wait done, the end.
  long long* trace;
};

FLARE_LLAMA_HD inline int trace_events(int num_layers) {
  return 4 + 2 * kStagesPerLayer * num_layers;
}

// The weight format of an operator: the model's (16 or 4 bits) for the layers' projections;
// the LM head is bf16 in both.
FLARE_LLAMA_HD inline int op_weight_bits(int model_bits, int op) {
  return op == kOpLmHead ? 16 : model_bits;
}

// Blocks and columns of each operator.
FLARE_LLAMA_HD inline int op_rows(const DecodeParams& p, int op) {
  switch (op) {
    case kOpQkv:
      return (p.heads + 2 * p.kv_heads) * p.head_dim;
    case kOpO:
      return p.hidden;
    case kOpGateUp:
      return p.intermediate;  // a block is 8 gate rows, then the same 8 up rows
    case kOpDown:
      return p.hidden;
    default:
      return p.vocab;
  }
}
FLARE_LLAMA_HD inline int op_cols(const DecodeParams& p, int op) {
  switch (op) {
    case kOpO:
      return p.heads * p.head_dim;
    case kOpDown:
      return p.intermediate;
    default:
      return p.hidden;
  }
}
FLARE_LLAMA_HD inline int op_blocks(const DecodeParams& p, int op) {
  return (op_rows(p, op) + kBlockRows - 1) / kBlockRows;
}
// Chunks per block row. bf16: equal widths (multiples of 64 columns) of at most kChunkCols.
// 4-bit: kInt4ChunkCols wide, the last one what is left (K is a multiple of 1024, so each
// chunk's scales are whole 16-byte copies).
FLARE_LLAMA_HD inline int op_chunks(int cols, int bits) {
  const int most = bits == 4 ? kInt4ChunkCols : kChunkCols;
  return (cols + most - 1) / most;
}
FLARE_LLAMA_HD inline int op_chunk_cols(int cols, int bits) {
  if (bits == 4) return cols < kInt4ChunkCols ? cols : kInt4ChunkCols;
  const int n = op_chunks(cols, bits);
  return ((cols + n - 1) / n + 63) / 64 * 64;
}
// A stage row's stride: the chunk's bytes + 64, so rows g and g + 1 start half a 128-byte line
// apart (chunk bytes are a multiple of 128).
FLARE_LLAMA_HD inline int chunk_row_stride(int chunk_cols, int bits) {
  return chunk_cols * bits / 8 + kRowPadBytes;
}

// The contiguous range [begin, end) of `count` items that part `part` of `parts` owns.
FLARE_LLAMA_HD inline void partition_range(int count, int parts, int part, int& begin, int& end) {
  const int base = count / parts, extra = count % parts;
  begin = part * base + (part < extra ? part : extra);
  end = begin + base + (part < extra ? 1 : 0);
}

// Row n (0..7) of QKV block `block`: a block holds 4 RoPE pairs of one head, row d and row
// d + head_dim / 2 for d = 4 (block % (head_dim / 8)) + n / 2, so the epilogue rotates a pair in
// one place.
FLARE_LLAMA_HD inline int qkv_block_row(int block, int n, int head_dim) {
  const int head = block / (head_dim / kBlockRows);
  const int d = (block % (head_dim / kBlockRows)) * 4 + n / 2;
  return head * head_dim + d + (n % 2) * (head_dim / 2);
}

// Dynamic shared memory: the stages; one area that holds attention's per-warp states during the
// attention stage and, in the other stages, the stage's activations (act_rows > 0: [act_rows]
// rows of act_cols bf16, padded like the weight rows; act_rows 0: products read them from L2);
// the consumers' reduction area; the barriers.
// A stage: 8 weight rows, then (4-bit) the 8 rows' scales.
FLARE_LLAMA_HD inline int stage_scale_offset() {
  return kBlockRows * (kChunkRowBytes + kRowPadBytes);
}
FLARE_LLAMA_HD inline int stage_bytes(int bits) {
  return stage_scale_offset() + (bits == 4 ? kBlockRows * kScaleRowBytes : 0);
}
FLARE_LLAMA_HD inline int attention_shared_bytes(int group, int head_dim) {
  return kConsumerWarps * group * (head_dim + 2) * 4;
}
// Two alternating [warp][request][row] float buffers of block sums, then inv_rms[kMaxBatch].
FLARE_LLAMA_HD inline int reduction_shared_bytes() {
  return 2 * kConsumerWarps * kMaxBatch * kBlockRows * 4 + 128;
}
// Rows are act_cols bf16 + 64 bytes (the 4-bit products' layout pads 32: llama_decode.cuh).
FLARE_LLAMA_HD inline int activation_shared_bytes(int act_rows, int act_cols) {
  return act_rows * (act_cols * 2 + kRowPadBytes);
}
FLARE_LLAMA_HD inline int union_shared_bytes(int group, int head_dim, int act_rows, int act_cols) {
  const int a = attention_shared_bytes(group, head_dim),
            b = activation_shared_bytes(act_rows, act_cols);
  return a > b ? a : b;
}
FLARE_LLAMA_HD inline int shared_bytes(int stages, int group, int head_dim, int act_rows,
                                       int act_cols, int bits) {
  return stages * stage_bytes(bits) + union_shared_bytes(group, head_dim, act_rows, act_cols) +
         reduction_shared_bytes() + 2 * stages * 8;
}

// Counters: stage counters, then one arrival counter per (layer, request, KV head), then one
// for the LM head's argmax (the sampler's phase counter), then the step counter (a step's next
// tokens written: the next step's embedding may read them).
FLARE_LLAMA_HD inline int counter_count(int num_layers, int kv_heads) {
  return kCounterLayerBase + num_layers * kStagesPerLayer + num_layers * kMaxBatch * kv_heads + 2;
}
FLARE_LLAMA_HD inline unsigned* lm_head_counter(const DecodeParams& p) {
  return p.counters + counter_count(p.num_layers, p.kv_heads) - 2;
}
FLARE_LLAMA_HD inline unsigned* step_counter(const DecodeParams& p) {
  return p.counters + counter_count(p.num_layers, p.kv_heads) - 1;
}

}  // namespace flare::llama
