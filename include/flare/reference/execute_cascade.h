// Executes a cascade plan (flare/plan/cascade.h) on the CPU the way BatchPrefill's launch
// does: every work item on its level's problem into o (write-through) or a float32 partial
// slot, then each merge piece over its slots from the recorded row offsets. Proves cascade
// plans and their merge maps in CI.
#pragma once

#include <span>

#include "flare/plan/cascade.h"
#include "flare/reference/attention.h"

namespace flare {

// levels[l]: level l's problem: the batch's q, qo_indptr = the level's groups, its KV, and the
// params (a causal cascade: causal in the last level only, no mask in the others; the GPU's
// causal kernel sees the same keys there through q_offset). `plan` and `batch` from
// cascade_batch / plan() / cascade_merge_map over these levels' lengths. Writes out.o (and
// out.lse, natural log) for every token of the batch; deterministic.
void execute_cascade_cpu(const Plan& plan, const CascadeBatch& batch,
                         std::span<const AttentionProblem> levels, const AttentionOutput& out,
                         Accumulation accumulation = Accumulation::kF32);

}  // namespace flare
