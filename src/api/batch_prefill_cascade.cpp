// BatchPrefill::plan_cascade: a cascade's levels validated, made one batch of virtual requests
// (plan/cascade.h), planned like any batch, its merge map rewritten into pieces, and staged
// with the virtual requests' tables; run() is unchanged.
#include <algorithm>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_sync.h"
#include "flare/plan/cascade.h"
#include "src/api/batch_prefill_state.h"
#include "src/api/prefill_config.h"
#include "src/api/prefill_plan.h"

namespace flare {
namespace {

const char* const kWhat = api_detail::kBatchPrefillWhat;

// What a cascade's launch cannot do (kUnsupported), checked before anything else.
void check_cascade_config(const BatchPrefillConfig& c, size_t levels) {
  FLARE_CHECK(levels >= 1 && levels <= static_cast<size_t>(c.max_levels),
              ErrorCode::kInvalidArgument, kWhat,
              ": plan_cascade needs 1 to max_levels = ", c.max_levels, " levels, got ", levels);
  FLARE_CHECK(c.kv == PrefillKV::kPaged && !api_detail::is_nvfp4_prefill(c),
              ErrorCode::kUnsupported, kWhat,
              ": plan_cascade needs paged 16-bit K/V (its levels are page lists)");
  FLARE_CHECK(c.params.mask != MaskMode::kCustom && !c.variant, ErrorCode::kUnsupported, kWhat,
              ": plan_cascade takes no custom mask or user variant (their per-request bits and "
              "tensors would be indexed by the cascade's groups)");
  const bool positional = c.params.window_left >= 0 || c.params.pos_encoding != PosEncoding::kNone;
  FLARE_CHECK(!(c.params.mask == MaskMode::kCausal && levels > 1 && positional),
              ErrorCode::kUnsupported, kWhat,
              ": a causal cascade of several levels takes no window, ALiBi or RoPE: its shared "
              "levels place their queries after all their keys, not bottom-right");
}

}  // namespace

void BatchPrefill::plan_cascade(std::span<const CascadeLevel> levels, cuda::Stream stream) {
  State& s = *state_;
  const BatchPrefillConfig& c = s.config;
  check_cascade_config(c, levels.size());
  {
    const cuda::DeviceScope scope(c.device);
    FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
                ": plan_cascade() must not be called while its stream is being captured");
  }
  // Each level's KV lengths; the page ranges back to back over the levels.
  std::vector<std::vector<int32_t>> kv_lens(levels.size());
  std::vector<CascadeLevelLengths> lengths(levels.size());
  std::vector<int32_t> kv_indptr{0};
  std::vector<int32_t> last_page_len;
  for (size_t l = 0; l < levels.size(); ++l) {
    const CascadeLevel& level = levels[l];
    const int64_t groups = static_cast<int64_t>(level.qo_indptr.size()) - 1;
    FLARE_CHECK(groups >= 1 && static_cast<int64_t>(level.kv_indptr.size()) == groups + 1 &&
                    static_cast<int64_t>(level.kv_last_page_len.size()) == groups,
                ErrorCode::kInvalidArgument, kWhat, ": level ", l,
                ": qo_indptr and kv_indptr need groups + 1 >= 2 entries and kv_last_page_len "
                "groups, got ",
                level.qo_indptr.size(), ", ", level.kv_indptr.size(), " and ",
                level.kv_last_page_len.size());
    FLARE_CHECK(level.kv_indptr[0] == kv_indptr.back(), ErrorCode::kInvalidArgument, kWhat,
                ": level ", l, ": kv_indptr[0] must be ", kv_indptr.back(),
                l == 0 ? " (level 0's pages start the page ids)"
                       : " (where the level before's pages end: the levels' page ids back to "
                         "back in one array)",
                ", got ", level.kv_indptr[0]);
    kv_lens[l].resize(static_cast<size_t>(groups));
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t pages = int64_t{level.kv_indptr[static_cast<size_t>(g) + 1]} -
                            level.kv_indptr[static_cast<size_t>(g)];
      FLARE_CHECK(pages >= 0, ErrorCode::kInvalidArgument, kWhat, ": level ", l,
                  ": kv_indptr must be non-decreasing: kv_indptr[", g + 1,
                  "]=", level.kv_indptr[static_cast<size_t>(g) + 1], " < kv_indptr[", g,
                  "]=", level.kv_indptr[static_cast<size_t>(g)]);
      const int64_t last = level.kv_last_page_len[static_cast<size_t>(g)];
      FLARE_CHECK(pages == 0 || (last >= 1 && last <= c.page_size), ErrorCode::kInvalidArgument,
                  kWhat, ": level ", l, ": kv_last_page_len[", g, "] must be in [1, ", c.page_size,
                  "], got ", last);
      const int64_t kv_len = pages == 0 ? 0 : (pages - 1) * c.page_size + last;
      FLARE_CHECK(kv_len <= std::numeric_limits<int32_t>::max(), ErrorCode::kUnsupported, kWhat,
                  ": level ", l, ": group ", g, " has ", kv_len,
                  " KV tokens, more than int32 holds");
      kv_lens[l][static_cast<size_t>(g)] = static_cast<int32_t>(kv_len);
      kv_indptr.push_back(level.kv_indptr[static_cast<size_t>(g) + 1]);
      last_page_len.push_back(level.kv_last_page_len[static_cast<size_t>(g)]);
    }
    lengths[l] = {level.qo_indptr, kv_lens[l]};
  }
  CascadeBatch batch;
  cascade_batch(lengths, c.params.mask == MaskMode::kCausal, batch);
  const int64_t requests = batch.num_requests();
  FLARE_CHECK(requests <= c.max_batch, ErrorCode::kInvalidArgument, kWhat, ": the levels have ",
              requests, " groups in all, more than max_batch = ", c.max_batch,
              " (a cascade's groups are the launch's requests)");
  FLARE_CHECK(batch.total_qo <= c.max_total_qo, ErrorCode::kInvalidArgument, kWhat,
              ": the batch has ", batch.total_qo,
              " query tokens, more than max_total_qo = ", c.max_total_qo);
  FLARE_CHECK(s.captured_kv < 0 || kv_indptr.back() <= s.captured_kv, ErrorCode::kInvalidArgument,
              kWhat, ": the levels have ", kv_indptr.back(), " pages, more than the ",
              s.captured_kv, " entries of the kv_indices tensor the captured run() reads");

  api_detail::PrefillHostPlan& next = s.next;
  next.batch = requests;
  next.total_qo = batch.total_qo;
  next.mask_bytes = 0;
  next.mask_indptr.clear();
  next.qo_len = batch.plan_qo_len;
  next.kv_len = batch.kv_len;
  next.q_offset = batch.q_offset;
  if (s.fixed_tiles) {
    next.tiles = *s.fixed_tiles;
  } else {
    const int tile =
        api_detail::cascade_query_tile(batch, c, s.limits, s.props.memory_peak_bytes_per_us);
    next.tiles = api_detail::with_config_kv_tile(
        choose_prefill_tiles(tile, c.head_dim_qk, api_detail::prefill_kernel_head_dim_vo(c),
                             c.params.mask, s.limits),
        c);
  }
  const api_detail::PrefillKernel& kernel = s.kernel(next.tiles);
  api_detail::plan_prefill(c, s.plan_sms, kernel.ctas_per_sm, s.props.memory_peak_bytes_per_us,
                           next);
  cascade_merge_map(batch, next.plan);
  commit_plan(batch.qo_begin, kv_indptr, last_page_len, stream);
}

}  // namespace flare
