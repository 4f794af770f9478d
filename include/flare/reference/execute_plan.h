// Executes a Plan on the CPU: each CTA's work items through reference_attend_rows into the
// final output (write-through) or float32 partial slots, then the merge map. Proves plans
// correct in CI and is the CPU backend's execution path.
#pragma once

#include "flare/plan/plan.h"
#include "flare/reference/attention.h"

namespace flare {

// `plan` must come from plan() on this problem's lengths and heads. Output is bitwise
// identical for any num_threads (each work item is computed by one thread, merges run in
// slot order).
void execute_plan_cpu(const Plan& plan, const AttentionProblem& problem,
                      const AttentionOutput& out, const ReferenceOptions& options = {});

}  // namespace flare
