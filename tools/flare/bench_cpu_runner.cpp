// The CPU backend of `flare bench`: the planner's work queues executed by the reference
// backend's plan executor, exactly the path the library takes without a GPU.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "flare/plan/plan.h"
#include "flare/reference/execute_plan.h"
#include "tools/flare/bench_runner.h"

namespace flare::cli {
namespace {

constexpr int kPlanTimingRepeats = 21;  // plan() takes microseconds: take a median

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

BenchRunner make_cpu_runner(const Workload& work, int num_threads) {
  const int threads = num_threads > 0
                          ? num_threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const WorkloadSpec& spec = work.spec;

  PlanProblem plan_problem;
  plan_problem.qo_len = work.qo_lens;
  plan_problem.kv_len = work.kv_lens;
  plan_problem.num_qo_heads = static_cast<int>(spec.heads_qo);
  plan_problem.num_kv_heads = static_cast<int>(spec.heads_kv);
  plan_problem.head_dim_qk = static_cast<int>(spec.head_dim);
  plan_problem.head_dim_vo = static_cast<int>(spec.head_dim);
  plan_problem.page_size = spec.kv == BenchKV::kRagged ? 1 : static_cast<int>(spec.page_size);
  plan_problem.causal = work.params.mask == MaskMode::kCausal;
  plan_problem.window_left = work.params.window_left;
  // One CTA per hardware thread: the executor runs each CTA's queue on one thread.
  const DeviceSpec device{threads, 1};

  std::vector<double> plan_times;
  auto the_plan = std::make_shared<Plan>();
  for (int i = 0; i < kPlanTimingRepeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    *the_plan = plan(plan_problem, device);
    plan_times.push_back(seconds_since(start));
  }
  std::nth_element(plan_times.begin(), plan_times.begin() + kPlanTimingRepeats / 2,
                   plan_times.end());

  BenchRunner runner;
  runner.device = "cpu (" + std::to_string(threads) + " threads)";
  runner.plan_seconds = plan_times[kPlanTimingRepeats / 2];
  runner.num_ctas = the_plan->num_ctas;
  runner.num_work_items = static_cast<int64_t>(the_plan->work_items.size());

  // NaN-poisoned, so rows the executor never writes show up in the error check.
  auto o = std::make_shared<HostTensor>(
      spec.dtype, std::vector<int64_t>{work.total_q(), spec.heads_qo, spec.head_dim});
  o->fill(std::numeric_limits<float>::quiet_NaN());
  runner.run = [problem = work.problem(), the_plan, o, threads] {
    const auto start = std::chrono::steady_clock::now();
    execute_plan_cpu(*the_plan, problem, AttentionOutput{o->view(), std::nullopt},
                     ReferenceOptions{Accumulation::kF32, threads});
    return seconds_since(start);
  };
  runner.output = [o] {
    HostTensor copy(o->dtype(), o->shape());
    std::memcpy(copy.data<void>(), o->data<void>(),
                static_cast<size_t>(o->numel()) * dtype_bytes(o->dtype()));
    return copy;
  };
  return runner;
}

}  // namespace flare::cli
