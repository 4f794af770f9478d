// Composable formats in one launch (papers 001 §3.1, issue 20): query tokens attend several
// levels of KV; each level partitions the batch's tokens into groups (its qo_indptr) and each
// group attends its own KV (a shared prefix, a request's own pages). A token's output is the
// ⊕ of its groups' attention states over the levels.
//
// The levels become one batch of "virtual requests" (level l's group g is virtual request
// first_request[l] + g) that one prefill launch plans and runs: a group's query rows form one
// request, so a prefix shared by 64 requests is read once per query tile instead of 64 times.
// Every tile whose rows another level also covers writes float32 partial states; the merge
// launch then reduces, per piece of rows, the states of every level's tile covering it (the
// merge map's row offsets say where a piece starts inside a shared level's slot). A tile no
// other level overlaps, computed in one KV chunk, writes o directly.
//
// Masks: non-causal, or causal within the last level only (FlashInfer's
// MultiLevelCascadeAttentionWrapper): a causal kernel sees all of a shared level's keys because
// its tokens are placed at KV position kv_len - 1 (q_offset); positions in the shared levels
// then differ from bottom-right alignment, so position-dependent variants are refused there
// (BatchPrefill::plan_cascade).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "flare/plan/plan.h"

namespace flare {

// One level's lengths (host).
struct CascadeLevelLengths {
  std::span<const int32_t> qo_indptr;  // [groups + 1]: group g's tokens are [qo_indptr[g],
                                       // qo_indptr[g + 1]); 0 first, the batch's total last
  std::span<const int32_t> kv_len;     // [groups]: KV tokens of each group
};

// The virtual batch of a cascade, one entry per (level, group).
struct CascadeBatch {
  std::vector<int32_t> first_request;  // [levels + 1]: level l's groups are the requests
                                       // [first_request[l], first_request[l + 1])
  std::vector<int32_t> qo_begin;       // first token of each virtual request
  std::vector<int32_t> qo_len;         // its tokens
  std::vector<int32_t> kv_len;         // its KV tokens
  std::vector<int32_t> q_offset;       // KV position of its token 0 (PlanProblem::q_offset)
  std::vector<int32_t> plan_qo_len;    // what plan() gets: qo_len, 0 for a group without KV
                                       // in a level other than the last (no tiles to merge)
  int64_t total_qo = 0;

  int num_levels() const { return static_cast<int>(first_request.size()) - 1; }
  int32_t num_requests() const { return first_request.empty() ? 0 : first_request.back(); }
};

// Validates the levels (kInvalidArgument naming the level and array: a level's qo_indptr must
// start at 0, never decrease and end at the same total as every other level's; kv_len >= 0)
// and builds the virtual batch. `causal`: the last level causal (bottom-right aligned), the
// others fully visible (q_offset kv_len - 1); otherwise every level bottom-right aligned.
void cascade_batch(std::span<const CascadeLevelLengths> levels, bool causal, CascadeBatch& out);

// Rewrites `plan` (plan() of the virtual batch: qo_len = batch.plan_qo_len, kv_len, q_offset)
// into a cascade plan: every (work item, KV head) whose rows another level covers, or whose
// tile was split, gets a partial slot; merge items become pieces of rows (the common
// refinement of all levels' tiles, within a last-level group, under each KV head, or once for
// all heads when every work item covers all of them: Plan::merge_heads) with one merge_slots
// entry (and merge_row_offsets entry) per covering chunk, levels in order and each level's
// chunks in KV order; a piece's request is its last-level group. Tiles alone on their rows and
// in one chunk keep partial_slot -1 (write-through) and make no piece (the last level covers
// every token, so every row is written). Deterministic: the same levels give the same plan.
void cascade_merge_map(const CascadeBatch& batch, Plan& plan);

}  // namespace flare
