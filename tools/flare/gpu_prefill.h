// GPU batch prefill for the flare tool: copies a host attention problem (any query lengths,
// paged or ragged KV) to a CUDA device and runs it through BatchPrefill, for `flare attention
// --device cuda` and the CUDA backend of `flare bench --mode prefill`.
#pragma once

#include <memory>
#include <string>

#include "flare/core/tensor.h"
#include "flare/reference/attention.h"

namespace flare::cli {

class GpuPrefill {
 public:
  // `problem`: contiguous CPU tensors, already validated. Copies q, K/V, the index arrays and
  // a custom mask to `device` and creates the BatchPrefill (the first plan() compiles, or
  // loads from the JIT cache, the kernel of its tiles). Throws kNoCudaDevice; kUnsupported
  // for what BatchPrefill does not run, naming the option: RoPE (--rope), fp8 KV (--kv-dtype
  // e4m3|e5m2), q and KV in other dtypes than one of
  // float16/bfloat16, head dims other than 64/128/256 or 192/128.
  GpuPrefill(const AttentionProblem& problem, int device);
  ~GpuPrefill();
  GpuPrefill(const GpuPrefill&) = delete;
  GpuPrefill& operator=(const GpuPrefill&) = delete;

  void plan();  // the host planner plus one copy, on this prefill's stream
  void run();   // enqueues one prefill call (asynchronous); nothing for zero query tokens
  // Milliseconds of `calls` back-to-back run() calls, timed with CUDA events.
  double time_calls_ms(int calls);

  HostTensor o() const;    // [total_q, H_qo, D_vo] in q's dtype
  HostTensor lse() const;  // float32 [total_q, H_qo]

  std::string device_label() const;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  int num_ctas() const;              // of the latest plan
  int64_t num_work_items() const;    // of the latest plan

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flare::cli
