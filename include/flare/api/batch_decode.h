// BatchDecode: GPU attention of one query token per request against a paged KV cache, with
// split-KV load balancing (plan on the host, run on the device) that is safe to capture in a
// CUDA graph (papers 001 §3.2-3.3, 002 appendices A, D, F; DESIGN decisions 3-7).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "flare/api/index_errors.h"
#include "flare/api/run_options.h"
#include "flare/core/dtype.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/plan/plan.h"
#include "flare/variant/attention_params.h"
#include "flare/variant/user_variant.h"

namespace flare {

// Everything fixed when a BatchDecode is created: the kernels are compiled for it, the grid
// and the workspace sections are sized from it.
struct BatchDecodeConfig {
  int device = 0;                 // CUDA device index
  int max_batch = 0;              // upper bound on the requests of one plan (>= 1)
  int num_qo_heads = 0;           // H_qo, a multiple of num_kv_heads
  int num_kv_heads = 0;           // H_kv
  int head_dim = 0;               // D (for q, k, v and o): 64, 128, 256, or 512 (CUDA cores)
  int page_size = 0;              // tokens per page, >= 1 (compiled into the kernel)
  DType q_dtype = DType::kBF16;   // q and o: kF16 | kBF16
  DType kv_dtype = DType::kBF16;  // k and v: kF16 | kBF16 | kE4M3 | kE5M2
  KVLayout layout = KVLayout::kNHD;

  // Supported here: sm_scale, logits_soft_cap, window_left, pos_encoding kNone | kAlibi
  // (alibi_slopes: optional float32 [H_qo] on the CPU, copied at creation) | kRopeLlama
  // (rope_theta, rope_scale, rope_llama31: q at kv_len - 1 and key j at j turn before q.k;
  // fp8 and NVFP4 K rotate after their conversion),
  // k_scale and v_scale (fp8 KV: the stored value times the scale is the real value),
  // use_softmax = false with sigmoid_bias (sigmoid attention: run() then takes no lse). mask
  // kNone or kCausal (a no-op for one query token). Others (custom masks, rope_offsets) throw
  // kUnsupported.
  AttentionParams params;

  // A user-defined variant compiled in place of the built-in (flare/variant/user_variant.h):
  // its source defines the logits, masks and scales; params keeps sm_scale and k/v scales, and
  // its built-in terms must be off. Its scalars come with each run() (RunOptions).
  std::optional<UserVariant> variant;

  // Capture run() into CUDA graphs: without it, run() on a capturing stream throws.
  bool use_cuda_graph = false;

  // The tensor-core compute loop (mma.sync, kernels/decode_mma.cuh) instead of the CUDA-core
  // one: q and KV of the same float16 / bfloat16 type, or fp8 KV (e4m3, e5m2) with either q,
  // computed in float16 (which holds every fp8 value, and bf16 q scaled by a power of two,
  // exactly). Mixed float16 / bfloat16 pairs throw kUnsupported. Same plan, pipeline and merge;
  // results differ from the CUDA-core loop's by rounding (probabilities rounded to KV's type,
  // float16 for fp8, before P.V). Faster at every measured shape on the H100 and H200, most at
  // large head groups (8 query heads per KV head: 709 us against 833 on an H100 at batch 64,
  // kv 8192; docs/perf.md decode v14) and with fp8 KV, where the CUDA-core loop is issue-bound
  // (H200, batch 64, kv 8192: 259.6 us against 381.9; decode v15), and with fused RoPE (1-8%
  // over plain decode here, 38-46% on the CUDA-core loop: docs/perf.md, fortieth session F).
  bool use_tensor_cores = false;

  // KV heads one work item covers on the tensor-core loop: 1 (an item is one KV head's rows,
  // 4 warps take its tokens), or 2, 4 or 8 dividing num_kv_heads with num_qo_heads /
  // num_kv_heads <= 8 ("whole-page" items: one warp per KV head, so each CTA copy reads every
  // head of a token; with kv_heads_per_item = num_kv_heads, NHD pages are read whole, the
  // longest contiguous spans a shuffled page table has). The stage of one tile (16 tokens a
  // head; 32 for fp8 up to D 128) must stay within 64 KiB: 8 heads up to D 128, 4 at D 256.
  // Splits, merges and outputs are unchanged; rows per work item become kv_heads_per_item x
  // the head group. H200, docs/perf.md decode v16: faster at D 64 (b64 kv16384: 0.975 of the
  // one-head time), slower at D 128 (b64 kv8192: 1.021), and much slower for a few long
  // requests, whose split tiles one CTA merges whole (b1 kv32768: 2.1x).
  int kv_heads_per_item = 1;

  // Scheduler knobs (plan/plan.h PlanOptions): fixed_split_size > 0 cuts every request's KV
  // at the same positions whatever the batch, and the merge then runs the same passes, so a
  // request's o and lse are bitwise identical alone or in any batch (batch invariance); such
  // plans may need more partial slots than the default bound (see scratch). disable_split_kv
  // gives one chunk per (request, KV head, row tile).
  int fixed_split_size = 0;
  bool disable_split_kv = false;
  int num_sms_to_use = 0;  // 0 = all SMs of the device

  // Persistent CTAs per SM; 0 = as many as fit (the kernel's occupancy).
  int ctas_per_sm = 0;
  // The grid holds `waves` x the resident CTAs (num_sms x ctas_per_sm), in [0, 16]; 0 = the
  // loop's default: 2 on tensor cores, 1 on CUDA cores (measured, docs/perf.md decode v14).
  // A batch whose (request, KV head, row tile) tiles number at least the resident CTAs is
  // planned over the whole grid (PlanOptions::waves: the hardware starts a later CTA on the
  // SM that ends one first); a smaller batch, or a plan with num_sms_to_use, over one wave.
  int waves = 0;

  // Scratch for the partial states of split tiles: a device buffer of the caller's on this
  // device (FlashInfer's float_workspace_buffer), used only during run() and never read
  // between runs, so several BatchDecode and BatchPrefill objects may share it as long as
  // their runs are ordered (one stream). Null: the object allocates its own. It must hold the
  // default bound (2 x num_ctas partial slots: scratch_bytes_needed() says how many bytes);
  // with fixed_split_size, plans of more split chunks fit up to what it holds.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;

  // Validation mode: run() copies the planned page ids to the host (one synchronizing copy
  // and a scan of kv_indptr[batch] ids) and throws kIndexOutOfRange naming the first id
  // outside the cache before launching anything. For debugging: it cannot be captured. The
  // environment variable FLARE_VALIDATE=1 turns it on for every object created after it is set.
  bool validate_indices = false;
};

// Batch decode on one CUDA device:
//   BatchDecode decode(config);                   // compiles (JIT, cached), allocates
//   decode.plan(kv_indptr, kv_last_page_len, s);  // host arrays; one async copy on s
//   decode.run(q, pages, o, lse, s);              // one kernel launch, nothing else
//   decode.check();                               // raises for out-of-range page ids seen
// plan() may be called again between runs (e.g. every decode step); a run() uses the plan of
// the latest plan() before it in stream order. With use_cuda_graph, run() may be captured once
// and the graph replayed after each plan(): every pointer run() launches with lives in the
// workspace, whose address never changes. The tensors given to the captured run() must then
// keep their addresses for every replay (refill them in place).
class BatchDecode {
 public:
  // Validates the config, compiles the kernel (or loads it from the JIT cache), sizes the
  // persistent grid from its occupancy and allocates the device workspace and the pinned
  // plan buffer. Throws kInvalidArgument (bad config), kUnsupported (a head dim, dtype or
  // variant option no kernel handles), kNoCudaDevice, kCompileError, kCudaError.
  explicit BatchDecode(const BatchDecodeConfig& config);
  ~BatchDecode();
  BatchDecode(BatchDecode&&) noexcept;
  BatchDecode& operator=(BatchDecode&&) noexcept;
  BatchDecode(const BatchDecode&) = delete;
  BatchDecode& operator=(const BatchDecode&) = delete;

  // Device workspace bytes a BatchDecode of this config allocates (same validation and
  // compilation as the constructor, which fixes the number of CTAs).
  static size_t workspace_bytes(const BatchDecodeConfig& config);

  // Schedules one decode step.
  //   kv_indptr          int32 [batch + 1], CPU: pages of request i are
  //                      kv_indices[kv_indptr[i] .. kv_indptr[i + 1])
  //   kv_last_page_len   int32 [batch], CPU: valid tokens of the last page, in [1, page_size]
  //                      for requests with pages (ignored for requests with none: kv_len 0)
  //   stream             the stream the following run() uses
  // 1 <= batch <= max_batch. Builds the plan on the host (no device synchronization), writes
  // it into a pinned buffer and issues one host-to-device copy on `stream`. If the previous
  // plan's copy out of that buffer has not executed yet, waits for it (so for the work queued
  // before that copy, typically the step before the last; never for later kernels).
  // A fixed_split_size plan with more split chunks than the workspace holds grows it (outside
  // CUDA-graph mode; up to what config.scratch holds).
  // Host time without the copy's driver call (`flare plan-latency`: 32 / 8 heads, D 128, page
  // 16, KV lengths uniform in [1, 2047], an H100's grid; one core of a 2-core AMD EPYC VM):
  // batch 1 ~6 us, batch 64 ~34 us, batch 256 ~33 us. Batch 64 on the CUDA-core loop schedules
  // both the L_kv cut and the even-chunk alternative (fill splits, 528 CTAs for 512 tiles;
  // ~10 us on the tensor-core loop's two waves). O(batch + work items x log CTAs + CTAs).
  // Throws kInvalidArgument (malformed arrays, batch out of range, more pages than the
  // kv_indices a captured run reads), kWorkspaceTooSmall.
  void plan(std::span<const int32_t> kv_indptr, std::span<const int32_t> kv_last_page_len,
            cuda::Stream stream);
  // The same with CPU int32 1-D tensors.
  void plan(const TensorView& kv_indptr, const TensorView& kv_last_page_len, cuda::Stream stream);

  // Attention of the planned batch; all tensors on this decode's CUDA device.
  //   q      [batch, H_qo, D] q_dtype; any strides with a unit innermost stride, 16-byte
  //          aligned rows (data pointer and outer strides multiples of 16 bytes)
  //   kv     pages in config.layout: k, v [pages, page_size, H_kv, D] (NHD) or
  //          [pages, H_kv, page_size, D] (HND) of kv_dtype, same alignment rule as q (e.g.
  //          K and V sliced out of one [pages, 2, ...] tensor); indices int32 [>= the plan's
  //          kv_indptr[batch]] on the device. The kernel takes page ranges and lengths from the
  //          plan and reads only the ids, each checked against the pages of k and v: an id out
  //          of range is replaced by the cache's last page for the read (a cache of at least one
  //          page is required) and recorded for check(); nothing outside the given tensors is ever
  //          read or written (the request's output is then not meaningful).
  //   o      [batch, H_qo, D] q_dtype, same alignment rule
  //   lse    optional float32 [batch, H_qo] (any strides): log of the sum of exp of the scaled
  //          logits, natural or base 2 (options.lse_base); -inf for requests with kv_len 0
  //          (whose o is 0)
  //   options  q_scale and k_scale multiply the logits, v_scale the output (FlashInfer's
  //          run() arguments; with the config's params.k_scale / v_scale), the LSE's base, PDL.
  //          A captured run keeps the values given.
  // Never allocates, never synchronizes (but in validation mode). Host cost: O(1) checks and
  // one launch (~3-5 us on an H100 host). Throws kInvalidArgument (shapes, dtypes, devices,
  // alignment, batch differing from the plan's, fewer page ids than the plan reads, run()
  // before plan(), a capturing stream without use_cuda_graph, non-finite scales), kUnsupported
  // (a K/V page stride or last-slot offset of 2^31 bytes or more) or, in validation mode,
  // kIndexOutOfRange, before launching anything; kCudaError from a launch.
  void run(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
           const std::optional<TensorView>& lse, cuda::Stream stream,
           const RunOptions& options = {});
  // The same with the whole PagedKV view (its indptr and last_block_len are plan()'s business
  // and not read here).
  void run(const TensorView& q, const PagedKV& kv, const TensorView& o,
           const std::optional<TensorView>& lse, cuda::Stream stream,
           const RunOptions& options = {}) {
    run(q, PagedKVPages::of(kv), o, lse, stream, options);
  }

  // Synchronizes the device, then throws kIndexOutOfRange describing the first out-of-range
  // page id (request, kv_indices entry, value) the kernels met since the last check(), if any,
  // and clears the record (names: the caller's argument names for the message).
  void check(const IndexNames& names = {"BatchDecode", "kv_indices"}) const;

  const BatchDecodeConfig& config() const;
  // CTAs of the grid (fixed at creation): resident CTAs x waves. Outside CUDA-graph mode run()
  // launches the latest plan's CTAs only: one wave for batches with fewer tiles than resident
  // CTAs, and half of a four-per-SM wave for at most one (request, KV head, row tile) per SM.
  int num_ctas() const;
  // Packed query rows one work item holds: the head-group tile, times kv_heads_per_item.
  int rows_per_item() const;
  const Plan& last_plan() const;      // the latest plan (host copy), for tests and tools
  size_t workspace_size() const;      // device bytes held (without a caller's scratch)
  int64_t max_partial_slots() const;  // of the current workspace
  // Scratch bytes the default bound (2 x num_ctas partial slots) needs for `config`, the
  // least config.scratch_bytes may be (same validation and compilation as the constructor).
  static size_t scratch_bytes_needed(const BatchDecodeConfig& config);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The kernel a config needs, as a JIT spec (split tiles are merged inside it): what the
// constructor compiles and what the CI test compiles for every shipped configuration without a
// GPU.
struct BatchDecodeKernels {
  jit::KernelSpec decode;  // entry "flare_decode"
  int rows_per_item = 0;   // packed rows per work item the kernel was built for (all its heads)
  int threads = 0;         // block size of the decode kernel
  size_t decode_shared_bytes = 0;  // dynamic shared memory of one decode CTA
};
// The shared memory one decode CTA may use on the target GPU is its opt-in limit per block
// (BatchDecode passes its device's). Only the tensor-core loop at head dim 256, one CTA per SM,
// sizes its pipeline by it: 3 stages of 64 KiB where they fit (H100, H200: 227 KiB), else 2.
// The default is the sm_80 family's limit (A100: 163 KiB).
inline constexpr size_t kSm80SharedBytesPerBlock = 163 * 1024;
inline constexpr size_t kSm90SharedBytesPerBlock = 227 * 1024;
// Throws kInvalidArgument / kUnsupported like the constructor (no GPU needed).
BatchDecodeKernels batch_decode_kernels(
    const BatchDecodeConfig& config, size_t max_shared_bytes_per_block = kSm80SharedBytesPerBlock);

// The configurations flare ships tuned kernels for (every head dim, row tile, dtype pair and
// variant flag the decode kernel is built with); CI compiles each for sm_80 and sm_90a and
// requires zero spills and zero local memory.
std::vector<BatchDecodeConfig> shipped_decode_configs();

}  // namespace flare
