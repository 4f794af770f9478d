// Synthetic serving workloads for `flare bench`: per-request lengths drawn from a named
// distribution, a paged or ragged KV cache and queries filled with seeded random data, and the
// attention options of a named variant — plus the work such a batch implies (FLOPs, bytes).
#pragma once

#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/reference/attention.h"

namespace flare::cli {

enum class BenchMode : uint8_t { kDecode, kPrefill };
enum class BenchKV : uint8_t {
  kPaged,   // pages of page_size tokens, handed out in a random order
  kRagged,  // each request's tokens in one contiguous run of rows
};
enum class LengthDist : uint8_t {
  kConstant,  // every request has the mean length
  kUniform,   // uniform in [1, 2 * mean - 1]
  kZipf,      // rank r ~ Zipf(1.2) on 1..1000, length proportional to r, rescaled so the batch
              // has the requested mean: many short requests and a few very long ones
};
enum class BenchVariant : uint8_t {
  kDefault,  // plain softmax attention (causal in prefill)
  kSoftCap,  // logits soft-cap 50 (Gemma 2)
  kWindow,   // sliding window of a quarter of the mean KV length (at least 1)
  kAlibi,    // ALiBi with the default slopes
};

BenchMode parse_bench_mode(std::string_view name);    // "decode" | "prefill"
BenchKV parse_bench_kv(std::string_view name);        // "paged" | "ragged"
LengthDist parse_length_dist(std::string_view name);  // "constant" | "uniform" | "zipf"
BenchVariant parse_bench_variant(std::string_view name);
std::string_view name_of(BenchMode mode);
std::string_view name_of(BenchKV kv);
std::string_view name_of(LengthDist dist);
std::string_view name_of(BenchVariant variant);

struct WorkloadSpec {
  BenchMode mode = BenchMode::kDecode;
  int64_t batch = 32;
  int64_t kv_len = 1024;  // mean KV tokens per request (prefill: including the new tokens)
  int64_t qo_len = 1;     // mean query tokens per request; decode always uses 1
  LengthDist dist = LengthDist::kConstant;
  int64_t heads_qo = 32;
  int64_t heads_kv = 8;
  int64_t head_dim = 128;
  BenchKV kv = BenchKV::kPaged;
  int64_t page_size = 16;  // kPaged
  BenchVariant variant = BenchVariant::kDefault;
  DType dtype = DType::kBF16;     // q and o
  DType kv_dtype = DType::kBF16;  // k and v (f32, f16, bf16, e4m3, e5m2)
  uint64_t seed = 0;
};

// `count` lengths >= 1 with mean close to `mean` (>= 1), drawn from `dist`.
std::vector<int32_t> sample_lengths(LengthDist dist, int64_t count, int64_t mean,
                                    std::mt19937_64& rng);

// The batch, owning every buffer its problem() views point into (moves keep them valid).
struct Workload {
  WorkloadSpec spec;
  std::vector<int32_t> qo_lens;  // decode: all 1; prefill: sampled, each <= its kv_len
  std::vector<int32_t> kv_lens;
  HostTensor q;           // spec.dtype [total_q, heads_qo, head_dim], uniform in [-1, 1)
  HostTensor k;           // spec.kv_dtype; kPaged: NHD [pages, page_size, heads_kv, head_dim],
                          // pages handed out in a random order; kRagged: [total_kv, heads_kv,
                          // head_dim], request after request
  HostTensor v;           // same
  HostTensor qo_indptr;   // int32 [batch + 1]
  HostTensor kv_indptr;   // int32 [batch + 1]: pages (kPaged) or tokens (kRagged)
  HostTensor kv_indices;  // kPaged: int32 [pages]; kRagged: empty
  HostTensor kv_last_page_len;  // kPaged: int32 [batch]; kRagged: empty
  AttentionParams params;

  int64_t total_q() const { return q.shape()[0]; }
  int64_t total_kv() const;
  AttentionProblem problem() const;
  // (query token, key) pairs that survive the mask, summed over requests: the attention
  // FLOPs are 2 * pairs * heads_qo * (D_qk + D_vo).
  int64_t visible_pairs() const;
  // KV tokens some query of the request can see (what a kernel must read), summed.
  int64_t kv_tokens_read() const;
};

// int32 [values.size()] holding `values` (page tables, indptrs).
HostTensor int32_tensor(const std::vector<int32_t>& values);

// Throws kInvalidArgument for a spec no backend could run (heads that do not divide, ...).
Workload make_workload(const WorkloadSpec& spec);

}  // namespace flare::cli
