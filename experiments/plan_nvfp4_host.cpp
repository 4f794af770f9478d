// Host time of BatchPrefill::plan()'s parts (validation, the planner, staging) without a GPU, on
// the NVFP4 bench's q1 shape (b64 q1 kv2048, 32 / 8 heads, D 128, page 16; issue 17's 40 us for
// prefill plan() at batch 64) and the 16-bit one for comparison: the mma.sync family's 16-row
// tiles on 132 SMs x `ctas` CTAs (3 for NVFP4 on an H200, as BatchPrefill queries).
// Build here: g++ -O2 -std=c++20 -Iinclude -Isrc -I. experiments/plan_nvfp4_host.cpp -Lbuild
//   -lflare -Wl,-rpath,build -o /tmp/plan_nvfp4_host && /tmp/plan_nvfp4_host [runs]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "experiments/host_timing.h"
#include "src/api/prefill_plan.h"

using namespace flare;
using host_timing::Clock;
using host_timing::median;
using host_timing::us;

int main(int argc, char** argv) {
  const int runs = argc > 1 ? std::atoi(argv[1]) : 3000;
  constexpr int kBatch = 64, kKvLen = 2048, kPage = 16, kSms = 132;
  std::vector<int32_t> qo{0}, kv{0}, last;
  for (int b = 0; b < kBatch; ++b) {
    qo.push_back(qo.back() + 1);
    kv.push_back(kv.back() + kKvLen / kPage);
    last.push_back(kPage);
  }
  for (const bool nvfp4 : {false, true}) {
    BatchPrefillConfig c;
    c.max_batch = kBatch;
    c.max_total_qo = qo.back();
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim_qk = c.head_dim_vo = 128;
    c.page_size = kPage;
    if (nvfp4) {
      c.kv_dtype = DType::kU8;
      c.max_total_kv = kv.back();
    }
    PrefillDeviceLimits limits = h100_prefill_limits();
    limits.nvfp4_raw_stages = nvfp4;
    const int ctas = nvfp4 ? 3 : 2;
    const WorkspaceLayout layout =
        workspace_layout(api_detail::prefill_bounds(c, kSms * ctas, 128));
    const std::unique_ptr<std::byte[]> staging(new std::byte[layout.plan_bytes]);
    api_detail::PrefillHostPlan host;
    std::vector<double> v, p, s, all;
    for (int r = 0; r < runs; ++r) {
      const auto t0 = Clock::now();
      api_detail::validate_prefill_batch(c, std::nullopt, limits, qo, kv, last, {}, host);
      const auto t1 = Clock::now();
      api_detail::plan_prefill(c, kSms, ctas, 4.81e6, host);
      const auto t2 = Clock::now();
      api_detail::stage_prefill(host, layout, c.max_batch, qo, kv, last, staging.get());
      const auto t3 = Clock::now();
      v.push_back(us(t0, t1));
      p.push_back(us(t1, t2));
      s.push_back(us(t2, t3));
      all.push_back(us(t0, t3));
    }
    std::printf(
        "%s b64 q1 kv2048: tile %d, %zu items, %zu merges; validate %.2f, plan "
        "%.2f, stage %.2f, whole %.2f us (median of %d)\n",
        nvfp4 ? "NVFP4" : "16-bit", host.tiles.query_tile, host.plan.work_items.size(),
        host.plan.merge_items.size(), median(v), median(p), median(s), median(all), runs);
  }
}
