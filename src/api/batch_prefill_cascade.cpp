// BatchPrefill::plan_cascade: a cascade's levels validated and made one batch of virtual
// requests (src/api/cascade_plan.h, plan/cascade.h), planned like any batch, its merge map
// rewritten into pieces, and staged with the virtual requests' tables; run() is unchanged.
#include "flare/api/batch_prefill.h"
#include "flare/plan/cascade.h"
#include "src/api/batch_prefill_state.h"
#include "src/api/prefill_plan.h"

namespace flare {

void BatchPrefill::plan_cascade(std::span<const CascadeLevel> levels, cuda::Stream stream) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  const char* const kWhat = State::kWhat;
  s.check_not_capturing(stream, "plan_cascade()");
  s.check_may_plan();
  api_detail::CascadeHostPlan& cascade = s.cascade;
  api_detail::validate_cascade(c, levels, s.fixed_tiles, s.limits, s.props.memory_peak_bytes_per_us,
                               cascade, s.next);
  FLARE_CHECK(s.captured_kv < 0 || cascade.kv_indptr.back() <= s.captured_kv,
              ErrorCode::kInvalidArgument, kWhat, ": the levels have ", cascade.kv_indptr.back(),
              " pages, more than the ", s.captured_kv,
              " entries of the kv_indices tensor the captured run() reads");
  s.next.rope_staged = false;  // cascades rotate in the kernels (paged K/V)
  const api_detail::PrefillKernel& kernel = s.kernel(s.next.tiles);
  api_detail::plan_prefill(c, s.plan_sms, kernel.ctas_per_sm, s.props.memory_peak_bytes_per_us,
                           s.next);
  cascade_merge_map(cascade.batch, s.next.plan);
  commit_plan(cascade.batch.qo_begin, cascade.kv_indptr, cascade.last_page_len, stream);
}

}  // namespace flare
