// GPU batch decode for the flare tool: copies a host decode problem (one query token per
// request, paged KV) to a CUDA device and runs it through BatchDecode, for `flare attention
// --device cuda` and the CUDA backend of `flare bench`.
#pragma once

#include <memory>
#include <string>

#include "flare/core/tensor.h"
#include "flare/reference/attention.h"

namespace flare::cli {

class GpuDecode {
 public:
  // `problem`: contiguous CPU tensors, already validated; qo_indptr must be 0, 1, ..., batch
  // and the KV paged (kInvalidArgument otherwise: other batches go to GpuPrefill). Copies q,
  // the pages and the page table to `device`, compiles (or loads from the JIT cache) the
  // kernels. Throws kNoCudaDevice, kUnsupported (what BatchDecode does not run: head dims
  // other than 64/128/256, float32 q or KV, RoPE, custom masks).
  GpuDecode(const AttentionProblem& problem, int device);
  ~GpuDecode();
  GpuDecode(const GpuDecode&) = delete;
  GpuDecode& operator=(const GpuDecode&) = delete;

  void plan();  // the host planner plus one copy, on this decode's stream
  void run();   // enqueues one decode call (asynchronous)
  // Milliseconds of `calls` back-to-back run() calls, timed with CUDA events.
  double time_calls_ms(int calls);
  void synchronize();

  HostTensor o() const;    // [batch, H_qo, D] in q's dtype
  HostTensor lse() const;  // float32 [batch, H_qo]

  std::string device_label() const;  // "cuda:0 (NVIDIA H100 80GB HBM3)"
  int num_ctas() const;
  int64_t num_work_items() const;  // of the latest plan

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace flare::cli
