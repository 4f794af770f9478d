// The megakernel's weight stream (kernels/llama_decode_params.cuh): the producer warp's loop of
// bulk copies and the consumers' tensor-core product of a weight block with the batch.
//
// Both sides walk the same sequence: for each layer, the CTA's blocks of QKV, O, gate/up (a gate
// block, then the up block of the same rows) and down; then its blocks of the LM head. Each
// block is cut into chunks, one chunk a stage. Stage i of the ring is used by chunks i,
// i + kStages, ...: `full` completes when a chunk's bytes land, `empty` when the 8 consumer
// warps are done reading it.
//
// The product. mma.m16n8k16 with the batch as A and the 8 weight rows as B: lane (g = lane / 4,
// t = lane % 4) reads 16 contiguous bytes (columns 8t..8t+7 of a 32-column step) of weight row g
// and of request g's activations, and feeds them as two k16 products whose k order is permuted
// the same way on both sides (the sum over k does not care). The activation vector as loaded is
// the A operand of both products: A rows g hold columns 8t + {0, 1} (k 2t + {0, 1}) and
// 8t + {4, 5} (k 2t + 8 + {0, 1}), multiplied by the weights of those columns in the first
// product; A rows g + 8 hold 8t + {2, 3} and 8t + {6, 7}, against theirs in the second; the
// other half of each product's C is ignored. Lane (g, t) ends with the dot products of request
// g with rows 2t and 2t + 1. Warps split a chunk's 32-column steps;
// the 8 partial sums of each output are added in warp order once per block.
#pragma once

#include "llama_decode_sync.cuh"

namespace flare::llama::dev {

constexpr int kStages = FLARE_LLAMA_STAGES;
constexpr int kStepsPerWarp = kChunkCols / 32 / kConsumerWarps;

// The shared-memory ring: stage buffers and their barriers.
struct Ring {
  unsigned stages;  // shared address of stage 0
  unsigned full;    // shared address of the kStages `full` barriers (8 bytes each)
  unsigned empty;   // then the kStages `empty` barriers
};

// The rows of block `block` of `op` in layer `layer` (`half` 1: the up projection's block), as
// byte addresses: row n starts at first + (n / 2) * pair_step + (n % 2) * odd_offset, and its
// 4-bit scales likewise from scales_first. A QKV block's rows lie in one head of one matrix
// (qkv_block_row); the others are 8 consecutive rows.
struct BlockRows {
  const unsigned char* first;
  const unsigned char* scales_first;  // 4-bit only
  long long pair_step, odd_offset;    // in rows
  long long row_bytes, scale_row_bytes;
  __device__ __forceinline__ long long row(int n) const {
    return (n / 2) * pair_step + (n % 2) * odd_offset;
  }
};
__device__ __forceinline__ BlockRows block_rows(const DecodeParams& p, int op, int layer, int block,
                                                int half) {
  const long long cols = op_cols(p, op);
  BlockRows r{nullptr,
              nullptr,
              2,
              1,
              cols * op_weight_bits(kWeightBits, op) / 8,
              cols / kInt4GroupCols * 2};
  long long first_row = static_cast<long long>(block) * kBlockRows;
  int matrix = op == kOpO ? kWo : op == kOpDown ? kWDown : half == 0 ? kWGate : kWUp;
  if (op == kOpLmHead) {
    r.first = reinterpret_cast<const unsigned char*>(p.lm_head) + first_row * r.row_bytes;
    return r;
  }
  if (op == kOpQkv) {
    int row = qkv_block_row(block, 0, kHeadDim);
    const int q_rows = p.heads * kHeadDim, kv_rows = p.kv_heads * kHeadDim;
    matrix = kWq;
    if (row >= q_rows + kv_rows) {
      matrix = kWv;
      row -= q_rows + kv_rows;
    } else if (row >= q_rows) {
      matrix = kWk;
      row -= q_rows;
    }
    first_row = row;
    r.pair_step = 1;
    r.odd_offset = kHeadDim / 2;
  }
  const LayerWeights& w = p.layers[layer];
  r.first = static_cast<const unsigned char*>(w.w[matrix]) + first_row * r.row_bytes;
  if constexpr (kWeightBits == 4) {
    r.scales_first =
        reinterpret_cast<const unsigned char*>(w.scales[matrix]) + first_row * r.scale_row_bytes;
  }
  return r;
}

// The producer (one lane): every chunk of this CTA's blocks of `op`, in the consumers' order.
// A chunk is 8 row copies of its weight bytes and, for 4-bit weights, 8 copies of the rows'
// scales of its groups into the stage's tail.
__device__ __forceinline__ void produce_op(const DecodeParams& p, const Ring& ring, int op,
                                           int layer, unsigned& it, unsigned long long policy) {
  const int bits = op_weight_bits(kWeightBits, op);
  const int cols = op_cols(p, op), chunk = op_chunk_cols(cols, bits),
            chunks = op_chunks(cols, bits);
  const unsigned row_stride = static_cast<unsigned>(chunk_row_stride(chunk, bits));
  int begin, end;
  partition_range(op_blocks(p, op), gridDim.x, blockIdx.x, begin, end);
  const int halves = op == kOpGateUp ? 2 : 1;
  for (int block = begin; block < end; ++block) {
    for (int half = 0; half < halves; ++half) {
      const BlockRows rows = block_rows(p, op, layer, block, half);
      for (int c = 0; c < chunks; ++c, ++it) {
        const unsigned stage = it % kStages;
        if (it >= kStages) sm90::barrier_wait(ring.empty + 8 * stage, (it / kStages - 1) & 1);
        const int width = min(chunk, cols - c * chunk);
        const unsigned bytes = static_cast<unsigned>(width * bits / 8);
        const unsigned scale_bytes =
            bits == 4 ? static_cast<unsigned>(width / kInt4GroupCols * 2) : 0u;
        const unsigned full = ring.full + 8 * stage;
        sm90::barrier_arrive_expect(full, (bytes + scale_bytes) * kBlockRows);
        const unsigned dst = ring.stages + stage * static_cast<unsigned>(stage_bytes(kWeightBits));
        const long long offset = static_cast<long long>(c) * chunk * bits / 8;
#pragma unroll
        for (int n = 0; n < kBlockRows; ++n) {
          bulk_load(dst + n * row_stride, rows.first + rows.row(n) * rows.row_bytes + offset, bytes,
                    full, policy);
        }
        if (bits == 4) {
          const long long scale_offset = static_cast<long long>(c) * chunk / kInt4GroupCols * 2;
#pragma unroll
          for (int n = 0; n < kBlockRows; ++n) {
            bulk_load(dst + stage_scale_offset() + n * kScaleRowBytes,
                      rows.scales_first + rows.row(n) * rows.scale_row_bytes + scale_offset,
                      scale_bytes, full, policy);
          }
        }
      }
    }
  }
}

__device__ __forceinline__ void produce_all(const DecodeParams& p, const Ring& ring) {
  if (threadIdx.x % 32 != 0) return;
  const unsigned long long policy = evict_first_policy();
  unsigned it = 0;
  for (int step = 0; step < launch_steps(p); ++step) {  // weights carry no step dependency
    for (int layer = 0; layer < p.num_layers; ++layer) {
      for (int op = kOpQkv; op <= kOpDown; ++op) produce_op(p, ring, op, layer, it, policy);
    }
    produce_op(p, ring, kOpLmHead, 0, it, policy);
  }
}

// The activation fragments: lane (g, t) of warp w needs, for chunk c and each of its steps
// s = w + 8 i, request g's 8 activations at column c * chunk + 32 s + 8 t. They are loaded a
// chunk ahead of their use (L2 latency hidden behind the current chunk's products); a block's
// last chunk loads the first chunk of the next block (the same activations for every block),
// so no block starts with a wait on L2.
template <class LoadA>
__device__ __forceinline__ void load_fragments(const LoadA& load_a, int cols, int batch, int c,
                                               uint4 (&a)[kStepsPerWarp]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int chunk = op_chunk_cols(cols, 16);
  const int steps = min(chunk, cols - c * chunk) / 32;
#pragma unroll
  for (int i = 0; i < kStepsPerWarp; ++i) {
    const int s = warp + kConsumerWarps * i;
    a[i] = s < steps && g < batch ? load_a(g, c * chunk + 32 * s + 8 * t) : make_uint4(0, 0, 0, 0);
  }
}

template <class LoadA>
struct Activations {
  LoadA load;
  int cols, batch;
  uint4 pending[kStepsPerWarp];  // the next chunk's fragments

  __device__ __forceinline__ Activations(const LoadA& load_a, int cols_, int batch_)
      : load(load_a), cols(cols_), batch(batch_) {
    load_fragments(load, cols, batch, 0, pending);
  }
};

// One chunk's tensor-core steps: wait for its stage, multiply, release the stage. Four
// accumulators (step parity x the two k16 halves) keep four independent mma chains.
__device__ __forceinline__ void chunk_product(const Ring& ring, unsigned row_stride, int steps,
                                              unsigned it, const uint4 (&a)[kStepsPerWarp],
                                              float (&acc)[4][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned stage = it % kStages;
  sm90::barrier_wait(ring.full + 8 * stage, (it / kStages) & 1);
  const unsigned base = ring.stages + stage * static_cast<unsigned>(stage_bytes(kWeightBits)) +
                        g * row_stride + 16 * t;
#pragma unroll
  for (int i = 0; i < kStepsPerWarp; ++i) {
    const int s = warp + kConsumerWarps * i;
    if (s < steps) {
      const uint4 w = shared_load_v4(base + 64 * s);
      // The fragment as loaded is the A operand (no register moves): rows g take columns
      // (8t + {0, 1}, 8t + {4, 5}) against (w.x, w.z), rows g + 8 (8t + {2, 3}, 8t + {6, 7})
      // against (w.y, w.w); each product's other 8 rows are ignored.
      const unsigned fragment[4] = {a[i].x, a[i].y, a[i].z, a[i].w};
      mma::mma_16816<kCodeBF16>(acc[2 * (i % 2)], fragment, w.x, w.z);
      mma::mma_16816<kCodeBF16>(acc[2 * (i % 2) + 1], fragment, w.y, w.w);
    }
  }
  __syncwarp();
  if (lane == 0) sm90::barrier_arrive(ring.empty + 8 * stage);
}

// One block's products in the consumers. Returns lane (g, t)'s sums for rows 2t, 2t + 1 of
// request g (d[0], d[1]).
template <class LoadA>
__device__ __forceinline__ void block_product(const Ring& ring, Activations<LoadA>& x, unsigned& it,
                                              float (&d)[4]) {
  const int chunk = op_chunk_cols(x.cols, 16), chunks = op_chunks(x.cols, 16);
  const unsigned row_stride = static_cast<unsigned>(chunk_row_stride(chunk, 16));
  float acc[4][4] = {};
  for (int c = 0; c < chunks; ++c) {
    uint4 current[kStepsPerWarp];
#pragma unroll
    for (int i = 0; i < kStepsPerWarp; ++i) current[i] = x.pending[i];
    load_fragments(x.load, x.cols, x.batch, c + 1 < chunks ? c + 1 : 0, x.pending);
    chunk_product(ring, row_stride, min(chunk, x.cols - c * chunk) / 32, it++, current, acc);
  }
  // Chains 0 and 2 hold rows g (C elements 0, 1), chains 1 and 3 rows g + 8 (elements 2, 3).
  d[0] = (acc[0][0] + acc[1][2]) + (acc[2][0] + acc[3][2]);
  d[1] = (acc[0][1] + acc[1][3]) + (acc[2][1] + acc[3][3]);
  d[2] = d[3] = 0.f;
}

// --- 4-bit weights (flare/model/int4_weights.h: column 2j in the low nibble of byte j, code q
// standing for q - 8, one bf16 scale per row and 128 columns).
//
// A warp step is 128 columns (one scale group): lane (g, t) reads 16 bytes of row g, the 32
// codes of columns 32t .. 32t + 31, and request g's 32 activations of the same columns (64
// bytes), and feeds them as 8 k16 products. Within each 8-column unit the k order is permuted
// the same way on both sides: the 32-bit code word w of a unit holds columns 0..7 in nibbles
// 0..7, and (w >> 4j) & 0x000F000F is the pair (column j, column j + 4) for j = 0..3, so the
// activations of a unit are laid out as the bf16 pairs (0, 4), (1, 5), (2, 6), (3, 7)
// (int4_unit_order). The tensor cores multiply by q - 8 itself (bf16(0x4300 | q) = 128 + q,
// minus 136, exact) and each step's sums are scaled in float32 by the group's scale: the
// products use the 4-bit weights scale * (q - 8) unrounded, as float32 dequantization does.
constexpr unsigned kBf16x2Minus136 = 0xC308C308u;

__device__ __forceinline__ unsigned bf16x2_add(unsigned a, unsigned b) {
  unsigned d;
  asm("add.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// The 8 codes of a word as 4 bf16 pairs (q - 8 of column j, of column j + 4).
__device__ __forceinline__ void unbias_unit(unsigned word, unsigned (&b)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    // (w >> 4j) & 0x000F000F | 0x43004300 = 128 + q as one lop3 (the compiler makes two)
    unsigned biased;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n"
        : "=r"(biased)
        : "r"(word >> (4 * j)), "r"(0x000F000Fu), "r"(0x43004300u));
    b[j] = bf16x2_add(biased, kBf16x2Minus136);
  }
}
// Eight bf16 of natural order (pairs (0, 1), (2, 3), (4, 5), (6, 7)) -> the 4-bit order.
__device__ __forceinline__ uint4 int4_unit_order(const uint4& v) {
  return make_uint4(__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632),
                    __byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632));
}
__device__ __forceinline__ float shared_bf16(unsigned address) {
  unsigned short bits;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(bits) : "r"(address));
  return bf16_to_float(bits);
}

// One 4-bit chunk's steps. `input(g, unit)` returns request g's 8 activations of 8-column unit
// `unit` of the product's input in the 4-bit order; `unit0` is the chunk's first unit. Adds
// lane (g, t)'s sums of request g with rows 2t, 2t + 1 to acc[0], acc[1].
template <class Input>
__device__ __forceinline__ void chunk_product_int4(const Ring& ring, unsigned row_stride, int steps,
                                                   unsigned it, const Input& input, int unit0,
                                                   int batch, float (&acc)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const unsigned stage = it % kStages;
  sm90::barrier_wait(ring.full + 8 * stage, (it / kStages) & 1);
  const unsigned stage_base = ring.stages + stage * static_cast<unsigned>(stage_bytes(kWeightBits));
  const unsigned codes = stage_base + g * row_stride + 16 * t;
  // Rows 2t and 2t + 1's scales: 4 lanes t read 4 rows 40 words apart (distinct banks).
  const unsigned scales = stage_base + stage_scale_offset() + 2 * t * kScaleRowBytes;
  const auto step = [&](int s) {
    const uint4 w = shared_load_v4(codes + 64 * s);
    const unsigned words[4] = {w.x, w.y, w.z, w.w};
    // Two mma chains of this group. The fragment as loaded is the A operand (no register
    // moves): rows g take pairs (0, 4), (2, 6) of the unit against b[0], b[2] (chain 0, C
    // elements 0, 1), rows g + 8 pairs (1, 5), (3, 7) against b[1], b[3] (chain 1, C elements
    // 2, 3); each product's other 8 rows are ignored.
    float sums[2][4] = {};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const uint4 a = g < batch ? input(g, unit0 + 16 * s + 4 * t + u) : make_uint4(0, 0, 0, 0);
      unsigned b[4];
      unbias_unit(words[u], b);
      const unsigned fragment[4] = {a.x, a.y, a.z, a.w};
      mma::mma_16816<kCodeBF16>(sums[0], fragment, b[0], b[2]);
      mma::mma_16816<kCodeBF16>(sums[1], fragment, b[1], b[3]);
    }
    acc[0] = fmaf(sums[0][0] + sums[1][2], shared_bf16(scales + 2 * s), acc[0]);
    acc[1] = fmaf(sums[0][1] + sums[1][3], shared_bf16(scales + kScaleRowBytes + 2 * s), acc[1]);
  };
  constexpr int kSteps = kInt4ChunkCols / kInt4GroupCols / kConsumerWarps;
  if (steps == kSteps * kConsumerWarps) {  // a whole chunk: no branches, the steps interleave
#pragma unroll
    for (int i = 0; i < kSteps; ++i) step(warp + kConsumerWarps * i);
  } else {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      if (warp + kConsumerWarps * i < steps) step(warp + kConsumerWarps * i);
    }
  }
  __syncwarp();
  if (lane == 0) sm90::barrier_arrive(ring.empty + 8 * stage);
}

// One block's 4-bit products (as block_product: lane (g, t) ends with rows 2t, 2t + 1 of
// request g in d[0], d[1]). The activations are read when used (no prefetch: a chunk's are 64
// registers a lane).
template <class Input>
__device__ __forceinline__ void block_product_int4(const Ring& ring, const Input& input, int cols,
                                                   int batch, unsigned& it, float (&d)[4]) {
  const int chunk = op_chunk_cols(cols, 4), chunks = op_chunks(cols, 4);
  const unsigned row_stride = static_cast<unsigned>(chunk_row_stride(chunk, 4));
  float acc[2] = {0.f, 0.f};
  for (int c = 0; c < chunks; ++c) {
    const int width = min(chunk, cols - c * chunk);
    chunk_product_int4(ring, row_stride, width / kInt4GroupCols, it++, input, c * chunk / 8, batch,
                       acc);
  }
  d[0] = acc[0];
  d[1] = acc[1];
  d[2] = d[3] = 0.f;
}

// The 8 warps' partial sums of a block, added in warp order: consumer thread i < 64 gets the
// dot product of request i / 8 with block row i % 8 (0 elsewhere). `reduce` holds two buffers of
// [8 warps][8 requests][8 rows] floats, alternated by block so one barrier suffices.
__device__ __forceinline__ float reduce_block(float* reduce, unsigned& parity,
                                              const float (&d)[4]) {
  float* buffer = reduce + (parity & 1) * (kConsumerWarps * kMaxBatch * kBlockRows);
  ++parity;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  *reinterpret_cast<float2*>(buffer + (warp * kMaxBatch + g) * kBlockRows + 2 * t) =
      make_float2(d[0], d[1]);
  consumers_sync();
  float v = 0.f;
  if (threadIdx.x < kMaxBatch * kBlockRows) {
#pragma unroll
    for (int w = 0; w < kConsumerWarps; ++w) v += buffer[w * kMaxBatch * kBlockRows + threadIdx.x];
  }
  return v;
}

}  // namespace flare::llama::dev
