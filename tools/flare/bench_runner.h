// The backends `flare bench` times: each plans the workload once and then runs one attention
// call per invocation of `run`, so the same timing loop serves the CPU and the GPU.
#pragma once

#include <functional>
#include <string>

#include "flare/core/tensor.h"
#include "tools/flare/workload.h"

namespace flare::cli {

struct BenchRunner {
  std::string device;           // what ran it, e.g. "cpu (2 threads)" or "cuda:0 (NVIDIA H100)"
  double plan_seconds = 0;      // one plan() call (median of several)
  int num_ctas = 0;             // of the plan
  int64_t num_work_items = 0;   // of the plan
  std::function<double()> run;  // one complete call; returns its duration in seconds
  std::function<HostTensor()> output;  // o of the last call, on the host ([total_q, H_qo, D])
};

// The CPU backend: plan() for a DeviceSpec with one "SM" per hardware thread, then
// execute_plan_cpu on `num_threads` threads (0: all). `work` must outlive the runner.
BenchRunner make_cpu_runner(const Workload& work, int num_threads);

// The CUDA backend on `device`: BatchDecode for decode, BatchPrefill for prefill, each timed
// sample averaging back-to-back calls over >= 1 ms (CUDA events). Throws kNoCudaDevice
// without a usable device, kUnsupported for what the kernels do not run (e.g. fp8 or float32
// KV in prefill).
BenchRunner make_cuda_runner(const Workload& work, int device);

}  // namespace flare::cli
