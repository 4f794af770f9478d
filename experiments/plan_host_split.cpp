// Host time of BatchPrefill::plan() against the planner alone (flare::plan) on the same problems
// (the paged NVFP4 bench's shapes, 16-bit K/V): what plan() adds to the schedule (validation,
// staging, the plan region's copy). GPU machine, after building libflare into build-ab:
//   g++ -O2 -std=c++20 -Iinclude -I. experiments/plan_host_split.cpp -Lbuild-ab -lflare \
//     -Wl,-rpath,$PWD/build-ab -o build-ab/plan_host_split && build-ab/plan_host_split
#include <chrono>
#include <cstdio>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "flare/plan/plan.h"
using namespace flare;
template <class F>
double us_of(F f, int n) {
  f();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
         n;
}
int main() {
  cuda::set_device(0);
  cuda::OwnedStream stream;
  for (auto [b, q, kv, causal] :
       std::vector<std::tuple<int, int, int, bool>>{{1, 4096, 4096, true},
                                                    {4, 1024, 1024, true},
                                                    {64, 1, 2048, false},
                                                    {16, 16, 4096, false}}) {
    BatchPrefillConfig c;
    c.max_batch = b;
    c.max_total_qo = b * q;
    c.num_qo_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim_qk = c.head_dim_vo = 128;
    c.dtype = DType::kF16;
    c.kv = PrefillKV::kPaged;
    c.page_size = 16;
    c.params.mask = causal ? MaskMode::kCausal : MaskMode::kNone;
    BatchPrefill prefill(c);
    std::vector<int32_t> qo(b + 1), pages(b + 1), last(b, (kv - 1) % 16 + 1);
    for (int i = 0; i <= b; ++i) {
      qo[i] = i * q;
      pages[i] = i * ((kv + 15) / 16);
    }
    const double full = us_of([&] { prefill.plan(qo, pages, last, stream.get()); }, 300);
    const Plan& p = prefill.last_plan();
    std::vector<int32_t> ql(b, q), kl(b, kv);
    PlanProblem pr;
    pr.qo_len = ql;
    pr.kv_len = kl;
    pr.num_qo_heads = 32;
    pr.num_kv_heads = 8;
    pr.head_dim_qk = pr.head_dim_vo = 128;
    pr.page_size = 16;
    pr.causal = causal;
    PlanOptions o;
    o.query_tile = p.query_tile;
    o.one_queue = true;
    o.kv_tile = prefill.last_tiles().kv_tile;
    Plan mine;
    const double planner = us_of([&] { plan(pr, {p.num_ctas, 1}, o, mine); }, 300);
    std::printf(
        "b%d q%d kv%d: BatchPrefill::plan %.1f us, planner alone %.1f us (items %zu / %zu, ctas "
        "%d)\n",
        b, q, kv, full, planner, p.work_items.size(), mine.work_items.size(), p.num_ctas);
  }
}
