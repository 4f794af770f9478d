// Ragged tensors: rows of variable length packed back to back, located by an indptr.
// Queries and outputs are always ragged ([total_q, H, D] + qo_indptr); KV may be too.
#pragma once

#include <cstdint>

#include "flare/core/tensor.h"

namespace flare {

// Host accessors for an int32 indptr of shape [batch + 1] on the CPU.
int64_t ragged_batch(const TensorView& indptr);
int64_t ragged_begin(const TensorView& indptr, int64_t i);
int64_t ragged_length(const TensorView& indptr, int64_t i);

// Contiguous-in-rows KV: request i's keys are k[indptr[i] .. indptr[i+1]).
struct RaggedKV {
  TensorView k;       // [total_kv, H_kv, D_qk], any strides
  TensorView v;       // [total_kv, H_kv, D_vo], any strides
  TensorView indptr;  // int32 [batch + 1]

  int64_t batch() const { return ragged_batch(indptr); }
  int64_t num_kv_heads() const { return k.shape[1]; }
  int64_t head_dim_qk() const { return k.shape[2]; }
  int64_t head_dim_vo() const { return v.shape[2]; }
  int64_t kv_len(int64_t i) const { return ragged_length(indptr, i); }
};

}  // namespace flare
