// The merge operator on attention states: the scalar row operator merge_into, and the
// tensor-level merge_state, merge_state_in_place and merge_states built on it.
#include "flare/reference/merge.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "src/reference/element_io.h"

namespace flare {

void merge_into(float* o_a, float* lse_a, const float* o_b, float lse_b, int64_t d) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (lse_b == kNegInf) {
    // b saw no keys: the identity, except that two empty states define o = 0.
    if (*lse_a == kNegInf) std::fill(o_a, o_a + d, 0.0f);
    return;
  }
  if (*lse_a == kNegInf) {
    std::copy(o_b, o_b + d, o_a);
    *lse_a = lse_b;
    return;
  }
  // Weights relative to the larger scale: one is 1, the other in (0, 1], so nothing
  // overflows. The expression is symmetric in a and b, so a ⊕ b == b ⊕ a bit for bit.
  const float max_lse = std::max(*lse_a, lse_b);
  const float weight_a = std::exp(*lse_a - max_lse);
  const float weight_b = std::exp(lse_b - max_lse);
  const float total = weight_a + weight_b;
  for (int64_t i = 0; i < d; ++i) o_a[i] = (weight_a * o_a[i] + weight_b * o_b[i]) / total;
  *lse_a = max_lse + std::log(total);
}

namespace {

void check_state_tensor(const TensorView& t, const char* name, int ndim, const char* layout) {
  FLARE_CHECK(t.device.is_cpu(), ErrorCode::kInvalidArgument, name,
              " must be on the CPU for the reference backend, got ", t.device.str());
  FLARE_CHECK(t.ndim == ndim, ErrorCode::kInvalidArgument, name, " must have rank ", ndim, " ",
              layout, ", got rank ", t.ndim);
}

void check_v_dtype(const TensorView& t, const char* name) {
  FLARE_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kF16 || t.dtype == DType::kBF16,
              ErrorCode::kInvalidArgument, name,
              " dtype must be float32, float16 or bfloat16, got ", dtype_name(t.dtype));
}

void check_s_dtype(const TensorView& t, const char* name) {
  FLARE_CHECK(t.dtype == DType::kF32, ErrorCode::kInvalidArgument, name,
              " dtype must be float32, got ", dtype_name(t.dtype));
}

void check_same_shape(const TensorView& t, const char* name, const TensorView& reference,
                      const char* reference_name) {
  bool same = t.ndim == reference.ndim;
  for (int dim = 0; same && dim < t.ndim; ++dim) same = t.shape[dim] == reference.shape[dim];
  FLARE_CHECK(same, ErrorCode::kInvalidArgument, name, " must have the shape of ", reference_name,
              " ", reference.shape_str(), ", got ", t.shape_str());
}

// s must be [seq, H] (or [seq, num_states, H]) matching the leading dims of v.
void check_scale_shape(const TensorView& s, const char* s_name, const TensorView& v,
                       const char* v_name) {
  bool same = s.ndim == v.ndim - 1;
  for (int dim = 0; same && dim < s.ndim; ++dim) same = s.shape[dim] == v.shape[dim];
  FLARE_CHECK(same, ErrorCode::kInvalidArgument, s_name, " must have the shape of ", v_name,
              " without its last dimension (", v_name, " is ", v.shape_str(), "), got ",
              s.shape_str());
}

void check_v_and_s(const TensorView& v, const char* v_name, const TensorView& s, const char* s_name,
                   int v_ndim, const char* v_layout, const char* s_layout) {
  check_state_tensor(v, v_name, v_ndim, v_layout);
  check_v_dtype(v, v_name);
  check_state_tensor(s, s_name, v_ndim - 1, s_layout);
  check_s_dtype(s, s_name);
  check_scale_shape(s, s_name, v, v_name);
}

// indptr of merge_states_ragged: int32 [seq + 1] on the CPU, 0 <= indptr[r] <= indptr[r + 1] <=
// total_states; the first offending entry is named.
void check_indptr(const TensorView& indptr, int64_t seq, int64_t total_states) {
  check_state_tensor(indptr, "indptr", 1, "[seq + 1]");
  FLARE_CHECK(indptr.dtype == DType::kI32, ErrorCode::kInvalidArgument,
              "indptr dtype must be int32, got ", dtype_name(indptr.dtype));
  FLARE_CHECK(indptr.shape[0] == seq + 1, ErrorCode::kInvalidArgument,
              "indptr must have shape [seq + 1] = [", seq + 1, "] (seq from v_out), got ",
              indptr.shape_str());
  const int32_t* const values = indptr.ptr<const int32_t>();
  int64_t previous = 0;
  for (int64_t i = 0; i <= seq; ++i) {
    const int64_t value = values[i * indptr.strides[0]];
    FLARE_CHECK(value >= previous && value <= total_states, ErrorCode::kInvalidArgument,
                "indptr must be non-decreasing from 0 up to at most total_states = ", total_states,
                " (v's first dimension); indptr[", i, "] = ", value, i > 0 ? " after " : "",
                i > 0 ? std::to_string(previous) : std::string());
    previous = value;
  }
}

// One attention state row (seq index, head) of a [seq, H, D] / [seq, H] pair, read as floats
// with the LSE in natural log (s holds it in `base`).
struct StateRow {
  const TensorView& v;
  const TensorView& s;
  LseBase base;

  int64_t v_offset(int64_t seq, int64_t head) const {
    return seq * v.strides[0] + head * v.strides[1];
  }
  float* s_at(int64_t seq, int64_t head) const {
    return s.ptr<float>() + seq * s.strides[0] + head * s.strides[1];
  }
  void load(int64_t seq, int64_t head, float* o, float* lse) const {
    reference_detail::load_elements(v.data, v.dtype, v_offset(seq, head), v.strides[2], v.shape[2],
                                    1.0f, o);
    *lse = *s_at(seq, head) * lse_to_natural(base);
  }
  void store(int64_t seq, int64_t head, const float* o, float lse) const {
    reference_detail::store_elements(v.data, v.dtype, v_offset(seq, head), v.strides[2], v.shape[2],
                                     o);
    *s_at(seq, head) = lse * lse_scale(base);
  }
};

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 LseBase base) {
  check_v_and_s(v_a, "v_a", s_a, "s_a", 3, "[seq, num_heads, head_dim]", "[seq, num_heads]");
  check_v_and_s(v_b, "v_b", s_b, "s_b", 3, "[seq, num_heads, head_dim]", "[seq, num_heads]");
  check_v_and_s(v_out, "v_out", s_out, "s_out", 3, "[seq, num_heads, head_dim]",
                "[seq, num_heads]");
  check_same_shape(v_b, "v_b", v_a, "v_a");
  check_same_shape(v_out, "v_out", v_a, "v_a");

  const StateRow a{v_a, s_a, base}, b{v_b, s_b, base}, merged{v_out, s_out, base};
  std::vector<float> o_a(static_cast<size_t>(v_a.shape[2]));
  std::vector<float> o_b(o_a.size());
  for (int64_t seq = 0; seq < v_a.shape[0]; ++seq) {
    for (int64_t head = 0; head < v_a.shape[1]; ++head) {
      float lse_a = 0.0f, lse_b = 0.0f;
      a.load(seq, head, o_a.data(), &lse_a);
      b.load(seq, head, o_b.data(), &lse_b);
      merge_into(o_a.data(), &lse_a, o_b.data(), lse_b, v_a.shape[2]);
      merged.store(seq, head, o_a.data(), lse_a);
    }
  }
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const std::optional<TensorView>& mask,
                          LseBase base) {
  check_v_and_s(v, "v", s, "s", 3, "[seq, num_heads, head_dim]", "[seq, num_heads]");
  check_v_and_s(v_other, "v_other", s_other, "s_other", 3, "[seq, num_heads, head_dim]",
                "[seq, num_heads]");
  check_same_shape(v_other, "v_other", v, "v");
  if (mask) {
    check_state_tensor(*mask, "mask", 1, "[seq]");
    FLARE_CHECK(mask->dtype == DType::kU8, ErrorCode::kInvalidArgument,
                "mask dtype must be uint8, got ", dtype_name(mask->dtype));
    FLARE_CHECK(mask->shape[0] == v.shape[0], ErrorCode::kInvalidArgument,
                "mask must have shape [seq] = [", v.shape[0], "], got ", mask->shape_str());
  }

  const StateRow state{v, s, base}, other{v_other, s_other, base};
  std::vector<float> o(static_cast<size_t>(v.shape[2]));
  std::vector<float> o_other(o.size());
  for (int64_t seq = 0; seq < v.shape[0]; ++seq) {
    if (mask && mask->ptr<const uint8_t>()[seq * mask->strides[0]] == 0) continue;
    for (int64_t head = 0; head < v.shape[1]; ++head) {
      float lse = 0.0f, lse_other = 0.0f;
      state.load(seq, head, o.data(), &lse);
      other.load(seq, head, o_other.data(), &lse_other);
      merge_into(o.data(), &lse, o_other.data(), lse_other, v.shape[2]);
      state.store(seq, head, o.data(), lse);
    }
  }
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, LseBase base) {
  check_v_and_s(v, "v", s, "s", 4, "[seq, num_states, num_heads, head_dim]",
                "[seq, num_states, num_heads]");
  check_v_and_s(v_out, "v_out", s_out, "s_out", 3, "[seq, num_heads, head_dim]",
                "[seq, num_heads]");
  const bool shapes_agree =
      v_out.shape[0] == v.shape[0] && v_out.shape[1] == v.shape[2] && v_out.shape[2] == v.shape[3];
  FLARE_CHECK(shapes_agree, ErrorCode::kInvalidArgument,
              "v_out must have shape [seq, num_heads, head_dim] = [", v.shape[0], ", ", v.shape[2],
              ", ", v.shape[3], "] (from v ", v.shape_str(), "), got ", v_out.shape_str());

  const StateRow merged{v_out, s_out, base};
  const int64_t head_dim = v.shape[3];
  std::vector<float> o(static_cast<size_t>(head_dim));
  std::vector<float> o_state(o.size());
  for (int64_t seq = 0; seq < v.shape[0]; ++seq) {
    for (int64_t head = 0; head < v.shape[2]; ++head) {
      // Start from the identity (no keys seen) and fold the states in index order.
      std::fill(o.begin(), o.end(), 0.0f);
      float lse = -std::numeric_limits<float>::infinity();
      for (int64_t state = 0; state < v.shape[1]; ++state) {
        reference_detail::load_elements(
            v.data, v.dtype, seq * v.strides[0] + state * v.strides[1] + head * v.strides[2],
            v.strides[3], head_dim, 1.0f, o_state.data());
        const float lse_state =
            s.ptr<const float>()[seq * s.strides[0] + state * s.strides[1] + head * s.strides[2]] *
            lse_to_natural(base);
        merge_into(o.data(), &lse, o_state.data(), lse_state, head_dim);
      }
      merged.store(seq, head, o.data(), lse);
    }
  }
}

void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out, LseBase base) {
  check_v_and_s(v, "v", s, "s", 3, "[total_states, num_heads, head_dim]",
                "[total_states, num_heads]");
  check_v_and_s(v_out, "v_out", s_out, "s_out", 3, "[seq, num_heads, head_dim]",
                "[seq, num_heads]");
  const int64_t seq = v_out.shape[0];
  check_indptr(indptr, seq, v.shape[0]);
  FLARE_CHECK(v_out.shape[1] == v.shape[1] && v_out.shape[2] == v.shape[2],
              ErrorCode::kInvalidArgument, "v_out must have shape [seq, num_heads, head_dim] = [",
              seq, ", ", v.shape[1], ", ", v.shape[2], "] (heads and head_dim from v ",
              v.shape_str(), "), got ", v_out.shape_str());

  const StateRow states{v, s, base}, merged{v_out, s_out, base};
  const int32_t* const ranges = indptr.ptr<const int32_t>();
  std::vector<float> o(static_cast<size_t>(v.shape[2]));
  std::vector<float> o_state(o.size());
  for (int64_t row = 0; row < seq; ++row) {
    const int64_t begin = ranges[row * indptr.strides[0]];
    const int64_t end = ranges[(row + 1) * indptr.strides[0]];
    for (int64_t head = 0; head < v.shape[1]; ++head) {
      std::fill(o.begin(), o.end(), 0.0f);
      float lse = -std::numeric_limits<float>::infinity();
      for (int64_t state = begin; state < end; ++state) {
        float lse_state = 0.0f;
        states.load(state, head, o_state.data(), &lse_state);
        merge_into(o.data(), &lse, o_state.data(), lse_state, v.shape[2]);
      }
      merged.store(row, head, o.data(), lse);
    }
  }
}

}  // namespace flare
