// The CPU reference backend: batch attention over ragged queries with paged or ragged KV,
// in fp32 or fp64, multithreaded over (request, KV head). The oracle of every GPU test and
// the embedded default when no GPU is present.
#pragma once

#include <cstdint>
#include <optional>
#include <variant>

#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/format/ragged.h"
#include "flare/variant/attention_params.h"

namespace flare {

using KVCache = std::variant<PagedKV, RaggedKV>;

enum class Accumulation : uint8_t { kF32, kF64 };

struct ReferenceOptions {
  Accumulation accumulation = Accumulation::kF32;
  int num_threads = 0;  // 0: std::thread::hardware_concurrency()
};

// One attention problem: the arguments every backend takes, validated once.
//   q           [total_q, H_qo, D_qk]  f32 | f16 | bf16, CPU, any strides
//   qo_indptr   int32 [batch + 1], CPU
//   kv          paged or ragged; K/V dtypes f32 | f16 | bf16 | e4m3 | e5m2 (both the same)
//   o           [total_q, H_qo, D_vo]  f32 | f16 | bf16, CPU
//   lse         float32 [total_q, H_qo], optional (not with use_softmax = false)
// H_qo must be a multiple of H_kv; D_qk, D_vo multiples of 8 in [8, 512].
struct AttentionProblem {
  TensorView q;
  TensorView qo_indptr;
  KVCache kv;
  AttentionParams params;
};

struct AttentionOutput {
  TensorView o;
  std::optional<TensorView> lse;
};

// Throws flare::Error (naming the argument) for any malformed input; writes nothing then.
void validate_attention(const AttentionProblem& problem, const AttentionOutput& out);

// o (and lse) <- attention(problem). Validates first.
void reference_attention(const AttentionProblem& problem, const AttentionOutput& out,
                         const ReferenceOptions& options = {});

// The building block shared by reference_attention and the plan executor: packed rows
// [row_begin, row_end) of `request` under KV head `kv_head` against KV positions
// [kv_begin, kv_end) only (masks still use the full kv_len). Packed row r is query token
// r / group and query head kv_head * group + r % group (head-group fusion, 002 appendix A).
// Writes float32 o [rows, D_vo] and lse [rows] (natural log; -inf for rows that saw nothing).
// The problem must already be validated. With use_softmax = false lse is left untouched and
// o holds the unnormalized sum (partial sums merge by addition).
void reference_attend_rows(const AttentionProblem& problem, int64_t request, int64_t kv_head,
                           int64_t row_begin, int64_t row_end, int64_t kv_begin, int64_t kv_end,
                           float* o, float* lse, Accumulation accumulation);

// kv_len of one request (host), for either cache kind.
int64_t kv_length(const KVCache& kv, int64_t request);
int64_t num_kv_heads(const KVCache& kv);
int64_t head_dim_qk(const KVCache& kv);
int64_t head_dim_vo(const KVCache& kv);

}  // namespace flare
