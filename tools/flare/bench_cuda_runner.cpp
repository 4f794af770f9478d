// The CUDA backend of `flare bench`: BatchDecode (decode) or BatchPrefill (prefill) on the
// workload copied to the device, timed with CUDA events.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "tools/flare/bench_runner.h"
#include "tools/flare/gpu_decode.h"
#include "tools/flare/gpu_prefill.h"

namespace flare::cli {
namespace {

constexpr int kPlanTimingRepeats = 21;  // plan() takes microseconds: take a median
// One timed sample covers back-to-back calls spanning at least this long, so launch and
// event overheads do not dominate kernels of a few microseconds.
constexpr double kSampleMs = 1.0;
constexpr int kMaxCallsPerSample = 1000;

// Plans (timed), then sizes a sample from a few calls. `Gpu` is GpuDecode or GpuPrefill.
template <class Gpu>
BenchRunner timed_runner(std::shared_ptr<Gpu> gpu) {
  std::vector<double> plan_times;
  for (int i = 0; i < kPlanTimingRepeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    gpu->plan();
    plan_times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(plan_times.begin(), plan_times.begin() + kPlanTimingRepeats / 2,
                   plan_times.end());

  gpu->time_calls_ms(1);  // first launch: module load, caches
  const double call_ms = std::max(gpu->time_calls_ms(3) / 3, 1e-6);
  const int calls_per_sample =
      std::clamp(static_cast<int>(std::ceil(kSampleMs / call_ms)), 1, kMaxCallsPerSample);

  BenchRunner runner;
  runner.device = gpu->device_label();
  runner.plan_seconds = plan_times[kPlanTimingRepeats / 2];
  runner.num_ctas = gpu->num_ctas();
  runner.num_work_items = gpu->num_work_items();
  runner.run = [gpu, calls_per_sample] {
    return gpu->time_calls_ms(calls_per_sample) * 1e-3 / calls_per_sample;
  };
  runner.output = [gpu] { return gpu->o(); };
  return runner;
}

}  // namespace

BenchRunner make_cuda_runner(const Workload& work, int device) {
  if (work.spec.mode == BenchMode::kDecode) {
    return timed_runner(std::make_shared<GpuDecode>(work.problem(), device));
  }
  return timed_runner(std::make_shared<GpuPrefill>(work.problem(), device));
}

}  // namespace flare::cli
