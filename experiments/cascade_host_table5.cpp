// Host time of BatchPrefill::plan_cascade()'s parts without a GPU on Table 5's shapes (the
// shapes of scripts/bench_cascade.cpp: decode, 32 / 32 heads, D 128, page 16, suffix 128 per
// request under one shared prefix of 1024 / 8192 / 32768 tokens, batch 16 and 64), H100 limits,
// 132 SMs at 2 CTAs: validation with the tile's pricing, plan(), the merge map, staging.
// Build here: g++ -O2 -g -std=c++20 -Iinclude -Isrc -I. experiments/cascade_host_table5.cpp
//   -Lbuild -lflare -Wl,-rpath,build -o /tmp/cascade_host_table5 && /tmp/cascade_host_table5 [runs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/plan/cascade.h"
#include "src/api/cascade_plan.h"
#include "experiments/host_timing.h"
#include "src/api/prefill_plan.h"

using namespace flare;
using host_timing::Clock;
using host_timing::median;
using host_timing::us;

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 2000;
  constexpr int kPage = 16, kSuffix = 128, kSms = 132, kCtas = 2;
  constexpr double kPeakBytesPerUs = 3.35e6;
  for (const int batch : {16, 64}) {
    for (const int prefix : {1024, 8192, 32768}) {
      BatchPrefillConfig c;
      c.max_batch = batch + 1;
      c.max_total_qo = batch;
      c.num_qo_heads = c.num_kv_heads = 32;
      c.head_dim_qk = c.head_dim_vo = 128;
      c.page_size = kPage;
      c.max_levels = 2;
      BatchPrefillConfig sized = c;
      sized.use_cuda_graph = true;
      const WorkspaceLayout layout =
          workspace_layout(api_detail::prefill_bounds(sized, kSms * kCtas, 128));
      const std::unique_ptr<std::byte[]> staging(new std::byte[layout.plan_bytes]);
      const int32_t prefix_pages = prefix / kPage;
      const std::vector<int32_t> qo0{0, batch}, kv0{0, prefix_pages}, last0{kPage};
      std::vector<int32_t> qo1, kv1, last1;
      for (int r = 0; r <= batch; ++r) {
        qo1.push_back(r);
        kv1.push_back(prefix_pages + r * (kSuffix / kPage));
      }
      last1.assign(static_cast<size_t>(batch), kPage);
      const CascadeLevel levels[] = {{qo0, kv0, last0}, {qo1, kv1, last1}};
      const PrefillDeviceLimits limits = h100_prefill_limits();
      api_detail::PrefillHostPlan host;
      api_detail::CascadeHostPlan cascade;
      std::vector<double> v, p, m, s, all;
      for (int r = 0; r < runs; ++r) {
        const auto t0 = Clock::now();
        api_detail::validate_cascade(c, levels, std::nullopt, limits, kPeakBytesPerUs, cascade,
                                     host);
        const auto t1 = Clock::now();
        api_detail::plan_prefill(c, kSms, kCtas, kPeakBytesPerUs, host);
        const auto t2 = Clock::now();
        cascade_merge_map(cascade.batch, host.plan);
        const auto t3 = Clock::now();
        api_detail::stage_prefill(host, layout, c.max_batch, cascade.batch.qo_begin,
                                  cascade.kv_indptr, cascade.last_page_len, staging.get());
        const auto t4 = Clock::now();
        v.push_back(us(t0, t1));
        p.push_back(us(t1, t2));
        m.push_back(us(t2, t3));
        s.push_back(us(t3, t4));
        all.push_back(us(t0, t4));
      }
      std::printf(
          "b%d prefix %d: tile %d, %zu items (x%d heads), %zu merges (x%d); validate %.2f, plan "
          "%.2f, merge map %.2f, stage %.2f, whole %.2f us\n",
          batch, prefix, host.tiles.query_tile, host.plan.work_items.size(), host.plan.item_heads,
          host.plan.merge_items.size(), host.plan.merge_heads, median(v), median(p), median(m),
          median(s), median(all));
    }
  }
}
