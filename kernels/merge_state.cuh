// The merge operator ⊕ on attention-state tensors (papers 001 §2.2; FlashInfer's merge_state,
// merge_state_in_place, merge_states): rows (seq, head) of v [seq, H, D] with float32 LSE s.
//
// A few lanes share one row (lanes_per_row, a power of two chosen by the host from D so that
// each lane takes two vectors of the row: kMergePairVectorsPerLane, kMergeStatesVectorsPerLane),
// each loading FLARE_MERGE_VEC_BYTES-wide vectors; every lane computes the row's weights itself
// from broadcast loads of s, so no shuffles are needed. Math in float32 with weights
// relative to the largest LSE (nothing overflows); fixed order, no atomics: deterministic.
//
// Compile-time defines: FLARE_MERGE_DTYPE (v's dtype code, kMergeF32 | kMergeF16 | kMergeBF16),
// FLARE_MERGE_VEC_BYTES (16, or the element size for rows that cannot take 16-byte vectors).
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

// v's element type codes; equal to the host's flare::DType values (checked there).
enum MergeDTypeCode : int32_t {
  kMergeF32 = 0,
  kMergeF16 = 1,
  kMergeBF16 = 2,
};

// One state tensor: v [seq, (states,) H, D] and its float32 LSE s [seq, (states,) H]. v's
// strides are in bytes, s's in elements; strides of size-1 dimensions are 0.
struct MergeStateTensor {
  char* v;
  float* s;
  int64_t v_seq_stride;
  int64_t v_state_stride;  // merge_states input only
  int64_t v_head_stride;
  int64_t v_vector_stride;  // from one vector of a row to the next: the vector bytes when D is
                            // unit-stride, the element stride times the element size otherwise
  int64_t s_seq_stride;
  int64_t s_state_stride;  // merge_states input only
  int64_t s_head_stride;
};

// Rows (seq, head) in seq-major order; lanes_per_row lanes share a row, lane i covering vectors
// i, i + lanes_per_row, ... of its vectors_per_row.
struct MergeRows {
  int32_t num_rows;  // seq * H, below 2^31 (the host checks): 32-bit row arithmetic
  int32_t num_heads;
  int32_t vectors_per_row;  // D / (FLARE_MERGE_VEC_BYTES / element bytes); 0 when D is 0
  int32_t lanes_per_row;    // power of two in [1, 32]
  int32_t lse_base2;        // 1: every s is log2 of its sum (FlashInfer's), 0: natural log
};

// merge_state / merge_state_in_place: out = a ⊕ b; in place, out is a.
struct MergeStatePairParams {
  MergeStateTensor a;
  MergeStateTensor b;
  MergeStateTensor out;
  const unsigned char* mask;  // uint8 [seq] or null: rows whose mask is 0 are left untouched
  int64_t mask_stride;
  MergeRows rows;
};

// merge_states: out[seq, h] = ⊕ over i of states[seq, i, h], in index order. With
// state_indptr (merge_states_ragged), the states of row seq are states[0, i, h] for i in
// [state_indptr[seq], state_indptr[seq + 1]), each end clamped to [0, num_states] and the end to
// at least the begin: whatever the array holds, no state outside the tensor is read (a range
// the clamps empty gives v = 0, s = -inf).
struct MergeStatesParams {
  MergeStateTensor states;
  MergeStateTensor out;
  MergeRows rows;
  int32_t num_states;  // per row; with state_indptr, the tensor's states along dimension 0
  int32_t reserved;
  const int32_t* state_indptr;  // [seq + 1] on the device, or null
};

// Threads per block of both kernels; the host launches with this block size.
constexpr int kMergeStateThreads = 256;
// flare_merge_state_pair: vectors of a row each lane takes (the host's lanes_per_row for it: a
// row's vectors over this many, so that a row's fixed work, its place, LSEs, weights and
// reciprocal, is shared by twice the elements: the kernel is bound by issue, forty-fourth
// session).
constexpr int kMergePairVectorsPerLane = 2;
// flare_merge_states: vectors of a row each lane takes (the host's lanes_per_row for it).
constexpr int kMergeStatesVectorsPerLane = 2;

}  // namespace flare

#ifdef __CUDACC_RTC__

#ifndef FLARE_MERGE_DTYPE
#error "FLARE_MERGE_DTYPE (kMergeF32, kMergeF16 or kMergeBF16) must be defined"
#endif
#ifndef FLARE_MERGE_VEC_BYTES
#error "FLARE_MERGE_VEC_BYTES (16 or the element size) must be defined"
#endif

#include "decode_utils.cuh"

namespace flare::merge_state_kernel {

struct Traits {
  static constexpr int kDType = FLARE_MERGE_DTYPE;
  static constexpr int kElementBytes = kDType == kMergeF32 ? 4 : 2;
  static constexpr int kVecBytes = FLARE_MERGE_VEC_BYTES;
  static constexpr int kVecElements = kVecBytes / kElementBytes;
  static constexpr int kThreads = kMergeStateThreads;
  static constexpr int kWarps = kThreads / 32;
  // merge_states: loads of this many states (each kStatesVectors vectors a lane) are issued
  // before their weights are applied, and vectors of a row a lane holds. sm_80 / sm_89: one
  // state at a time (two, within 64 registers, spilled 8 bytes there).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  static constexpr int kStatesInFlight = 1;
#else
  static constexpr int kStatesInFlight = 2;
#endif
  static constexpr int kStatesVectors = kMergeStatesVectorsPerLane;
  // merge_states: blocks an SM holds at least (32 warps: 64 registers a thread), 64 bytes of
  // loads a lane in flight on sm_90.
  static constexpr int kStatesMinBlocks = 4;
  // merge_state: vectors of a row a lane holds (flare_merge_state_pair).
  static constexpr int kPairVectors = kMergePairVectorsPerLane;
  static_assert(kDType == kMergeF32 || kDType == kMergeF16 || kDType == kMergeBF16, "dtype");
  static_assert(kVecBytes == 16 || kVecBytes == kElementBytes,
                "vectors are 16 bytes or one element");
  static_assert(kThreads % 32 == 0, "whole warps");
};
static_assert(static_cast<int>(kMergeF16) == static_cast<int>(kCodeF16) &&
                  static_cast<int>(kMergeBF16) == static_cast<int>(kCodeBF16),
              "merge and decode dtype codes agree");

using T = Traits;
using Vector = float[T::kVecElements];

// A vector of v as stored: four 32-bit words for 16 bytes, else the one element, zero-extended.
// merge_states keeps its loads in flight in this form: half the registers of float32 for f16.
struct StoredVector {
  unsigned words[T::kVecBytes == 16 ? 4 : 1];
};

// The helpers below are templates (defaulting to this unit's Traits) so that `if constexpr`
// discards the branches of the other dtypes and widths instead of compiling them.

template <int kVecBytes = T::kVecBytes, int kElementBytes = T::kElementBytes>
__device__ __forceinline__ StoredVector load_stored(const char* src) {
  StoredVector out;
  if constexpr (kVecBytes == 16) {
    const Vec16 raw = *reinterpret_cast<const Vec16*>(src);
    out.words[0] = raw.x;
    out.words[1] = raw.y;
    out.words[2] = raw.z;
    out.words[3] = raw.w;
  } else if constexpr (kElementBytes == 4) {
    out.words[0] = *reinterpret_cast<const unsigned*>(src);
  } else {
    out.words[0] = *reinterpret_cast<const unsigned short*>(src);
  }
  return out;
}

template <int kDType = T::kDType>
__device__ __forceinline__ void pair_to_float2(unsigned bits, float& lo, float& hi) {
  if constexpr (kDType == kMergeBF16) {
    bf16x2_to_float2(bits, lo, hi);
  } else {
    f16x2_to_float2(bits, lo, hi);
  }
}

template <int kDType = T::kDType, int kVecBytes = T::kVecBytes>
__device__ __forceinline__ void to_float(const StoredVector& in, Vector& out) {
  if constexpr (kDType == kMergeF32) {
#pragma unroll
    for (int e = 0; e < T::kVecElements; ++e) out[e] = __uint_as_float(in.words[e]);
  } else if constexpr (kVecBytes == 16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) pair_to_float2(in.words[i], out[2 * i], out[2 * i + 1]);
  } else {
    float high_unused;
    pair_to_float2(in.words[0], out[0], high_unused);
  }
}

__device__ __forceinline__ void load_vector(const char* src, Vector& out) {
  to_float(load_stored(src), out);
}

// float32 -> one vector of v at `dst`, rounded to nearest even.
template <int kDType = T::kDType, int kVecBytes = T::kVecBytes>
__device__ __forceinline__ void store_vector(char* dst, const Vector& in) {
  if constexpr (kVecBytes == 16 && kDType == kMergeF32) {
    Vec16 raw;
    raw.x = __float_as_uint(in[0]);
    raw.y = __float_as_uint(in[1]);
    raw.z = __float_as_uint(in[2]);
    raw.w = __float_as_uint(in[3]);
    *reinterpret_cast<Vec16*>(dst) = raw;
  } else if constexpr (kVecBytes == 16) {
    Vec16 raw;
    raw.x = float2_to_16bit2<kDType>(in[0], in[1]);
    raw.y = float2_to_16bit2<kDType>(in[2], in[3]);
    raw.z = float2_to_16bit2<kDType>(in[4], in[5]);
    raw.w = float2_to_16bit2<kDType>(in[6], in[7]);
    *reinterpret_cast<Vec16*>(dst) = raw;
  } else if constexpr (kDType == kMergeF32) {
    *reinterpret_cast<float*>(dst) = in[0];
  } else {
    *reinterpret_cast<unsigned short*>(dst) =
        static_cast<unsigned short>(float2_to_16bit2<kDType>(in[0], 0.0f));
  }
}

// Where this thread works: its row within the warp's group of 32 / lanes_per_row rows, and its
// lane within the row.
struct RowLane {
  unsigned row_in_group;
  int lane_in_row;
  unsigned rows_per_group;
};

__device__ __forceinline__ RowLane row_lane(const MergeRows& rows) {
  const unsigned lane = threadIdx.x % 32;
  const unsigned lanes = static_cast<unsigned>(rows.lanes_per_row);
  return {lane / lanes, static_cast<int>(lane % lanes), 32 / lanes};
}

// Groups of rows_per_group rows; every lane of a warp walks the same groups (grid-stride).
__device__ __forceinline__ unsigned row_groups(const MergeRows& rows, const RowLane& slot) {
  return (static_cast<unsigned>(rows.num_rows) + slot.rows_per_group - 1) / slot.rows_per_group;
}

__device__ __forceinline__ float lse_at(const MergeStateTensor& t, int64_t seq, int64_t state,
                                        int64_t head) {
  return t.s[seq * t.s_seq_stride + state * t.s_state_stride + head * t.s_head_stride];
}

__device__ __forceinline__ const char* row_of(const MergeStateTensor& t, int64_t seq, int64_t state,
                                              int64_t head) {
  return t.v + seq * t.v_seq_stride + state * t.v_state_stride + head * t.v_head_stride;
}

// LSE of a merged row, in the inputs' base, from the largest input LSE and the sum of the
// weights b^(s_i - max); -inf when every input was -inf (no keys seen).
__device__ __forceinline__ float merged_lse(float lse_max, float weight_sum, bool base2) {
  if (lse_max == negative_infinity()) return negative_infinity();
  return lse_max + (base2 ? log2f(weight_sum) : logf(weight_sum));
}

// b^(lse - lse_max) (b = e, or 2 for base-2 LSEs), or 0 for a state that saw no keys (its v is
// never read into the sum: it may hold anything, NaN included).
__device__ __forceinline__ float weight_of(float lse, float lse_max, bool base2) {
  if (lse == negative_infinity()) return 0.0f;
  return base2 ? exp2f(lse - lse_max) : expf(lse - lse_max);
}

}  // namespace flare::merge_state_kernel

namespace flare::merge_state_kernel {

// A row of the pair merge as loaded before it merges: its LSEs and the lane's first
// kPairVectors vectors of a and b (every load of a warp's group is issued before it merges).
struct PairRow {
  bool active;
  unsigned seq, head;
  float lse_a, lse_b;
  StoredVector a[T::kPairVectors], b[T::kPairVectors];
};

__device__ __forceinline__ PairRow load_pair_row(const MergeStatePairParams& p, const RowLane& slot,
                                                 unsigned row) {
  PairRow r;
  r.seq = row / p.rows.num_heads;
  r.head = row % p.rows.num_heads;
  r.active = row < static_cast<unsigned>(p.rows.num_rows) &&
             (p.mask == nullptr || p.mask[r.seq * p.mask_stride] != 0);
  r.lse_a = r.lse_b = 0.0f;
  if (r.active) {
    r.lse_a = lse_at(p.a, r.seq, 0, r.head);
    r.lse_b = lse_at(p.b, r.seq, 0, r.head);
    const char* row_a = row_of(p.a, r.seq, 0, r.head);
    const char* row_b = row_of(p.b, r.seq, 0, r.head);
#pragma unroll
    for (int j = 0; j < T::kPairVectors; ++j) {
      const int vec = slot.lane_in_row + j * p.rows.lanes_per_row;
      if (vec < p.rows.vectors_per_row) {
        r.a[j] = load_stored(row_a + vec * p.a.v_vector_stride);
        r.b[j] = load_stored(row_b + vec * p.b.v_vector_stride);
      }
    }
  }
  return r;
}

// One vector of a ⊕ b with the row's weights, stored to `dst`. Rounded products, no fused
// multiply-add: a ⊕ b equals b ⊕ a bit for bit. A state of weight 0 (no keys) is zeroed first:
// its v may hold anything, NaN included, and must not reach the sum.
__device__ __forceinline__ void merge_pair_vector(StoredVector a, StoredVector b, float weight_a,
                                                  float weight_b, float norm, char* dst) {
  if (weight_a == 0.0f) a = StoredVector{};
  if (weight_b == 0.0f) b = StoredVector{};
  Vector fa, fb, merged;
  to_float(a, fa);
  to_float(b, fb);
#pragma unroll
  for (int e = 0; e < T::kVecElements; ++e) {
    merged[e] = __fadd_rn(__fmul_rn(weight_a, fa[e]), __fmul_rn(weight_b, fb[e])) * norm;
  }
  store_vector(dst, merged);
}

// v of a loaded row merged into out (its first vectors from `r`, any further ones loaded here);
// returns its largest LSE and weight sum for the LSE the caller stores. In place, out.v is a.v:
// each vector is read and written by the same lane.
__device__ __forceinline__ void merge_pair_row(const MergeStatePairParams& p, const RowLane& slot,
                                               const PairRow& r, float& lse_max,
                                               float& weight_sum) {
  const bool base2 = p.rows.lse_base2 != 0;
  lse_max = fmaxf(r.lse_a, r.lse_b);
  const float weight_a = weight_of(r.lse_a, lse_max, base2);
  const float weight_b = weight_of(r.lse_b, lse_max, base2);
  weight_sum = weight_a + weight_b;
  const float norm = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;
  char* row_out = p.out.v + r.seq * p.out.v_seq_stride + r.head * p.out.v_head_stride;
#pragma unroll
  for (int j = 0; j < T::kPairVectors; ++j) {
    const int vec = slot.lane_in_row + j * p.rows.lanes_per_row;
    if (vec < p.rows.vectors_per_row) {
      merge_pair_vector(r.a[j], r.b[j], weight_a, weight_b, norm,
                        row_out + vec * p.out.v_vector_stride);
    }
  }
  // Rows of more than 2 x 32 vectors (float32 at D 512): the rest one by one.
  const char* row_a = row_of(p.a, r.seq, 0, r.head);
  const char* row_b = row_of(p.b, r.seq, 0, r.head);
  for (int vec = slot.lane_in_row + T::kPairVectors * p.rows.lanes_per_row;
       vec < p.rows.vectors_per_row; vec += p.rows.lanes_per_row) {
    merge_pair_vector(load_stored(row_a + vec * p.a.v_vector_stride),
                      load_stored(row_b + vec * p.b.v_vector_stride), weight_a, weight_b, norm,
                      row_out + vec * p.out.v_vector_stride);
  }
}

}  // namespace flare::merge_state_kernel

// out = a ⊕ b for every row whose mask is set. Warps walk groups of rows (grid-stride, so the
// grid is fixed by the shape alone) and issue every load of a group before merging it, each
// lane kPairVectors vectors of its row: a memory-bound kernel's bytes in flight, 2 x 32 bytes a
// lane at D 128 in 16 bits (one vector a lane held 48 KB an SM in flight at 48 warps: 3.0 TB/s
// against FlashInfer's 3.9, forty-third session), and a row's fixed work shared by two vectors
// a lane. Every lane of a warp reaches the warp barrier once a group.
extern "C" __global__ void __launch_bounds__(flare::merge_state_kernel::T::kThreads)
    flare_merge_state_pair(const flare::MergeStatePairParams p) {
  using namespace flare::merge_state_kernel;
  const RowLane slot = row_lane(p.rows);
  const unsigned num_groups = row_groups(p.rows, slot);
  for (unsigned group = blockIdx.x * T::kWarps + threadIdx.x / 32; group < num_groups;
       group += gridDim.x * T::kWarps) {
    const PairRow row = load_pair_row(p, slot, group * slot.rows_per_group + slot.row_in_group);
    float lse_max, weight_sum;
    if (row.active) merge_pair_row(p, slot, row, lse_max, weight_sum);
    // In place, out.s is a.s: every lane of a row reads it before the row's lane 0 writes it.
    __syncwarp();
    if (row.active && slot.lane_in_row == 0) {
      p.out.s[row.seq * p.out.s_seq_stride + row.head * p.out.s_head_stride] =
          merged_lse(lse_max, weight_sum, p.rows.lse_base2 != 0);
    }
  }
}

// out[seq, h] = ⊕ over the states of states[seq, :, h]: the largest LSE first, then the sum of
// the weights, then the weighted sum of v, states in index order. Each lane takes
// kStatesVectors vectors of its row together (the host's lanes_per_row for it: the row's fixed
// work, its place, its LSE passes and weights, shared by twice the elements), kStatesInFlight
// states' loads of both issued together. out must not overlap the states.
extern "C" __global__ void __launch_bounds__(flare::merge_state_kernel::T::kThreads,
                                             flare::merge_state_kernel::T::kStatesMinBlocks)
    flare_merge_states(const flare::MergeStatesParams p) {
  using namespace flare::merge_state_kernel;
  constexpr int kVectors = T::kStatesVectors;
  constexpr int kBatch = T::kStatesInFlight;
  const RowLane slot = row_lane(p.rows);
  const unsigned num_groups = row_groups(p.rows, slot);
  for (unsigned group = blockIdx.x * T::kWarps + threadIdx.x / 32; group < num_groups;
       group += gridDim.x * T::kWarps) {
    const unsigned row = group * slot.rows_per_group + slot.row_in_group;
    if (row >= static_cast<unsigned>(p.rows.num_rows)) continue;
    const unsigned seq = row / p.rows.num_heads;
    const unsigned head = row % p.rows.num_heads;
    // The row's states: states[seq, 0 .. num_states), or the clamped ragged range of
    // states[0, ...) (MergeStatesParams). Their LSEs and vectors from these two pointers on,
    // a state stride apart (64-bit offsets formed once a row).
    unsigned state_seq = seq;
    int first = 0;
    int num_states = p.num_states;
    if (p.state_indptr != nullptr) {
      const int begin = min(max(p.state_indptr[seq], 0), p.num_states);
      const int end = min(max(p.state_indptr[seq + 1], begin), p.num_states);
      state_seq = 0;
      first = begin;
      num_states = end - begin;
    }
    const float* lses =
        &p.states.s[state_seq * p.states.s_seq_stride + first * p.states.s_state_stride +
                    head * p.states.s_head_stride];
    const char* row_in = row_of(p.states, state_seq, first, head);

    const bool base2 = p.rows.lse_base2 != 0;
    float lse_max = flare::negative_infinity();
    for (int i = 0; i < num_states; ++i)
      lse_max = fmaxf(lse_max, lses[i * p.states.s_state_stride]);
    float weight_sum = 0.0f;
    for (int i = 0; i < num_states; ++i)
      weight_sum += weight_of(lses[i * p.states.s_state_stride], lse_max, base2);
    const float norm = weight_sum > 0.0f ? 1.0f / weight_sum : 0.0f;

    char* row_out = p.out.v + seq * p.out.v_seq_stride + head * p.out.v_head_stride;
    for (int vec0 = slot.lane_in_row; vec0 < p.rows.vectors_per_row;
         vec0 += kVectors * p.rows.lanes_per_row) {
      bool has[kVectors];
      Vector sum[kVectors];
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        has[j] = vec0 + j * p.rows.lanes_per_row < p.rows.vectors_per_row;
#pragma unroll
        for (int e = 0; e < T::kVecElements; ++e) sum[j][e] = 0.0f;
      }
      for (int batch = 0; batch < num_states; batch += kBatch) {
        StoredVector stored[kBatch][kVectors];
        float weights[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = batch + u;
          const bool in_range = i < num_states;
          weights[u] =
              in_range ? weight_of(lses[i * p.states.s_state_stride], lse_max, base2) : 0.0f;
          const char* state = row_in + i * p.states.v_state_stride;
#pragma unroll
          for (int j = 0; j < kVectors; ++j) {
            if (in_range && has[j]) {
              stored[u][j] =
                  load_stored(state + (vec0 + j * p.rows.lanes_per_row) * p.states.v_vector_stride);
            }
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (weights[u] == 0.0f) continue;  // no keys, or past the last state
#pragma unroll
          for (int j = 0; j < kVectors; ++j) {
            if (!has[j]) continue;
            Vector values;
            to_float(stored[u][j], values);
#pragma unroll
            for (int e = 0; e < T::kVecElements; ++e) {
              sum[j][e] = fmaf(weights[u], values[e], sum[j][e]);
            }
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kVectors; ++j) {
        if (!has[j]) continue;
#pragma unroll
        for (int e = 0; e < T::kVecElements; ++e) sum[j][e] *= norm;
        store_vector(row_out + (vec0 + j * p.rows.lanes_per_row) * p.out.v_vector_stride, sum[j]);
      }
    }
    if (slot.lane_in_row == 0) {
      p.out.s[seq * p.out.s_seq_stride + head * p.out.s_head_stride] =
          merged_lse(lse_max, weight_sum, base2);
    }
  }
}

#endif  // __CUDACC_RTC__
