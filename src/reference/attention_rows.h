// Internals of the reference attention shared by its files: where a request's data lives,
// its K/V rows of one KV head converted to T (float or double), and attention of packed
// query rows over those K/V rows. The problem must be validated before any of this runs.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "flare/reference/attention.h"
#include "src/reference/rope.h"

namespace flare::reference_detail {

// Where one request's queries, keys and custom mask bits are.
struct RequestGeometry {
  int64_t index = 0;
  int64_t q_begin = 0;  // first query token of the request in q and o
  int64_t q_len = 0;
  int64_t kv_len = 0;
  int64_t rope_offset = 0;             // added to every q and k position under RoPE
  int64_t prefix_len = 0;              // prefix-LM: keys below it are visible under kCausal
  const int32_t* document_ids = nullptr;  // document mask: this request's row of document_id
  int64_t document_columns = 0;             // its length (later positions: a document each)
  const uint8_t* mask_bits = nullptr;  // kCustom: q_len x kv_len bits, little bit order
};
RequestGeometry request_geometry(const AttentionProblem& problem, int64_t request);

struct HeadGeometry {
  int64_t num_qo_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t group = 0;  // query heads per KV head
  int64_t head_dim_qk = 0;
  int64_t head_dim_vo = 0;
};
HeadGeometry head_geometry(const AttentionProblem& problem);

// K and V of KV positions [begin, end) of one request and KV head: dequantized (times
// k_scale / v_scale), K rotated to its position under RoPE.
template <class T>
struct KVRows {
  int64_t begin = 0;
  int64_t end = 0;
  std::vector<T> k;  // [end - begin, head_dim_qk]
  std::vector<T> v;  // [end - begin, head_dim_vo]
};

template <class T>
void gather_kv_rows(const AttentionProblem& problem, const RequestGeometry& request,
                    int64_t kv_head, int64_t begin, int64_t end, KVRows<T>& rows);

// Attention of packed query rows over K/V rows, everything in T. Holds the resolved logits
// parameters of one problem and per-row scratch, so one instance serves one thread.
template <class T>
class RowAttention {
 public:
  explicit RowAttention(const AttentionProblem& problem);

  // Packed rows [row_begin, row_end) of `request` under `kv_head` against the positions of
  // `kv` (masks use the request's full kv_len). o: [rows, head_dim_vo]; lse: [rows], may be
  // null, and is not written without softmax.
  void attend(const RequestGeometry& request, int64_t kv_head, int64_t row_begin, int64_t row_end,
              const KVRows<T>& kv, T* o, T* lse);

 private:
  // Rows of one token: query heads [first, first + num_heads) of the KV head's group.
  // o: [num_heads, head_dim_vo]; lse: [num_heads] or null.
  void attend_token(const RequestGeometry& request, int64_t kv_head, int64_t token,
                    int64_t first_head_in_group, int64_t num_heads, const KVRows<T>& kv, T* o,
                    T* lse);

  const AttentionProblem& problem_;
  HeadGeometry heads_;
  T sm_scale_;
  std::vector<T> alibi_slopes_;  // [num_qo_heads] under ALiBi, else empty
  std::optional<RopeLlama> rope_;
  // Scratch of the current token:
  std::vector<T> queries_;             // [num_heads, head_dim_qk]
  std::vector<int64_t> visible_keys_;  // the positions its rows see
  std::vector<T> logits_;              // [visible keys, num_heads]
  std::vector<T> max_logits_;          // [num_heads]
  std::vector<T> sums_;                // [num_heads]: sum of weights
};

}  // namespace flare::reference_detail
