// execute_cascade_cpu: a cascade plan's work items on their levels' problems, then its merge
// pieces (flare/reference/execute_cascade.h).
#include "flare/reference/execute_cascade.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "flare/core/error.h"
#include "flare/format/ragged.h"
#include "flare/reference/merge.h"
#include "src/reference/output_rows.h"

namespace flare {

void execute_cascade_cpu(const Plan& plan, const CascadeBatch& batch,
                         std::span<const AttentionProblem> levels, const AttentionOutput& out,
                         Accumulation accumulation) {
  FLARE_CHECK(static_cast<int>(levels.size()) == batch.num_levels(), ErrorCode::kInvalidArgument,
              "execute_cascade_cpu: ", levels.size(), " level problems for a cascade of ",
              batch.num_levels(), " levels");
  for (const AttentionProblem& level : levels) validate_attention(level, out);
  const AttentionProblem& last = levels.back();
  const int64_t heads = num_kv_heads(last.kv);
  const int64_t group = last.q.shape[1] / heads;
  const int64_t dim = head_dim_vo(last.kv);
  const bool softmax = last.params.use_softmax;
  FLARE_CHECK(plan.group_size == group && plan.num_kv_heads == heads, ErrorCode::kInvalidArgument,
              "execute_cascade_cpu: the plan is for group ", plan.group_size, " and ",
              plan.num_kv_heads, " KV heads");
  const int64_t slot_rows = plan.query_tile;
  std::vector<float> partial_o(static_cast<size_t>(plan.num_partial_slots * slot_rows * dim));
  std::vector<float> partial_lse(static_cast<size_t>(plan.num_partial_slots * slot_rows));
  auto level_of = [&](int32_t request) {
    const auto it =
        std::upper_bound(batch.first_request.begin(), batch.first_request.end(), request);
    FLARE_CHECK(request >= 0 && it != batch.first_request.end(), ErrorCode::kInvalidArgument,
                "execute_cascade_cpu: request ", request, " is outside the cascade's batch");
    return static_cast<int>(it - batch.first_request.begin()) - 1;
  };

  std::vector<float> o, lse;
  for (const WorkItem& item : plan.work_items) {
    const int level = level_of(item.request);
    const int64_t group_index = item.request - batch.first_request[static_cast<size_t>(level)];
    const AttentionProblem& problem = levels[static_cast<size_t>(level)];
    const int64_t rows = item.row_end - item.row_begin;
    for (int32_t h = 0; h < plan.item_heads; ++h) {
      const int64_t kv_head = item.kv_head + h;
      if (item.partial_slot >= 0) {
        const auto slot = static_cast<size_t>(item.partial_slot + h);
        FLARE_CHECK(slot < static_cast<size_t>(plan.num_partial_slots) && rows <= slot_rows,
                    ErrorCode::kInvalidArgument, "execute_cascade_cpu: bad partial slot");
        reference_attend_rows(
            problem, group_index, kv_head, item.row_begin, item.row_end, item.kv_begin, item.kv_end,
            partial_o.data() + slot * static_cast<size_t>(slot_rows * dim),
            partial_lse.data() + slot * static_cast<size_t>(slot_rows), accumulation);
        continue;
      }
      o.assign(static_cast<size_t>(rows * dim), 0.0f);
      lse.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
      reference_attend_rows(problem, group_index, kv_head, item.row_begin, item.row_end,
                            item.kv_begin, item.kv_end, o.data(), lse.data(), accumulation);
      reference_detail::write_output_rows(
          out, group, dim, ragged_begin(problem.qo_indptr, group_index), kv_head, item.row_begin,
          item.row_end, o.data(), lse.data(), softmax);
    }
  }

  FLARE_CHECK(plan.merge_row_offsets.size() == plan.merge_slots.size() &&
                  plan.merge_indptr.size() == plan.merge_items.size() + 1,
              ErrorCode::kInvalidArgument, "execute_cascade_cpu: not a cascade merge map");
  const int last_level = batch.num_levels() - 1;
  FLARE_CHECK(plan.merge_heads >= 1 && heads % plan.merge_heads == 0, ErrorCode::kInvalidArgument,
              "execute_cascade_cpu: merge_heads ", plan.merge_heads, " does not divide the ", heads,
              " KV heads");
  // Merge item m under its KV head + h (merge_heads of them) reads its entries' slots + h.
  for (size_t mh = 0; mh < plan.merge_items.size() * static_cast<size_t>(plan.merge_heads); ++mh) {
    const size_t m = mh / static_cast<size_t>(plan.merge_heads);
    const auto h = static_cast<int32_t>(mh % static_cast<size_t>(plan.merge_heads));
    const MergeItem& merge = plan.merge_items[m];
    FLARE_CHECK(level_of(merge.request) == last_level && merge.kv_head + h < heads,
                ErrorCode::kInvalidArgument, "execute_cascade_cpu: merge item ", m,
                " is not a last-level group's, or its heads exceed the KV heads");
    const int64_t rows = merge.row_end - merge.row_begin;
    o.assign(static_cast<size_t>(rows * dim), 0.0f);
    lse.assign(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    for (int32_t s = plan.merge_indptr[m]; s < plan.merge_indptr[m + 1]; ++s) {
      const auto slot = static_cast<size_t>(plan.merge_slots[static_cast<size_t>(s)] + h);
      const auto offset = static_cast<size_t>(plan.merge_row_offsets[static_cast<size_t>(s)]);
      FLARE_CHECK(slot < static_cast<size_t>(plan.num_partial_slots) &&
                      offset + static_cast<size_t>(rows) <= static_cast<size_t>(slot_rows),
                  ErrorCode::kInvalidArgument, "execute_cascade_cpu: merge entry ", s,
                  " lies outside its slot");
      const float* slot_o = partial_o.data() + (slot * slot_rows + offset) * dim;
      const float* slot_lse = partial_lse.data() + slot * slot_rows + offset;
      for (int64_t row = 0; row < rows; ++row) {
        if (softmax) {
          merge_into(o.data() + row * dim, lse.data() + row, slot_o + row * dim, slot_lse[row],
                     dim);
        } else {  // unnormalized sums add (variants without softmax)
          for (int64_t d = 0; d < dim; ++d)
            o[static_cast<size_t>(row * dim + d)] += slot_o[row * dim + d];
        }
      }
    }
    const int64_t group_index =
        merge.request - batch.first_request[static_cast<size_t>(last_level)];
    reference_detail::write_output_rows(out, group, dim, ragged_begin(last.qo_indptr, group_index),
                                        merge.kv_head + h, merge.row_begin, merge.row_end, o.data(),
                                        lse.data(), softmax);
  }
}

}  // namespace flare
