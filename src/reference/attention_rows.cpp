// Attention of packed query rows over K/V rows converted to T: logits in the order
// attention_params.h documents, then a two-pass softmax (max, then exp-sum and weighted V)
// or the sigmoid sum, over exactly the keys the masks leave visible.
#include "src/reference/attention_rows.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <variant>

#include "flare/format/ragged.h"
#include "src/reference/element_io.h"

namespace flare::reference_detail {
namespace {

// Head dims are multiples of 8 (validated), so dot products keep 8 partial sums: a fixed
// summation order the compiler can vectorize without reassociating anything.
constexpr int64_t kDotLanes = 8;

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T lanes[kDotLanes] = {};
  for (int64_t d = 0; d < n; d += kDotLanes) {
    for (int64_t lane = 0; lane < kDotLanes; ++lane) lanes[lane] += a[d + lane] * b[d + lane];
  }
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

template <class T>
void add_scaled(T* out, T weight, const T* row, int64_t n) {
  for (int64_t d = 0; d < n; ++d) out[d] += weight * row[d];
}

bool mask_bit_set(const uint8_t* bits, int64_t index) {
  return ((bits[index >> 3] >> (index & 7)) & 1) != 0;
}

int64_t int32_at(const TensorView& array, int64_t i) {
  return array.ptr<const int32_t>()[i * array.strides[0]];
}

// Element offset of dimension 0 of K or V at (request, position, head).
int64_t k_offset(const PagedKV& kv, int64_t request, int64_t pos, int64_t head) {
  return kv.k_offset(request, pos, head);
}
int64_t v_offset(const PagedKV& kv, int64_t request, int64_t pos, int64_t head) {
  return kv.v_offset(request, pos, head);
}
int64_t k_offset(const RaggedKV& kv, int64_t request, int64_t pos, int64_t head) {
  return (ragged_begin(kv.indptr, request) + pos) * kv.k.strides[0] + head * kv.k.strides[1];
}
int64_t v_offset(const RaggedKV& kv, int64_t request, int64_t pos, int64_t head) {
  return (ragged_begin(kv.indptr, request) + pos) * kv.v.strides[0] + head * kv.v.strides[1];
}

// One head's row of consecutive positions lies a whole token (all heads) apart in NHD pages,
// so the hardware prefetcher does not follow; requesting rows a few positions ahead keeps
// several loads in flight.
constexpr int64_t kPrefetchDistance = 8;
constexpr size_t kCacheLine = 64;

void prefetch_row(const TensorView& t, int64_t element_offset, size_t row_bytes) {
  const char* row = static_cast<const char*>(t.data) +
                    element_offset * static_cast<int64_t>(dtype_bytes(t.dtype));
  for (size_t byte = 0; byte < row_bytes; byte += kCacheLine) __builtin_prefetch(row + byte);
}

// sm_scale = 0 means 1 / sqrt(head_dim_qk), resolved in T so the fp64 mode stays exact.
template <class T>
T resolve_sm_scale(const AttentionParams& params, int64_t head_dim_qk) {
  if (params.sm_scale != 0.0f) return static_cast<T>(params.sm_scale);
  return static_cast<T>(1.0 / std::sqrt(static_cast<double>(head_dim_qk)));
}

// Document mask: whether positions a and b lie in one document (a position past the request's
// row of document_id is a document of its own).
bool same_document(const RequestGeometry& request, int64_t a, int64_t b) {
  if (request.document_ids == nullptr || a == b) return true;
  if (a >= request.document_columns || b >= request.document_columns) return false;
  return request.document_ids[a] == request.document_ids[b];
}

}  // namespace

RequestGeometry request_geometry(const AttentionProblem& problem, int64_t request) {
  const AttentionParams& params = problem.params;
  RequestGeometry geometry;
  geometry.index = request;
  geometry.q_begin = ragged_begin(problem.qo_indptr, request);
  geometry.q_len = ragged_length(problem.qo_indptr, request);
  geometry.kv_len = kv_length(problem.kv, request);
  if (params.rope_offsets) geometry.rope_offset = int32_at(*params.rope_offsets, request);
  if (params.prefix_len) geometry.prefix_len = int32_at(*params.prefix_len, request);
  if (params.document_id) {
    geometry.document_ids = params.document_id->ptr<const int32_t>() +
                            request * params.document_id->strides[0];
    geometry.document_columns = params.document_id->shape[1];
  }
  if (params.mask == MaskMode::kCustom) {
    geometry.mask_bits =
        params.custom_mask->ptr<const uint8_t>() + ragged_begin(*params.mask_indptr, request);
  }
  return geometry;
}

HeadGeometry head_geometry(const AttentionProblem& problem) {
  HeadGeometry heads;
  heads.num_qo_heads = problem.q.shape[1];
  heads.num_kv_heads = num_kv_heads(problem.kv);
  heads.group = heads.num_qo_heads / heads.num_kv_heads;
  heads.head_dim_qk = head_dim_qk(problem.kv);
  heads.head_dim_vo = head_dim_vo(problem.kv);
  return heads;
}

template <class T>
void gather_kv_rows(const AttentionProblem& problem, const RequestGeometry& request,
                    int64_t kv_head, int64_t begin, int64_t end, KVRows<T>& rows) {
  const AttentionParams& params = problem.params;
  const int64_t head_dim_qk = flare::head_dim_qk(problem.kv);
  const int64_t head_dim_vo = flare::head_dim_vo(problem.kv);
  rows.begin = begin;
  rows.end = end;
  rows.k.resize(static_cast<size_t>((end - begin) * head_dim_qk));
  rows.v.resize(static_cast<size_t>((end - begin) * head_dim_vo));
  std::visit(
      [&](const auto& kv) {
        // attention_params.h introduces the scales for fp8; like FlashInfer's k_scale/v_scale
        // they multiply the stored values of every dtype (the identity at their default, 1).
        const T k_scale = static_cast<T>(params.k_scale);
        const T v_scale = static_cast<T>(params.v_scale);
        const size_t k_row_bytes = static_cast<size_t>(head_dim_qk) * dtype_bytes(kv.k.dtype);
        const size_t v_row_bytes = static_cast<size_t>(head_dim_vo) * dtype_bytes(kv.v.dtype);
        for (int64_t pos = begin; pos < end; ++pos) {
          if (pos + kPrefetchDistance < end) {
            prefetch_row(kv.k, k_offset(kv, request.index, pos + kPrefetchDistance, kv_head),
                         k_row_bytes);
            prefetch_row(kv.v, v_offset(kv, request.index, pos + kPrefetchDistance, kv_head),
                         v_row_bytes);
          }
          const int64_t row = pos - begin;
          load_elements(kv.k.data, kv.k.dtype, k_offset(kv, request.index, pos, kv_head),
                        kv.k.strides[kv.k.ndim - 1], head_dim_qk, k_scale,
                        &rows.k[static_cast<size_t>(row * head_dim_qk)]);
          load_elements(kv.v.data, kv.v.dtype, v_offset(kv, request.index, pos, kv_head),
                        kv.v.strides[kv.v.ndim - 1], head_dim_vo, v_scale,
                        &rows.v[static_cast<size_t>(row * head_dim_vo)]);
        }
      },
      problem.kv);
  if (params.pos_encoding == PosEncoding::kRopeLlama) {
    const RopeLlama rope(head_dim_qk, params);
    for (int64_t pos = begin; pos < end; ++pos) {
      rope.apply(&rows.k[static_cast<size_t>((pos - begin) * head_dim_qk)],
                 pos + request.rope_offset);
    }
  }
}

template <class T>
RowAttention<T>::RowAttention(const AttentionProblem& problem)
    : problem_(problem),
      heads_(head_geometry(problem)),
      sm_scale_(resolve_sm_scale<T>(problem.params, heads_.head_dim_qk)) {
  const AttentionParams& params = problem.params;
  if (params.pos_encoding == PosEncoding::kAlibi) {
    alibi_slopes_.resize(static_cast<size_t>(heads_.num_qo_heads));
    for (int64_t head = 0; head < heads_.num_qo_heads; ++head) {
      alibi_slopes_[head] = static_cast<T>(
          params.alibi_slopes
              ? params.alibi_slopes->ptr<const float>()[head * params.alibi_slopes->strides[0]]
              : default_alibi_slope(head, heads_.num_qo_heads));
    }
  }
  if (params.pos_encoding == PosEncoding::kRopeLlama) {
    rope_.emplace(heads_.head_dim_qk, params);
  }
}

template <class T>
void RowAttention<T>::attend(const RequestGeometry& request, int64_t kv_head, int64_t row_begin,
                             int64_t row_end, const KVRows<T>& kv, T* o, T* lse) {
  // Packed rows of one token are consecutive; take them together.
  for (int64_t row = row_begin; row < row_end;) {
    const int64_t token = row / heads_.group;
    const int64_t token_row_end = std::min(row_end, (token + 1) * heads_.group);
    const int64_t local = row - row_begin;
    attend_token(request, kv_head, token, row % heads_.group, token_row_end - row, kv,
                 o + local * heads_.head_dim_vo, lse == nullptr ? nullptr : lse + local);
    row = token_row_end;
  }
}

template <class T>
void RowAttention<T>::attend_token(const RequestGeometry& request, int64_t kv_head, int64_t token,
                                   int64_t first_head_in_group, int64_t num_heads,
                                   const KVRows<T>& kv, T* o, T* lse) {
  const AttentionParams& params = problem_.params;
  const TensorView& q = problem_.q;
  const int64_t head_dim_qk = heads_.head_dim_qk;
  const int64_t head_dim_vo = heads_.head_dim_vo;
  const int64_t q_pos = request.kv_len - request.q_len + token;  // bottom-right alignment
  const int64_t first_head = kv_head * heads_.group + first_head_in_group;

  queries_.resize(static_cast<size_t>(num_heads * head_dim_qk));
  for (int64_t r = 0; r < num_heads; ++r) {
    T* query = &queries_[static_cast<size_t>(r * head_dim_qk)];
    load_elements(q.data, q.dtype,
                  (request.q_begin + token) * q.strides[0] + (first_head + r) * q.strides[1],
                  q.strides[2], head_dim_qk, T{1}, query);
    if (rope_) rope_->apply(query, q_pos + request.rope_offset);
  }

  // Masks depend on (token, key) only, so every head of the token sees the same keys.
  // Causal and sliding-window masks leave an interval; the custom mask thins it.
  int64_t first_key = kv.begin;
  int64_t end_key = kv.end;
  if (params.mask == MaskMode::kCausal) {
    end_key = std::min(end_key, std::max(q_pos + 1, request.prefix_len));  // prefix-LM: the prefix
  }
  if (params.window_left >= 0) first_key = std::max(first_key, q_pos - params.window_left);
  visible_keys_.clear();
  for (int64_t key = first_key; key < end_key; ++key) {
    if ((params.mask != MaskMode::kCustom ||
         mask_bit_set(request.mask_bits, token * request.kv_len + key)) &&
        same_document(request, q_pos, key)) {
      visible_keys_.push_back(key);
    }
  }

  // logits_[i * num_heads + r]: visible key i, head r. Key-major, so each K and V row is
  // read once for all heads of the group.
  const int64_t num_keys = static_cast<int64_t>(visible_keys_.size());
  logits_.resize(static_cast<size_t>(num_keys * num_heads));
  for (int64_t i = 0; i < num_keys; ++i) {
    const int64_t key = visible_keys_[i];
    const T* k_row = &kv.k[static_cast<size_t>((key - kv.begin) * head_dim_qk)];
    for (int64_t r = 0; r < num_heads; ++r) {
      T logit =
          dot(&queries_[static_cast<size_t>(r * head_dim_qk)], k_row, head_dim_qk) * sm_scale_;
      if (!alibi_slopes_.empty()) {
        logit += alibi_slopes_[first_head + r] * static_cast<T>(key - q_pos);
      }
      if (params.relative_bias) {
        const TensorView& table = *params.relative_bias;
        const int bucket = relative_bias_bucket(q_pos - key, params.relative_max_distance);
        logit += static_cast<T>(table.ptr<const float>()[(first_head + r) * table.strides[0] +
                                                         bucket * table.strides[1]]);
      }
      if (params.logits_soft_cap > 0.0f) {
        const T cap = static_cast<T>(params.logits_soft_cap);
        logit = cap * std::tanh(logit / cap);
      }
      logits_[i * num_heads + r] = logit;
    }
  }

  std::fill(o, o + num_heads * head_dim_vo, T{0});
  if (num_keys == 0) {
    if (params.use_softmax && lse != nullptr) {
      std::fill(lse, lse + num_heads, -std::numeric_limits<T>::infinity());
    }
    return;
  }
  // Each key's weight per head: sigmoid(s + bias), or exp(s - max) normalized at the end.
  max_logits_.assign(static_cast<size_t>(num_heads), -std::numeric_limits<T>::infinity());
  sums_.assign(static_cast<size_t>(num_heads), T{0});
  if (params.use_softmax) {
    for (int64_t i = 0; i < num_keys; ++i) {
      for (int64_t r = 0; r < num_heads; ++r) {
        max_logits_[r] = std::max(max_logits_[r], logits_[i * num_heads + r]);
      }
    }
  }
  const T bias = static_cast<T>(params.sigmoid_bias);
  for (int64_t i = 0; i < num_keys; ++i) {
    const T* v_row = &kv.v[static_cast<size_t>((visible_keys_[i] - kv.begin) * head_dim_vo)];
    for (int64_t r = 0; r < num_heads; ++r) {
      const T logit = logits_[i * num_heads + r];
      const T weight = params.use_softmax ? std::exp(logit - max_logits_[r])
                                          : T{1} / (T{1} + std::exp(-(logit + bias)));
      sums_[r] += weight;
      add_scaled(o + r * head_dim_vo, weight, v_row, head_dim_vo);
    }
  }
  if (!params.use_softmax) return;
  for (int64_t r = 0; r < num_heads; ++r) {
    for (int64_t d = 0; d < head_dim_vo; ++d) o[r * head_dim_vo + d] /= sums_[r];
    if (lse != nullptr) lse[r] = max_logits_[r] + std::log(sums_[r]);
  }
}

template void gather_kv_rows<float>(const AttentionProblem&, const RequestGeometry&, int64_t,
                                    int64_t, int64_t, KVRows<float>&);
template void gather_kv_rows<double>(const AttentionProblem&, const RequestGeometry&, int64_t,
                                     int64_t, int64_t, KVRows<double>&);
template class RowAttention<float>;
template class RowAttention<double>;

}  // namespace flare::reference_detail
