// Algorithm 1 over head groups (src/plan/plan.cpp queue_head_group, thirty-fourth session)
// against the per-head schedule: random problems (batch 1-96, KV 1-8192, q1 / up to 16 / up to
// the KV length, causal or not, 1-32 KV heads, GQA 1-8, pages 1 / 16 / 64, query tiles auto /
// 16 / 64 / 128, item cost 0 or 128, 1-3 CTAs an SM on 132 SMs). For each one-queue plan with
// fill splits (Algorithm 1's pieces), the queue entries (items expanded over their heads) are
// compared with the per-CTA plan's, which is Algorithm 1 per head on all CTAs; where they
// differ, the dynamic queue's end under the cost model of both entry sets in one queue order, as
// a ratio.
// Build here: g++ -O2 -std=c++20 -Iinclude -I. experiments/head_group_entries.cpp -Lbuild
//   -lflare -Wl,-rpath,build -o /tmp/head_group_entries && /tmp/head_group_entries [trials]
#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "flare/plan/plan.h"

using namespace flare;

namespace {

double cost(const WorkItem& w, const PlanOptions& o) {
  return o.alpha * (w.row_end - w.row_begin) + o.beta * (w.kv_end - w.kv_begin) + o.item_cost;
}

// The plan's queue entries (items expanded over their heads) in the queue order of plan/plan.h
// (length class of kv_tile 64 descending, request, KV head, rows descending, KV), each to the
// CTA that ends first (the kernel's dynamic queue under the cost model); latest end / mean. The
// same order for both plans, so the ratio compares their cuts alone.
double queue_end(const Plan& p, const PlanOptions& o, int ctas) {
  std::vector<std::tuple<int, int, int, int, int, double>> queue;
  for (const WorkItem& w : p.work_items) {
    const auto tiles = static_cast<uint32_t>((w.kv_end - w.kv_begin + 63) / 64);
    for (int h = 0; h < p.item_heads; ++h) {
      queue.emplace_back(-std::bit_width(tiles), w.request, w.kv_head + h, -w.row_begin, w.kv_begin,
                         cost(w, o));
    }
  }
  std::sort(queue.begin(), queue.end());
  std::vector<double> ends(static_cast<size_t>(ctas), 0.0);
  double total = 0;
  for (const auto& entry : queue) {
    *std::min_element(ends.begin(), ends.end()) += std::get<5>(entry);
    total += std::get<5>(entry);
  }
  return *std::max_element(ends.begin(), ends.end()) / (total / ctas);
}

std::multiset<std::tuple<int, int, int, int, int>> entries(const Plan& p) {
  std::multiset<std::tuple<int, int, int, int, int>> set;
  for (const WorkItem& w : p.work_items) {
    for (int h = 0; h < p.item_heads; ++h) {
      set.insert({w.request, w.kv_head + h, w.row_begin, w.kv_begin, w.kv_end});
    }
  }
  return set;
}

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::atoi(argv[1]) : 3000;
  std::mt19937 rng(5);
  const auto pick = [&rng](std::vector<int> v) { return v[rng() % v.size()]; };
  int compared = 0, same = 0, grouped = 0;
  std::vector<double> ratios;
  for (int trial = 0; trial < trials; ++trial) {
    const int batch = 1 + static_cast<int>(rng() % 96);
    const int kv_heads = pick({1, 2, 4, 8, 32});
    const int group = pick({1, 4, 8});
    const int q_mode = static_cast<int>(rng() % 3);
    std::vector<int32_t> q(static_cast<size_t>(batch)), kv(static_cast<size_t>(batch));
    for (int b = 0; b < batch; ++b) {
      kv[b] = 1 + static_cast<int32_t>(rng() % 8192);
      q[b] = q_mode == 0 ? 1 : q_mode == 1 ? 1 + rng() % 16 : 1 + rng() % kv[b];
      q[b] = std::min(q[b], kv[b]);
    }
    PlanProblem problem;
    problem.qo_len = q;
    problem.kv_len = kv;
    problem.num_kv_heads = kv_heads;
    problem.num_qo_heads = kv_heads * group;
    problem.head_dim_qk = problem.head_dim_vo = 128;
    problem.page_size = pick({1, 16, 64});
    problem.causal = rng() % 2 == 0;
    PlanOptions options;
    options.item_cost = rng() % 2 == 0 ? 128 : 0;
    options.query_tile = pick({0, 16, 64, 128});
    const DeviceSpec device{132, 1 + static_cast<int>(rng() % 3)};
    PlanOptions queue = options;
    queue.one_queue = true;
    queue.kv_tile = 64;
    const Plan one = plan(problem, device, queue);
    const Plan per_cta = plan(problem, device, options);
    // Algorithm 1's pieces with fill splits: more entries than the per-CTA plan's chunks would
    // make without them is not knowable here; compare every one-queue plan that is not the queue
    // of whole-head chunks (item_heads below the heads) or that has split pieces.
    if (one.item_heads == kv_heads && one.num_partial_slots == 0) continue;
    ++compared;
    grouped += one.item_heads > 1 && one.item_heads < kv_heads;
    if (entries(one) == entries(per_cta)) {
      ++same;
      continue;
    }
    const int ctas = 132 * device.ctas_per_sm;
    ratios.push_back(queue_end(one, queue, ctas) / queue_end(per_cta, queue, ctas));
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf(
      "one-queue plans compared %d (items over part of the heads: %d): same entries as "
      "the per-head schedule %d, different %zu\n",
      compared, grouped, same, ratios.size());
  const auto beyond = [&ratios](double low, double high) {
    return std::count_if(ratios.begin(), ratios.end(),
                         [&](double r) { return r < low || r > high; });
  };
  std::printf("of those, outside 0.98-1.02: %td (above 1.02: %td)\n", beyond(0.98, 1.02),
              beyond(0, 1.02));
  if (!ratios.empty()) {
    std::printf(
        "queue end, one-queue / per-head: min %.4f p10 %.4f median %.4f p90 %.4f max %.4f\n",
        ratios.front(), ratios[ratios.size() / 10], ratios[ratios.size() / 2],
        ratios[ratios.size() * 9 / 10], ratios.back());
  }
}
