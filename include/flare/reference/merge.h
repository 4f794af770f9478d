// The merge operator on attention states (papers 001 §2.2): (v_a, s_a) ⊕ (v_b, s_b) with
// s = ln(e^{s_a} + e^{s_b}), v = v_a e^{s_a - s} + v_b e^{s_b - s}. Associative, commutative;
// a state with s = -inf is the identity; two -inf states give v = 0, s = -inf.
#pragma once

#include <optional>

#include "flare/core/lse_base.h"
#include "flare/core/tensor.h"

namespace flare {

// v tensors: [seq, H, D] f32 | f16 | bf16 (CPU, any strides); s tensors: float32 [seq, H].
// Outputs may alias neither input. Throws kInvalidArgument on shape/dtype mismatch. `base`: the
// base of every s (read and written in it, merged in natural log).
void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 LseBase base = LseBase::kNatural);

// (v, s) <- (v, s) ⊕ (v_other, s_other), for rows where mask (uint8 [seq], nonzero) is set.
void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other,
                          const std::optional<TensorView>& mask = std::nullopt,
                          LseBase base = LseBase::kNatural);

// v [seq, num_states, H, D], s float32 [seq, num_states, H] -> v_out [seq, H, D], s_out [seq, H].
void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, LseBase base = LseBase::kNatural);

// v [total_states, H, D], s float32 [total_states, H], indptr int32 [seq + 1] -> v_out
// [seq, H, D], s_out [seq, H]: row r merges states indptr[r] .. indptr[r + 1] - 1 in index order
// (FlashInfer's variable_length_merge_states); an empty range gives v = 0, s = -inf. Throws
// kInvalidArgument naming indptr unless 0 <= indptr[r] <= indptr[r + 1] <= total_states.
void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out,
                         LseBase base = LseBase::kNatural);

// The scalar operator on float32 rows, used by every path above and by the plan executor.
// Merges (o_b, lse_b) into (o_a, lse_a) in place, d elements.
void merge_into(float* o_a, float* lse_a, const float* o_b, float lse_b, int64_t d);

}  // namespace flare
