// GPU batch prefill for the flare tool (see gpu_prefill.h).
#include "tools/flare/gpu_prefill.h"

#include <algorithm>
#include <optional>
#include <span>
#include <variant>
#include <vector>

#include "flare/api/batch_prefill.h"
#include "flare/core/error.h"
#include "flare/format/ragged.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "tools/flare/device_tensor.h"
#include "tools/flare/stream_timing.h"

namespace flare::cli {
namespace {

// What BatchPrefill does not run, named by the tool's options, before anything is copied.
void check_supported(const AttentionProblem& problem, DType kv_dtype) {
  const AttentionParams& p = problem.params;
  FLARE_CHECK(p.pos_encoding != PosEncoding::kRopeLlama, ErrorCode::kUnsupported,
              "the GPU prefill does not support RoPE (--rope): apply it to q and k before the "
              "call, or use --device cpu");
  FLARE_CHECK(!is_fp8(kv_dtype), ErrorCode::kUnsupported,
              "the GPU prefill does not support fp8 KV (--kv-dtype e4m3|e5m2, got ",
              dtype_name(kv_dtype),
              "): on the GPU, fp8 KV runs decode batches only (one query token per request, "
              "paged KV); use --device cpu");
  const DType q_dtype = problem.q.dtype;
  FLARE_CHECK((q_dtype == DType::kF16 || q_dtype == DType::kBF16) && kv_dtype == q_dtype,
              ErrorCode::kUnsupported,
              "the GPU prefill takes q, k and v in one dtype, float16 or bfloat16 (--dtype "
              "f16|bf16 without another --kv-dtype), got q ",
              dtype_name(q_dtype), " and KV ", dtype_name(kv_dtype));
}

std::vector<int32_t> host_values(const TensorView& indices) {
  const int32_t* data = indices.ptr<const int32_t>();
  return std::vector<int32_t>(data, data + indices.numel());
}

}  // namespace

struct GpuPrefill::State {
  int device = 0;
  int64_t total_q = 0;
  // Host values for plan() (mask_indptr: the custom mask's byte offsets).
  std::vector<int32_t> qo_indptr, kv_indptr, last_page_len, mask_indptr;
  std::optional<cuda::OwnedStream> stream;  // created once the device's context is current
  DeviceTensor q, k, v, kv_indices, mask_bits, o, lse;
  std::optional<PagedKVPages> pages;  // views of the device copies (paged KV)
  std::optional<TensorView> mask;
  std::optional<BatchPrefill> prefill;
};

GpuPrefill::GpuPrefill(const AttentionProblem& problem, int device)
    : state_(std::make_unique<State>()) {
  const TensorView& host_k =
      std::visit([](const auto& cache) -> const TensorView& { return cache.k; }, problem.kv);
  // Without a GPU, that is said first; then what BatchPrefill does not run, before any copy.
  use_cuda_device(device);
  check_supported(problem, host_k.dtype);

  State& s = *state_;
  s.device = device;
  s.stream.emplace();
  const int64_t batch = ragged_batch(problem.qo_indptr);
  const int64_t heads_qo = problem.q.shape[1];
  s.total_q = problem.q.shape[0];

  BatchPrefillConfig config;
  config.device = device;
  config.max_batch = static_cast<int>(std::max<int64_t>(batch, 1));
  config.max_total_qo = static_cast<int>(std::max<int64_t>(s.total_q, 1));
  config.num_qo_heads = static_cast<int>(heads_qo);
  config.num_kv_heads = static_cast<int>(num_kv_heads(problem.kv));
  config.head_dim_qk = static_cast<int>(head_dim_qk(problem.kv));
  config.head_dim_vo = static_cast<int>(head_dim_vo(problem.kv));
  config.dtype = problem.q.dtype;
  config.params = problem.params;
  // The mask bits go to run() on the device; the config keeps only the mode.
  config.params.custom_mask.reset();
  config.params.mask_indptr.reset();

  s.qo_indptr = host_values(problem.qo_indptr);
  s.q = upload(problem.q, device, "q");
  if (const auto* paged = std::get_if<PagedKV>(&problem.kv)) {
    config.kv = PrefillKV::kPaged;
    config.page_size = static_cast<int>(paged->page_size());
    config.layout = paged->layout;
    s.kv_indptr = host_values(paged->table.indptr);
    s.last_page_len = host_values(paged->table.last_block_len);
    s.k = upload(paged->k, device, "k");
    s.v = upload(paged->v, device, "v");
    s.kv_indices = upload(paged->table.indices, device, "kv_indices");
    s.pages = PagedKVPages{s.k.view, s.v.view, paged->layout, s.kv_indices.view};
  } else {
    const auto& ragged = std::get<RaggedKV>(problem.kv);
    config.kv = PrefillKV::kRagged;
    s.kv_indptr = host_values(ragged.indptr);
    s.k = upload(ragged.k, device, "k");
    s.v = upload(ragged.v, device, "v");
  }
  if (problem.params.mask == MaskMode::kCustom) {
    s.mask_bits = upload(*problem.params.custom_mask, device, "custom_mask");
    s.mask_indptr = host_values(*problem.params.mask_indptr);
    s.mask = s.mask_bits.view;
  }
  s.o = allocate_poisoned(problem.q.dtype, {s.total_q, heads_qo, config.head_dim_vo}, device);
  s.lse = allocate_poisoned(DType::kF32, {s.total_q, heads_qo}, device);
  s.prefill.emplace(config);
}

GpuPrefill::~GpuPrefill() = default;

void GpuPrefill::plan() {
  State& s = *state_;
  if (s.total_q == 0) return;  // no query token: nothing to schedule (BatchPrefill needs one)
  s.prefill->plan(s.qo_indptr, s.kv_indptr, s.last_page_len, s.stream->get(), s.mask_indptr);
}

void GpuPrefill::run() {
  State& s = *state_;
  if (s.total_q == 0) return;
  // Sigmoid attention (use_softmax = false) has no lse.
  const std::optional<TensorView> lse =
      s.prefill->config().params.use_softmax ? std::optional(s.lse.view) : std::nullopt;
  if (s.pages) {
    s.prefill->run(s.q.view, *s.pages, s.o.view, lse, s.stream->get(), s.mask);
  } else {
    s.prefill->run(s.q.view, s.k.view, s.v.view, s.o.view, lse, s.stream->get(), s.mask);
  }
}

double GpuPrefill::time_calls_ms(int calls) {
  return cli::time_calls_ms(state_->stream->get(), calls, [this] { run(); });
}

HostTensor GpuPrefill::o() const { return download(state_->o, state_->stream->get()); }

HostTensor GpuPrefill::lse() const { return download(state_->lse, state_->stream->get()); }

std::string GpuPrefill::device_label() const { return cuda_device_label(state_->device); }

int GpuPrefill::num_ctas() const { return state_->prefill->last_plan().num_ctas; }

int64_t GpuPrefill::num_work_items() const {
  return static_cast<int64_t>(state_->prefill->last_plan().work_items.size());
}

}  // namespace flare::cli
