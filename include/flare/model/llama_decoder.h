// flare::model::LlamaDecoder (issue 22): a Llama decode step as one persistent kernel launch
// (kernels/llama_decode.cuh, FlashFormer's design: paper 004), over weights used in place and
// flare's paged KV cache.
//
// Weights are the caller's tensors, Hugging Face's names and layouts (nn.Linear: [out, in]),
// bf16, contiguous, 16-byte aligned, on one CUDA device of compute capability 9.0 (the weight
// pipeline uses bulk async copies). With config.weight_format kInt4, the layers' seven
// projections are 4-bit instead (flare/model/int4_weights.h: uint8 codes [out, in / 2] and bf16
// scales [out, in / 128]); the embedding, the norms and the LM head stay bf16. The KV cache is one
// K and one V tensor per layer, [num_pages, page_size, kv_heads, head_dim] bf16 (NHD), shared page
// table across layers.
//
// The decoder keeps views of the weights and caches: the caller keeps them alive. One decoder
// is used from one thread at a time (step() compiles a batch capacity's kernel on first use).
//
// step() writes the input tokens' K and V into the cache at their positions, and produces the
// logits (float32) and the next token of each request (greedy, or sampled: sampling.h). It launches
// one memset (the step's device counters) and one kernel on the caller's stream: no allocation, no
// host synchronization, nothing read back; a step can be captured in a CUDA graph and replayed with
// new tokens, positions and page tables in the same buffers.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "flare/core/tensor.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/model/llama_config.h"
#include "flare/model/sampling.h"

namespace flare::model {

struct LlamaLayerTensors {
  // bf16 [out, in]; 4-bit: uint8 codes [out, in / 2]
  TensorView q_proj, k_proj, v_proj, o_proj;  // [heads*d | kv*d | kv*d, hidden], [hidden, heads*d]
  TensorView gate_proj, up_proj, down_proj;   // [inter, hidden] x2, [hidden, inter]
  // 4-bit only: bf16 scales [out, in / 128] of the projection of the same name
  TensorView q_scales, k_scales, v_scales, o_scales, gate_scales, up_scales, down_scales;
  TensorView input_layernorm, post_attention_layernorm;  // [hidden]
};

// A layer's seven projections in the kernel's order (q, k, v, o, gate, up, down): Hugging Face's
// name, the weight's [rows, cols] (4-bit codes are [rows, cols / 2]) and the tensors to fill.
struct ProjectionSlot {
  const char* name;  // "self_attn.q_proj", ...
  int64_t rows, cols;
  TensorView* weight;
  TensorView* scales;  // 4-bit only
};
std::array<ProjectionSlot, 7> projection_slots(const LlamaConfig& config, LlamaLayerTensors& layer);

struct LlamaWeights {
  TensorView embed_tokens;  // [vocab, hidden]
  std::vector<LlamaLayerTensors> layers;
  TensorView norm;     // [hidden]
  TensorView lm_head;  // [vocab, hidden]; the embedding when the config ties them
};

struct LlamaKvCache {
  std::vector<TensorView> k, v;  // per layer: [num_pages, page_size, kv_heads, head_dim] bf16
};

// Device-side errors of a step (index data is on the device: checked there, reported here).
enum class DecodeError : int {
  kNone = 0,
  kTokenOutOfRange = 1,  // a token id outside [0, vocab): its embedding read as zeros
  kPageOutOfRange = 2,   // a position its page table does not cover, or a page id outside
                         // [0, num_pages): that K/V write and those reads were skipped
  kTimeout = 3,          // a CTA waited 10 s for another (the step trapped)
};

// The kernel of a model and schedule (pipeline depth, activation area), as a JIT spec; the
// specs CI compiles (on an H100's shared memory: the 8B at batch 1, 2, 4 and 8, the 1B and 3B at
// batch 1, the 8B with 4-bit weights at batch 1 and 4, the 70B with 4-bit weights at batch 1).
// multi_step: the generate() kernel (a loop over the launch's steps), else step()'s.
jit::KernelSpec llama_decode_kernel_spec(const LlamaConfig& config, const DecodeSchedule& schedule,
                                         bool multi_step = false);
std::vector<jit::KernelSpec> shipped_llama_decode_kernel_specs();

class LlamaDecoder {
 public:
  // Checks every tensor (names the one that is wrong), compiles the kernel for the device
  // (NVRTC, disk-cached) and allocates the step's scratch. Throws kInvalidArgument,
  // kUnsupported (a device below sm_90, too little shared memory), kNoCudaDevice.
  LlamaDecoder(LlamaConfig config, LlamaWeights weights, LlamaKvCache cache);
  ~LlamaDecoder();
  LlamaDecoder(const LlamaDecoder&) = delete;
  LlamaDecoder& operator=(const LlamaDecoder&) = delete;

  // One step for batch = tokens.shape[0] requests (1..8), all int32 on the decoder's device:
  //   tokens [batch], positions [batch] (the position of the input token: the number of tokens
  //   already in that request's cache), kv_indptr [batch + 1], kv_indices [nnz] (request b's
  //   pages kv_indices[kv_indptr[b] .. kv_indptr[b + 1]) hold its positions[b] + 1 tokens);
  //   next_tokens int32 [batch] (the argmax of the request's logits, the lowest id on ties, or
  //   with sampling.temperature > 0 a sample (flare/model/sampling.h: the kernel draws it in the
  //   same launch); -1 when every logit is NaN) and logits float32 [batch, vocab] (contiguous)
  //   are written. Sampling costs one grid-wide wait (temperature alone) or two a rejection
  //   round (top-k / top-p; rounds end when a draw falls in the set, usually the first).
  void step(const TensorView& tokens, const TensorView& positions, const TensorView& kv_indptr,
            const TensorView& kv_indices, const TensorView& next_tokens, const TensorView& logits,
            cuda::Stream stream, const SamplingParams& sampling = {});

  // num_steps decode steps in one launch, without the host between them (the GPU-side loop):
  // step i feeds step i - 1's next tokens at positions[b] + i (step 0: tokens at positions), so
  // each request's pages must cover positions[b] + num_steps tokens. step_tokens int32
  // [num_steps, batch] receives every step's next tokens (greedy or sampled as in step(); the
  // draws of step i use position positions[b] + i, so the tokens equal num_steps step() calls'),
  // logits the last step's. The weight stream runs on across the steps' boundaries. Throws
  // kInvalidArgument as step() does, and for num_steps < 1.
  void generate(const TensorView& tokens, const TensorView& positions, const TensorView& kv_indptr,
                const TensorView& kv_indices, int num_steps, const TensorView& step_tokens,
                const TensorView& logits, cuda::Stream stream, const SamplingParams& sampling = {});

  // Compiles (NVRTC, disk-cached) and loads the kernel of this batch size now, so that its first
  // step does not (the constructor does it for batch 1). Throws kInvalidArgument outside 1..8.
  void prepare(int batch);

  // Synchronizes the device, returns the first error any step since the last call recorded,
  // and clears it.
  DecodeError take_error();

  // Profiling: later steps record each CTA's stage boundaries (globaltimer ns) into `trace`,
  // int64 [num_ctas, trace_events] on the decoder's device (kernels/llama_decode_params.cuh);
  // an empty view turns it off.
  void set_trace(const TensorView& trace);
  int trace_events() const;
  int num_ctas() const { return num_ctas_; }

  const LlamaConfig& config() const { return config_; }
  // The schedule of a batch (the attention splits and the activation area depend on it). The
  // first step of each batch capacity (1, 2, 4, 8) compiles its kernel (NVRTC, disk-cached).
  DecodeSchedule schedule(int batch) const;
  int device() const { return device_; }

 private:
  struct Scratch;
  LlamaConfig config_;
  LlamaWeights weights_;
  int device_ = 0;
  int num_ctas_ = 0;
  int max_shared_ = 0;
  int num_pages_ = 0;
  int page_size_ = 0;
  struct Variant {
    DecodeSchedule schedule;
    cuda::Function kernel = nullptr;
    cuda::Function multi_step_kernel = nullptr;  // made on the batch's first generate()
  };
  // The schedule and kernel of each batch size, made on its first step (batches of one
  // capacity share the loaded kernel through jit::get_kernel's table): step() builds no
  // schedule.
  Variant& variant(int batch);
  // step() (generate false: next_tokens [batch]) and generate() (next_tokens [num_steps, batch]).
  void launch(bool generate, const TensorView& tokens, const TensorView& positions,
              const TensorView& kv_indptr, const TensorView& kv_indices, int num_steps,
              const TensorView& next_tokens, const TensorView& logits, cuda::Stream stream,
              const SamplingParams& sampling);
  std::array<std::optional<Variant>, kMaxDecodeBatch + 1> by_batch_;
  long long* trace_ = nullptr;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace flare::model
