// Cascade test problems (flare/plan/cascade.h): the groups of every level over one page pool
// (levels' page ranges back to back in one page-id array, as BatchPrefill::plan_cascade takes
// them), each level's own problem over the same pages, and the oracle: each level's attention
// alone in float64, merged with ⊕ in level order.
#pragma once

#include <cstdint>
#include <numeric>
#include <vector>

#include "flare/plan/cascade.h"
#include "flare/reference/attention.h"
#include "flare/reference/merge.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare::testing {

struct CascadeSpec {
  std::vector<std::vector<int32_t>> qo_indptr;  // per level: [groups + 1] tokens
  std::vector<std::vector<int32_t>> kv_len;     // per level: [groups] KV tokens
  bool causal = false;                          // in the last level
};

// A spec of `levels` levels over `requests` requests of q_len in [q_min, q_max]: level 0 one
// group per `per_group` requests (a shared prefix of up to max_prefix tokens, some empty), the
// middle levels finer groups, the last level one group per request (suffix up to max_suffix).
inline CascadeSpec random_cascade(int levels, int requests, int q_min, int q_max, int max_prefix,
                                  int max_suffix, bool causal, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> q_len(static_cast<size_t>(requests));
  for (int32_t& q : q_len) q = static_cast<int32_t>(rng.uniform_int(q_min, q_max));
  CascadeSpec spec;
  spec.causal = causal;
  for (int l = 0; l < levels; ++l) {
    const bool last = l == levels - 1;
    // Requests per group: many in level 0, fewer below, one in the last level.
    const int per_group = last ? 1 : std::max(1, requests / (l == 0 ? 3 : 6));
    std::vector<int32_t> indptr{0};
    std::vector<int32_t> kv;
    for (int r = 0; r < requests;) {
      const int n =
          std::min(requests - r, last ? 1 : static_cast<int>(rng.uniform_int(1, per_group)));
      int32_t tokens = 0;
      for (int i = 0; i < n; ++i) tokens += q_len[static_cast<size_t>(r + i)];
      indptr.push_back(indptr.back() + tokens);
      const int max_len = last ? max_suffix : max_prefix;
      // Some shared groups hold no KV (a request without a shared prefix).
      kv.push_back(!last && rng.uniform_int(0, 4) == 0
                       ? 0
                       : static_cast<int32_t>(rng.uniform_int(last ? 0 : 1, max_len)));
      r += n;
    }
    spec.qo_indptr.push_back(indptr);
    spec.kv_len.push_back(kv);
  }
  return spec;
}

struct CascadeCase {
  CascadeSpec spec;
  int64_t total_q = 0;
  HostTensor q;
  TestKVCache cache;                 // every level's groups, level by level
  std::vector<int32_t> page_indptr;  // the pool's, over all levels' groups
  // Per level: its qo_indptr, and its pages' table rebased to start at 0.
  std::vector<HostTensor> level_qo, level_indptr, level_indices, level_last;
  std::vector<AttentionProblem> problems;

  CascadeCase(CascadeSpec s, int num_qo_heads, int num_kv_heads, int head_dim, int page_size,
              DType dtype, uint64_t seed, const AttentionParams& params = {})
      : spec(std::move(s)) {
    total_q = spec.qo_indptr[0].back();
    q = random_tensor(dtype, {total_q, num_qo_heads, head_dim}, seed);
    std::vector<int32_t> all_kv;
    for (const auto& kv : spec.kv_len) all_kv.insert(all_kv.end(), kv.begin(), kv.end());
    KVCacheSpec kv_spec;
    kv_spec.kv_lens = all_kv;
    kv_spec.num_kv_heads = num_kv_heads;
    kv_spec.head_dim_qk = kv_spec.head_dim_vo = head_dim;
    kv_spec.dtype = dtype;
    kv_spec.page_size = page_size;
    kv_spec.seed = seed + 1;
    cache = build_kv_cache(kv_spec);
    page_indptr = int32_values(cache.page_indptr.view());
    const std::vector<int32_t> indices = int32_values(cache.page_indices.view());
    const std::vector<int32_t> last = int32_values(cache.last_page_len.view());
    size_t group = 0;
    for (size_t l = 0; l < spec.qo_indptr.size(); ++l) {
      const size_t groups = spec.kv_len[l].size();
      std::vector<int32_t> indptr, level_pages, level_last_len;
      for (size_t g = 0; g <= groups; ++g) {
        indptr.push_back(page_indptr[group + g] - page_indptr[group]);
      }
      level_pages.assign(indices.begin() + page_indptr[group],
                         indices.begin() + page_indptr[group + groups]);
      // Empty groups: last_page_len 0 in the pool (any value is ignored without pages).
      for (size_t g = 0; g < groups; ++g) level_last_len.push_back(std::max(1, last[group + g]));
      group += groups;
      level_qo.push_back(int32_tensor(spec.qo_indptr[l]));
      level_indptr.push_back(int32_tensor(indptr));
      level_indices.push_back(
          int32_tensor(level_pages.empty() ? std::vector<int32_t>{0} : level_pages));
      level_last.push_back(int32_tensor(level_last_len));
    }
    for (size_t l = 0; l < spec.qo_indptr.size(); ++l) {
      AttentionProblem p;
      p.q = q.view();
      p.qo_indptr = level_qo[l].view();
      p.kv = PagedKV::from_separate(cache.paged.k, cache.paged.v, cache.paged.layout,
                                    level_indptr[l].view(), level_indices[l].view(),
                                    level_last[l].view());
      p.params = params;
      const bool last_level = l + 1 == spec.qo_indptr.size();
      p.params.mask = spec.causal && last_level ? MaskMode::kCausal : MaskMode::kNone;
      problems.push_back(p);
    }
  }

  std::vector<CascadeLevelLengths> lengths() const {
    std::vector<CascadeLevelLengths> out;
    for (size_t l = 0; l < spec.qo_indptr.size(); ++l) {
      out.push_back({spec.qo_indptr[l], spec.kv_len[l]});
    }
    return out;
  }

  // ⊕ over the levels of each level's float64 reference, into o and lse (natural log).
  void oracle(const TensorView& o, const TensorView& lse) const {
    const int64_t heads = q.shape()[1];
    const int64_t dim = q.shape()[2];
    HostTensor level_o(DType::kF32, {total_q, heads, dim});
    HostTensor level_lse(DType::kF32, {total_q, heads});
    for (size_t l = 0; l < problems.size(); ++l) {
      TensorView target_o = l == 0 ? o : level_o.view();
      TensorView target_lse = l == 0 ? lse : level_lse.view();
      reference_attention(problems[l], {target_o, target_lse}, {Accumulation::kF64, 2});
      if (l > 0) merge_state_in_place(o, lse, level_o.view(), level_lse.view());
    }
  }
};

}  // namespace flare::testing
