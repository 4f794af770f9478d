// BatchPrefill: GPU attention of ragged query tokens (prefill, chunked prefill, append) against
// a paged or ragged KV cache on tensor cores, with split-KV load balancing, CUDA-graph safe
// (papers 001 §3.2-3.3, 002 appendices A, B, D; DESIGN decisions 3-7).
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
#include "flare/format/ragged.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "flare/plan/plan.h"
#include "flare/variant/attention_params.h"
#include "flare/variant/user_variant.h"

namespace flare {

enum class PrefillKV : uint8_t {
  kPaged,   // PagedKV (page table gather, any page size)
  kRagged,  // RaggedKV (contiguous rows per request)
};

// Which kernel family runs the prefill (FlashInfer's `backend`).
enum class PrefillBackend : uint8_t {
  kAuto,  // the Hopper family on sm_90 at query tiles of 64 and 128 rows (ragged or paged K/V,
          // but paged K/V with RoPE stays on FA2), else FA2
  kFA2,   // mma.sync on every GPU (paper 001 §3.2)
  kFA3,   // the Hopper family (warpgroup MMAs, sm_90 only; query tiles of at least 64 rows)
};

// Where RoPE (params.pos_encoding kRopeLlama) rotates q and k for a prefill
// (BatchPrefillConfig::rope_staging).
enum class RopeStaging : uint8_t {
  // kStaged for plans whose query tiles read each K row at least kStageRopeMinKeyReads times
  // on average (fused_rope_key_reads) where staging applies (ragged 16-bit K/V, no user variant,
  // one level; under use_cuda_graph with max_total_kv, the choice then the config's: a batch of
  // max_batch prefills of max_total_qo / max_batch tokens on the fixed tiles), else kFused.
  kAuto,
  kFused,   // the prefill kernels rotate each K tile they read and their Q tiles
  kStaged,  // run() rotates q and k into copies first; the kernels read those without RoPE
};

// Everything fixed when a BatchPrefill is created.
struct BatchPrefillConfig {
  int device = 0;        // CUDA device index
  int max_batch = 0;     // upper bound on the requests of one plan (>= 1)
  int max_total_qo = 0;  // upper bound on the query tokens of one plan (>= 1)
  int num_qo_heads = 0;  // H_qo, a multiple of num_kv_heads
  int num_kv_heads = 0;  // H_kv
  int head_dim_qk = 0;   // 64, 128, 256 or 512 (== head_dim_vo; 512 on the FA2 family, two
                         // passes over halves of o), or 192 with head_dim_vo 128
  int head_dim_vo = 0;
  PrefillKV kv = PrefillKV::kPaged;
  int page_size = 16;                // kPaged: tokens per page, >= 1 (compiled into the kernel)
  KVLayout layout = KVLayout::kNHD;  // kPaged
  DType dtype = DType::kBF16;        // q, k, v and o: kF16 | kBF16
  // k and v when they differ from dtype: kU8 = NVFP4 (E2M1 codes, D / 2 bytes a row, with e4m3
  // block scales of D / 16 bytes a row: flare/format/nvfp4.h), code x block scale exact in
  // dtype, the global scales run()'s k_scale / v_scale. The FA2 family's NVFP4 kernels read the
  // codes and scales and convert them in shared memory; under kAuto on sm_90 they take the query
  // tiles below 64 rows (short queries over long KV: 4.5 bits read a value, not 16), and the
  // Hopper family's producer warpgroup converts at 64-row tiles (head_dim_vo <= 128, without
  // RoPE). The Hopper family's 128-row tiles, RoPE on it, and head dim 512 read a staged 16-bit
  // copy run() first dequantizes the plan's pages (or rows) into: max_total_kv pages (kPaged) or
  // rows (kRagged) allocated at creation, max_total_kv x (page_size) x H_kv x (D_qk + D_vo) x 2
  // bytes of device memory, and a pass over the batch's KV per run().
  std::optional<DType> kv_dtype;
  // NVFP4, and staged RoPE under use_cuda_graph: upper bound on kv_indptr[batch] of every plan
  // (>= 1)
  int64_t max_total_kv = 0;
  // kRopeLlama: where q and k turn. A staged plan's run() first rotates q and the plan's k
  // rows into copies (apply_rope's kernel, flare/api/rope.h, two launches: run() host time ~10
  // us more) and the prefill kernels read those without RoPE, so each K row turns once a run,
  // not once for each query tile that reads it (the Hopper family then also copies Q and K in
  // bulk): 1.8x the fused rotation on causal b16 seq 4096-16384, 1.2x at 1024, 0.8x on an
  // append of 128 tokens over 32768 (H200, docs/perf.md forty-second session). The copies,
  // total_qo x H_qo x D_qk and kv_indptr[batch] x H_kv x D_qk elements of dtype, are allocated
  // by the first plan() that stages and grown by a later one that needs more (plan() then
  // waits for the device before freeing the smaller ones); under use_cuda_graph, max_total_qo
  // and max_total_kv rows at creation (the captured rotation reads each plan's counts on the
  // device). kStaged needs ragged 16-bit K/V, no user variant, max_levels 1 and, under
  // use_cuda_graph, max_total_kv >= 1 (kInvalidArgument at creation otherwise); q and k need
  // 16-byte aligned rows and strides.
  RopeStaging rope_staging = RopeStaging::kAuto;

  // Supported: sm_scale, mask kNone | kCausal | kCustom (the bits are given to run(), on the
  // device), window_left, logits_soft_cap, pos_encoding kNone | kAlibi (alibi_slopes optional,
  // float32 [H_qo] on the CPU, copied at creation) | kRopeLlama (rope_theta, rope_scale,
  // rope_llama31: query token i of a request at kv_len - q_len + i and key j at j turn before
  // q.k), use_softmax = false with sigmoid_bias (sigmoid attention: run() then takes no lse).
  // rope_offsets and fp8 scales throw kUnsupported.
  AttentionParams params;

  // A user-defined variant compiled in place of the built-in (flare/variant/user_variant.h):
  // its source defines the logits, masks and scales; params keeps sm_scale and the mask
  // (causal, custom), and its other terms must be off. Its scalars come with each run().
  std::optional<UserVariant> variant;

  // Capture run() into CUDA graphs: the tiles are then fixed at creation (query_tile, or the
  // heuristic on max_total_qo / max_batch), and run() launches fixed grids.
  bool use_cuda_graph = false;
  int query_tile = 0;  // 16 | 32 | 64 | 128; 0 = choose_prefill_tiles per plan
  int kv_tile = 0;     // 32 | 64 | 128; 0 = choose_prefill_tiles
  // kFA3 on a GPU other than sm_90 throws kUnsupported at creation, as does a query_tile below
  // 64 with it.
  PrefillBackend backend = PrefillBackend::kAuto;

  // Scheduler knobs (plan/plan.h PlanOptions). fixed_split_size > 0 cuts every request's KV at
  // the same positions whatever the batch and fixes the tiles (query_tile, or the largest the
  // heuristic allows), so a request's o and lse are bitwise identical alone or in any batch
  // (batch invariance; short queries then compute on padded 128-row tiles).
  int fixed_split_size = 0;
  bool disable_split_kv = false;
  int num_sms_to_use = 0;  // 0 = all SMs

  // The partial states' scratch and validation mode, as BatchDecodeConfig's; a scratch below
  // scratch_bytes_needed() makes plans spread over fewer SMs, as many as it holds the partial
  // states of (at least one SM's, else the constructor throws naming the bytes needed).
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  bool validate_indices = false;

  // Cascades (plan_cascade): the most levels a plan may have. Above 1 the workspace holds the
  // cascade's merge map: merge pieces and entries for max_levels levels of up to max_batch
  // groups in all (the virtual requests) over max_total_qo tokens, and, under use_cuda_graph,
  // a partial slot for every (tile, KV head) such a plan can have. Under use_cuda_graph
  // without query_tile the first plan (plan_cascade prices the tiles for its levels) fixes the
  // tiles for every later one.
  int max_levels = 1;

  // plan() (or plan_cascade()) once in the object's life (a second throws kInvalidArgument):
  // run() then launches the merge kernel only where that plan split, under use_cuda_graph too,
  // where it otherwise always launches it (a later plan may split). single_prefill_with_kv_cache
  // keeps one such object per shape: a merge launch costs ~2 us of host time.
  bool single_plan = false;
};

// One level of a cascade (BatchPrefill::plan_cascade), host arrays:
//   qo_indptr         int32 [groups + 1]: group g's query tokens are q[qo_indptr[g] ..
//                     qo_indptr[g + 1]); 0 first, every level ending at the batch's total
//   kv_indptr         int32 [groups + 1]: group g's pages are run()'s page ids [kv_indptr[g]
//                     .. kv_indptr[g + 1]); level 0's start at 0, each later level's where
//                     the level before ends (the levels' page ids back to back in one array)
//   kv_last_page_len  int32 [groups]: in [1, page_size] for groups with pages
struct CascadeLevel {
  std::span<const int32_t> qo_indptr;
  std::span<const int32_t> kv_indptr;
  std::span<const int32_t> kv_last_page_len;
};

// The limits the tile heuristic reads (from cuda::DeviceProperties).
struct PrefillDeviceLimits {
  int max_shared_bytes_per_block = 0;  // opt-in maximum
  int shared_bytes_per_sm = 0;
  int registers_per_sm = 0;
  // The Hopper family may run (sm_90 and the backend allows it); with warpgroup_only it must
  // (backend kFA3: query tiles of at least 64 rows).
  bool warpgroup_mma = false;
  bool warpgroup_only = false;
  // NVFP4 K/V (kv_dtype kU8): the kernels that convert NVFP4 (the mma.sync family's, the Hopper
  // family's at 64-row tiles) keep raw code and scale stages beside the 16-bit ones, which
  // count in the tile choice.
  bool nvfp4_raw_stages = false;
};

struct PrefillTiles {
  int query_tile = 0;      // packed query rows per CTA tile
  int kv_tile = 0;         // KV rows per pipeline stage
  bool warpgroup = false;  // the Hopper family (kernels/wgmma.cuh), else mma.sync
  friend bool operator==(const PrefillTiles&, const PrefillTiles&) = default;
};

// The §3.2.2 heuristic of paper 001, a pure function: the query tile is the smallest of
// 16/32/64/128 at least the average packed query length (q_len * group over requests with
// queries); the KV tile is the one whose fp32 accumulators fit the register budget and whose
// shared memory and registers let the most warps reside per SM (ties: the larger tile while
// registers stay comfortable, else the fewer accumulators). The mask matters only through the
// warp layout (custom masks keep one m16 tile per warp, kernels/prefill_params.cuh). Under
// limits.warpgroup_mma the tiles of the Hopper family's shapes (128 rows; 64 at head_dim_vo <=
// 128; every mask) take it (tiles.warpgroup) with its own KV tile rule: the most
// resident warps, then the larger tile, 64 columns for custom masks and head_dim_qk > 128.
PrefillTiles choose_prefill_tiles(double average_packed_rows, int head_dim_qk, int head_dim_vo,
                                  MaskMode mask, const PrefillDeviceLimits& limits);
// The KV tile for a given query tile (same rule).
int choose_prefill_kv_tile(int query_tile, int head_dim_qk, int head_dim_vo, MaskMode mask,
                           const PrefillDeviceLimits& limits);

// RopeStaging::kAuto's measure, a pure function: the K rows the fused rotation turns per K row
// of the batch (KV heads alike), the sum over requests and their query tiles of the keys a tile
// sees over the sum of kv_len. Tiles of query_tile packed rows (q_len x group, token-major); a
// tile sees the keys from its first token's window start (window_left >= 0) to its last token's
// position under kCausal (bottom-right aligned), to the end otherwise. 0 for a batch without
// keys. O(batch) for causal batches without a window whose tiles hold whole tokens and whose
// queries fit their KV, else O(tiles). The arrays are plan()'s, already validated.
double fused_rope_key_reads(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
                            int group, int query_tile, MaskMode mask, int window_left);
// kAuto stages plans whose fused_rope_key_reads is at least this. Staged against fused on an
// H200 (docs/perf.md forty-second session), b8 appends over 32768 keys: 0.8x at 1 (128 new
// tokens: one query tile a request), 1.06-1.08x at 2 (192, 256), 1.28x at 3 (384), 1.42x at 4
// (512); causal b16: 1.23x at 4.5 (1024), 1.8x at 16-64 (4096, 16384).
inline constexpr double kStageRopeMinKeyReads = 1.5;

// NVFP4 ragged K/V rows (BatchPrefillConfig::kv_dtype kU8): codes k [>= kv_indptr[batch], H_kv,
// D_qk / 2] and v [..., D_vo / 2] uint8, 8-byte aligned rows with a unit innermost stride; their
// block scales k_scales / v_scales [..., D / 16] e4m3 (or uint8 bytes), unit innermost stride,
// rows aligned to 16, 8 or 4 bytes as D / 16 is a multiple of them.
struct Nvfp4Rows {
  TensorView k, v, k_scales, v_scales;
};

// Batch prefill on one CUDA device:
//   BatchPrefill prefill(config);                       // validates, compiles the merge kernel
//   prefill.plan(qo_indptr, kv_indptr, last_page_len, s); // host arrays; one async copy on s
//   prefill.run(q, pages, o, lse, s);                     // one or two kernel launches
//   prefill.check();                                      // raises for out-of-range page ids
// plan() compiles (JIT, disk-cached) the kernel of newly chosen tiles; run() never compiles,
// allocates or synchronizes. The request tables (qo_indptr, kv_indptr, last_page_len, the
// custom mask's byte offsets) travel with the plan: run() reads no index data of the caller's
// but page ids, which the kernel range-checks. Under use_cuda_graph the tensors given to a
// captured run() must keep their addresses for every replay (refill them in place), as for
// BatchDecode.
class BatchPrefill {
 public:
  // Throws kInvalidArgument (bad config), kUnsupported (head dims, dtype, variant options),
  // kNoCudaDevice, kCompileError, kCudaError.
  explicit BatchPrefill(const BatchPrefillConfig& config);
  ~BatchPrefill();
  BatchPrefill(BatchPrefill&&) noexcept;
  BatchPrefill& operator=(BatchPrefill&&) noexcept;
  BatchPrefill(const BatchPrefill&) = delete;
  BatchPrefill& operator=(const BatchPrefill&) = delete;

  // Schedules one batch.
  //   qo_indptr         int32 [batch + 1], CPU: query tokens of request i are
  //                     q[qo_indptr[i] .. qo_indptr[i + 1])
  //   kv_indptr         int32 [batch + 1], CPU: pages (kPaged) or tokens (kRagged)
  //   kv_last_page_len  int32 [batch], CPU, kPaged only (empty for kRagged): in [1, page_size]
  //                     for requests with pages
  //   mask_indptr       params.mask == kCustom only, optional: int32 [batch + 1], CPU, byte
  //                     offsets of each request's mask bits (empty: packed back to back, whole
  //                     bytes per request: FlashInfer's segment_packbits layout)
  // 1 <= batch <= max_batch, qo_indptr[batch] <= max_total_qo. Tokens align bottom-right: token
  // t of a request with q_len, kv_len sits at KV position kv_len - q_len + t (append).
  // The plan is a one-queue plan (plan/plan.h): with many tiles, one work item per (request,
  // row tile, KV chunk) covering every KV head. Host time without the copy's driver call
  // (`flare plan-latency`: causal, q_len = kv_len uniform in [1, 2047], 32 / 8 heads, D 128,
  // page 16, 128 x 64 tiles on an H100's 264 CTAs; one core of a 2-core AMD EPYC VM): batch 1
  // ~1 us, batch 64 ~16 us (2304 items), batch 256 ~58 us; O(batch + tiles). Few or skewed
  // tiles whose queue order would end past the mean take Algorithm 1 (an item priced at 64 KiB
  // of KV beyond its rows and tokens, so that fill splits do not pile short tails on a CTA) and,
  // where it made fill splits, a sort of its pieces (batch 1, some steps: ~9 us, 240 items);
  // without fill splits the queue of its chunks (b64 q1 kv2048: ~7 us, 64 items).
  // Throws kInvalidArgument (malformed arrays naming them, bounds, more KV than a captured
  // run's tensors hold), kWorkspaceTooSmall.
  void plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_indptr,
            std::span<const int32_t> kv_last_page_len, cuda::Stream stream,
            std::span<const int32_t> mask_indptr = {});

  // Schedules a cascade (papers 001 §3.1, composable formats; plan/cascade.h): every token
  // attends the KV of its group in each level (a prefix shared by a group of requests, then
  // each request's own pages), and its output is the ⊕ of those states. The levels' groups
  // are planned as one batch and run() computes them in one prefill launch, a shared group's
  // query rows together (a prefix is read once per query tile, not once per request), then
  // one merge launch over the pieces of rows that several levels cover (rows only one level
  // covers, in one KV chunk, are written directly). params.mask kCausal applies to the last
  // level (bottom-right aligned there); the other levels see all their keys (FlashInfer's
  // MultiLevelCascadeAttentionWrapper). run() then takes the page ids of every level in one
  // array (CascadeLevel::kv_indptr) and q / o / lse of the batch's tokens.
  // Needs paged 16-bit K/V, 1 <= levels <= config.max_levels, all levels' groups together at
  // most max_batch, and no custom mask or user variant; a causal cascade of several levels
  // also no window, ALiBi or RoPE (their positions in the shared levels would not be
  // bottom-right). A page that two levels give one token counts twice (the levels' pages are
  // the caller's to keep disjoint; Python's wrapper checks host page tables). Throws
  // kInvalidArgument naming the level and array, kUnsupported, or kWorkspaceTooSmall, with
  // nothing staged.
  void plan_cascade(std::span<const CascadeLevel> levels, cuda::Stream stream);

  // Attention of the planned batch; every tensor on this prefill's device.
  //   q          [total_q, H_qo, D_qk] dtype, unit innermost stride, 16-byte aligned rows
  //   kv         NVFP4 (config.kv_dtype kU8): kv.k / kv.v the uint8 codes (D / 2 a row, 8-byte
  //              aligned rows), kv.k_scales / kv.v_scales their e4m3 (or uint8) block scales,
  //              pages like k / v with D / 16 a row (aligned as Nvfp4Rows'); an out-of-range
  //              page id is recorded and its page reads as zeros. Otherwise:
  //              kPaged: pages in config.layout ([pages, page_size, H_kv, D] NHD or
  //              [pages, H_kv, page_size, D] HND, k with D_qk, v with D_vo) and the page ids
  //              (int32 [>= kv_indptr[batch]] on the device), each range-checked by the kernel
  //              as in BatchDecode::run, except that an out-of-range id reads page 0 (rows
  //              past a tile's full pages: zeros). kRagged: k [>= kv_indptr[batch], H_kv, D_qk], v
  //              [..., D_vo] (checked on the host). Same alignment as q.
  //   o          [total_q, H_qo, D_vo] dtype, same alignment rule
  //   lse        optional float32 [total_q, H_qo]: log of the sum of exp of the scaled logits,
  //              natural or base 2 (options.lse_base); -inf (and o = 0) for rows that see no key
  //              (with options.sink: the sink's logit, and o = 0)
  //   mask_bits  uint8 [>= the plan's mask bytes] on the device, required iff params.mask
  //              == kCustom: request i's q_len x kv_len row-major bits, little bit order, from
  //              byte mask_indptr[i] (plan())
  //   options    q_scale, k_scale (logits) and v_scale (output), the LSE's base, PDL, a user
  //              variant's arguments, attention sinks (RunOptions::sink: in the kernels'
  //              final writes and the merge, no launch of their own)
  // Host cost: O(1) checks and one or two launches. Throws kInvalidArgument,
  // kUnsupported (paged K/V whose page stride or last-slot offset is 2^31 bytes or more) or,
  // in validation mode, kIndexOutOfRange before launching anything; kCudaError from a launch.
  void run(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
           const std::optional<TensorView>& lse, cuda::Stream stream,
           const std::optional<TensorView>& mask_bits = std::nullopt,
           const RunOptions& options = {});
  void run(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
           const std::optional<TensorView>& lse, cuda::Stream stream,
           const std::optional<TensorView>& mask_bits = std::nullopt,
           const RunOptions& options = {});
  void run(const TensorView& q, const Nvfp4Rows& kv, const TensorView& o,
           const std::optional<TensorView>& lse, cuda::Stream stream,
           const std::optional<TensorView>& mask_bits = std::nullopt,
           const RunOptions& options = {});

  // As BatchDecode::check().
  void check(const IndexNames& names = {"BatchPrefill", "kv_indices"}) const;

  const BatchPrefillConfig& config() const;
  PrefillTiles last_tiles() const;  // tiles of the latest plan
  bool last_plan_stages_rope() const;  // whether the latest plan's run() rotates into copies
  // The latest plan (host copy), for tests and tools: a one-queue plan (plan/plan.h), its
  // work_items in the order the kernel's CTAs take them, each covering item_heads KV heads
  // (an item's heads one after another, or every item under one head first where
  // head_major_queue).
  const Plan& last_plan() const;
  size_t workspace_size() const;      // device bytes held (without a caller's scratch)
  int64_t max_partial_slots() const;  // of the current workspace
  // Scratch bytes the default bound needs for `config` (as BatchDecode's).
  static size_t scratch_bytes_needed(const BatchPrefillConfig& config);

 private:
  struct State;
  struct KVArgs;
  static bool bulk_maps(State& s, const KVArgs& a);
  static bool bulk_q_map(State& s, const TensorView& q);
  // plan() and plan_cascade()'s end: the planned batch (state's `next`) checked against the
  // workspace, staged with its request tables, copied, and made current.
  void commit_plan(std::span<const int32_t> qo_begin, std::span<const int32_t> kv_indptr,
                   std::span<const int32_t> kv_last_page_len, cuda::Stream stream);
  void run_16bit(const TensorView& q, const PagedKVPages& kv, const TensorView& o,
                 const std::optional<TensorView>& lse, cuda::Stream stream,
                 const std::optional<TensorView>& mask_bits, const RunOptions& options);
  void run_16bit(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& o,
                 const std::optional<TensorView>& lse, cuda::Stream stream,
                 const std::optional<TensorView>& mask_bits, const RunOptions& options);
  void launch(const TensorView& q, const KVArgs& kv, const TensorView& o,
              const std::optional<TensorView>& lse, cuda::Stream stream,
              const std::optional<TensorView>& mask_bits, const RunOptions& options);
  std::unique_ptr<State> state_;
};

// The kernels of a config at given tiles, as JIT specs (no GPU needed).
struct BatchPrefillKernels {
  jit::KernelSpec prefill;  // entry "flare_prefill"
  jit::KernelSpec merge;    // entry "flare_merge" (kernels/merge.cuh, shared with decode)
  int threads = 0;
  size_t shared_bytes = 0;  // dynamic shared memory of one prefill CTA
};
// Throws kInvalidArgument / kUnsupported like the constructor.
BatchPrefillKernels batch_prefill_kernels(const BatchPrefillConfig& config,
                                          const PrefillTiles& tiles);

// The (config, tiles) pairs flare ships: every head-dim pair and query tile with the KV tile
// the heuristic picks on an H100, both KV paths, both dtypes, every mask and variant flag at
// the register-heaviest tiles, in both families. CI compiles each for sm_80 and sm_90a (the
// Hopper family for sm_90a only): zero spills, zero local.
struct ShippedPrefillConfig {
  BatchPrefillConfig config;
  PrefillTiles tiles;
};
std::vector<ShippedPrefillConfig> shipped_prefill_configs();

// The H100's limits for the mma.sync family (warpgroup_mma off), for shipped_prefill_configs
// and tests.
PrefillDeviceLimits h100_prefill_limits();

}  // namespace flare
