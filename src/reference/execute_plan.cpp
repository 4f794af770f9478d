// execute_plan_cpu: the CPU backend's run() of a Plan, and the proof in CI that plans are
// correct. Work items run on threads (one item, under each KV head it covers, per thread at a
// time, CTAs taken in index order); merges reduce partial slots in slot order. Each output element
// is written by exactly one item or merge from inputs that do not depend on the thread count, so
// the output is bitwise identical for any number of threads.
#include "flare/reference/execute_plan.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "flare/core/error.h"
#include "flare/format/ragged.h"
#include "flare/reference/merge.h"
#include "src/reference/output_rows.h"

namespace flare {
namespace {

struct Geometry {
  int64_t batch = 0;
  int64_t group = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim_vo = 0;
};

void check_range(bool ok, const char* what, size_t index, const char* expected) {
  FLARE_CHECK(ok, ErrorCode::kInvalidArgument, "execute_plan_cpu: ", what, " ", index, " ",
              expected, " (the plan was not made for this problem)");
}

// Everything the executor indexes with, checked before anything is written.
void check_plan(const Plan& plan, const AttentionProblem& problem, const Geometry& geometry) {
  FLARE_CHECK(plan.group_size == geometry.group && plan.num_kv_heads == geometry.num_kv_heads &&
                  plan.head_dim_vo == geometry.head_dim_vo,
              ErrorCode::kInvalidArgument, "execute_plan_cpu: plan is for group ", plan.group_size,
              ", ", plan.num_kv_heads, " KV heads, head_dim_vo ", plan.head_dim_vo,
              "; problem has group ", geometry.group, ", ", geometry.num_kv_heads,
              " KV heads, head_dim_vo ", geometry.head_dim_vo);
  FLARE_CHECK(problem.params.use_softmax || !plan.split_kv, ErrorCode::kInvalidArgument,
              "execute_plan_cpu: use_softmax = false needs a plan made with disable_split_kv "
              "(partial states without softmax do not merge by ⊕)");
  const size_t items = plan.work_items.size();
  FLARE_CHECK(
      plan.num_ctas >= 1 && plan.cta_indptr.size() == static_cast<size_t>(plan.num_ctas) + 1 &&
          plan.cta_indptr.front() == 0 && plan.cta_indptr.back() == static_cast<int32_t>(items) &&
          std::is_sorted(plan.cta_indptr.begin(), plan.cta_indptr.end()),
      ErrorCode::kInvalidArgument,
      "execute_plan_cpu: cta_indptr must be a monotone [num_ctas + 1] indptr over the ", items,
      " work items");
  FLARE_CHECK(plan.merge_heads == 1 && plan.merge_row_offsets.empty(),
              ErrorCode::kInvalidArgument,
              "execute_plan_cpu: a cascade plan's merge map (merge_heads, row offsets) runs on "
              "execute_cascade_cpu");
  FLARE_CHECK(plan.item_heads >= 1 && plan.item_heads <= geometry.num_kv_heads,
              ErrorCode::kInvalidArgument, "execute_plan_cpu: item_heads must be in [1, ",
              geometry.num_kv_heads, "], got ", plan.item_heads);
  const int64_t slot_rows = plan.query_tile;
  const int64_t last_head = plan.item_heads - 1;  // of an item, past its kv_head
  for (size_t i = 0; i < items; ++i) {
    const WorkItem& item = plan.work_items[i];
    check_range(item.request >= 0 && item.request < geometry.batch, "work item", i,
                "names a request outside the batch");
    const int64_t q_len = ragged_length(problem.qo_indptr, item.request);
    const int64_t kv_len = kv_length(problem.kv, item.request);
    check_range(item.kv_head >= 0 && item.kv_head + last_head < geometry.num_kv_heads &&
                    item.row_begin >= 0 && item.row_begin < item.row_end &&
                    item.row_end <= q_len * geometry.group && item.kv_begin >= 0 &&
                    item.kv_begin <= item.kv_end && item.kv_end <= kv_len,
                "work item", i, "has a KV head, rows or KV range outside its request");
    check_range(
        item.partial_slot == -1 ||
            (item.partial_slot >= 0 && item.partial_slot + last_head < plan.num_partial_slots &&
             item.row_end - item.row_begin <= slot_rows),
        "work item", i, "names a partial slot outside the plan's");
  }
  FLARE_CHECK(plan.merge_indptr.size() == plan.merge_items.size() + 1 &&
                  plan.merge_indptr.front() == 0 &&
                  plan.merge_indptr.back() == static_cast<int32_t>(plan.merge_slots.size()) &&
                  std::is_sorted(plan.merge_indptr.begin(), plan.merge_indptr.end()),
              ErrorCode::kInvalidArgument,
              "execute_plan_cpu: merge_indptr must be a monotone [merge items + 1] indptr over "
              "the ",
              plan.merge_slots.size(), " merge slots");
  for (size_t i = 0; i < plan.merge_slots.size(); ++i) {
    check_range(plan.merge_slots[i] >= 0 && plan.merge_slots[i] < plan.num_partial_slots,
                "merge slot", i, "is outside the plan's partial slots");
  }
  for (size_t i = 0; i < plan.merge_items.size(); ++i) {
    const MergeItem& merge = plan.merge_items[i];
    check_range(
        merge.request >= 0 && merge.request < geometry.batch && merge.kv_head >= 0 &&
            merge.kv_head < geometry.num_kv_heads && merge.row_begin >= 0 &&
            merge.row_begin < merge.row_end && merge.row_end - merge.row_begin <= slot_rows &&
            merge.row_end <= ragged_length(problem.qo_indptr, merge.request) * geometry.group,
        "merge item", i, "has rows outside its request");
  }
}

// Writes float32 rows o [rows, D] (and lse [rows]) of packed rows [row_begin, row_end) of
// `request` under `kv_head` into the final output, in o's dtype.
void write_rows(const AttentionProblem& problem, const AttentionOutput& out,
                const Geometry& geometry, int64_t request, int64_t kv_head, int64_t row_begin,
                int64_t row_end, const float* o, const float* lse) {
  reference_detail::write_output_rows(out, geometry.group, geometry.head_dim_vo,
                                      ragged_begin(problem.qo_indptr, request), kv_head, row_begin,
                                      row_end, o, lse, problem.params.use_softmax);
}

// Runs task(i) for i in [0, count) on up to num_threads threads, in index order per thread;
// rethrows the first exception after all threads joined.
void parallel_for(int64_t count, int num_threads, const std::function<void(int64_t)>& task) {
  const int threads = static_cast<int>(std::clamp<int64_t>(count, 1, num_threads));
  if (threads == 1) {
    for (int64_t i = 0; i < count; ++i) task(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto worker = [&] {
    try {
      for (int64_t i = next++; i < count; i = next++) task(i);
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
      next = count;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

void execute_plan_cpu(const Plan& plan, const AttentionProblem& problem, const AttentionOutput& out,
                      const ReferenceOptions& options) {
  FLARE_CHECK(options.num_threads >= 0, ErrorCode::kInvalidArgument,
              "ReferenceOptions::num_threads must be >= 0 (0 = all cores), got ",
              options.num_threads);
  validate_attention(problem, out);
  Geometry geometry;
  geometry.batch = ragged_batch(problem.qo_indptr);
  geometry.num_kv_heads = num_kv_heads(problem.kv);
  geometry.group = problem.q.shape[1] / geometry.num_kv_heads;
  geometry.head_dim_vo = head_dim_vo(problem.kv);
  check_plan(plan, problem, geometry);
  const int num_threads = options.num_threads > 0
                              ? options.num_threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  // Partial slots: float32 [slots][query_tile][D] and [slots][query_tile].
  const int64_t slot_rows = plan.query_tile;
  const int64_t dim = geometry.head_dim_vo;
  std::vector<float> partial_o(static_cast<size_t>(plan.num_partial_slots * slot_rows * dim));
  std::vector<float> partial_lse(static_cast<size_t>(plan.num_partial_slots * slot_rows));

  parallel_for(plan.num_ctas, num_threads, [&](int64_t cta) {
    std::vector<float> o;
    std::vector<float> lse;
    for (int32_t i = plan.cta_indptr[static_cast<size_t>(cta)];
         i < plan.cta_indptr[static_cast<size_t>(cta) + 1]; ++i) {
      const WorkItem& item = plan.work_items[static_cast<size_t>(i)];
      const int64_t rows = item.row_end - item.row_begin;
      for (int32_t h = 0; h < plan.item_heads; ++h) {  // the item's queue entries
        const int32_t kv_head = item.kv_head + h;
        if (item.partial_slot >= 0) {
          const auto slot = static_cast<size_t>(item.partial_slot + h);
          reference_attend_rows(
              problem, item.request, kv_head, item.row_begin, item.row_end, item.kv_begin,
              item.kv_end, partial_o.data() + slot * static_cast<size_t>(slot_rows * dim),
              partial_lse.data() + slot * static_cast<size_t>(slot_rows), options.accumulation);
          continue;
        }
        o.resize(static_cast<size_t>(rows * dim));
        lse.resize(static_cast<size_t>(rows));
        reference_attend_rows(problem, item.request, kv_head, item.row_begin, item.row_end,
                              item.kv_begin, item.kv_end, o.data(), lse.data(),
                              options.accumulation);
        write_rows(problem, out, geometry, item.request, kv_head, item.row_begin, item.row_end,
                   o.data(), lse.data());
      }
    }
  });

  const auto merges = static_cast<int64_t>(plan.merge_items.size());
  parallel_for(merges, num_threads, [&](int64_t m) {
    const MergeItem& merge = plan.merge_items[static_cast<size_t>(m)];
    const int64_t rows = merge.row_end - merge.row_begin;
    std::vector<float> o(static_cast<size_t>(rows * dim), 0.0f);
    std::vector<float> lse(static_cast<size_t>(rows), -std::numeric_limits<float>::infinity());
    for (int32_t s = plan.merge_indptr[static_cast<size_t>(m)];
         s < plan.merge_indptr[static_cast<size_t>(m) + 1]; ++s) {
      const auto slot = static_cast<size_t>(plan.merge_slots[static_cast<size_t>(s)]);
      const float* slot_o = partial_o.data() + slot * static_cast<size_t>(slot_rows * dim);
      const float* slot_lse = partial_lse.data() + slot * static_cast<size_t>(slot_rows);
      for (int64_t row = 0; row < rows; ++row) {
        merge_into(o.data() + row * dim, lse.data() + row, slot_o + row * dim, slot_lse[row], dim);
      }
    }
    write_rows(problem, out, geometry, merge.request, merge.kv_head, merge.row_begin, merge.row_end,
               o.data(), lse.data());
  });
}

}  // namespace flare
