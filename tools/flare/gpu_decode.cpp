// GPU batch decode for the flare tool (see gpu_decode.h).
#include "tools/flare/gpu_decode.h"

#include <memory>
#include <optional>
#include <variant>

#include "flare/api/batch_decode.h"
#include "flare/core/error.h"
#include "flare/format/ragged.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "tools/flare/device_tensor.h"
#include "tools/flare/stream_timing.h"

namespace flare::cli {

struct GpuDecode::State {
  int device = 0;
  TensorView host_kv_indptr, host_last_page_len;
  std::optional<cuda::OwnedStream> stream;  // created once the device's context is current
  DeviceTensor q, k, v, kv_indptr, kv_indices, last_page_len, o, lse;
  PagedKV kv;
  std::optional<BatchDecode> decode;
};

GpuDecode::GpuDecode(const AttentionProblem& problem, int device)
    : state_(std::make_unique<State>()) {
  use_cuda_device(device);
  const auto* paged = std::get_if<PagedKV>(&problem.kv);
  FLARE_CHECK(paged != nullptr, ErrorCode::kInvalidArgument,
              "the GPU decode needs paged KV (ragged KV runs through the GPU prefill)");
  const int64_t batch = ragged_batch(problem.qo_indptr);
  for (int64_t i = 0; i < batch; ++i) {
    FLARE_CHECK(ragged_length(problem.qo_indptr, i) == 1, ErrorCode::kInvalidArgument,
                "the GPU decode needs one query token per request (request ", i, " has ",
                ragged_length(problem.qo_indptr, i), "; prefill runs through the GPU prefill)");
  }
  FLARE_CHECK(paged->head_dim_qk() == paged->head_dim_vo(), ErrorCode::kUnsupported,
              "the CUDA decode needs equal head dims for q/k and v, got ", paged->head_dim_qk(),
              " and ", paged->head_dim_vo());

  State& s = *state_;
  s.device = device;
  s.stream.emplace();

  BatchDecodeConfig config;
  config.device = device;
  config.max_batch = static_cast<int>(batch);
  config.num_qo_heads = static_cast<int>(problem.q.shape[1]);
  config.num_kv_heads = static_cast<int>(paged->num_kv_heads());
  config.head_dim = static_cast<int>(paged->head_dim_qk());
  config.page_size = static_cast<int>(paged->page_size());
  config.q_dtype = problem.q.dtype;
  config.kv_dtype = paged->k.dtype;
  config.layout = paged->layout;
  config.params = problem.params;
  s.decode.emplace(config);

  s.host_kv_indptr = paged->table.indptr;
  s.host_last_page_len = paged->table.last_block_len;
  s.q = upload(problem.q, device, "q");
  s.k = upload(paged->k, device, "k");
  s.v = upload(paged->v, device, "v");
  s.kv_indptr = upload(paged->table.indptr, device, "kv_indptr");
  s.kv_indices = upload(paged->table.indices, device, "kv_indices");
  s.last_page_len = upload(paged->table.last_block_len, device, "kv_last_page_len");
  s.kv = PagedKV::from_separate(s.k.view, s.v.view, paged->layout, s.kv_indptr.view,
                                s.kv_indices.view, s.last_page_len.view);
  s.o =
      allocate_poisoned(problem.q.dtype, {batch, problem.q.shape[1], paged->head_dim_vo()}, device);
  s.lse = allocate_poisoned(DType::kF32, {batch, problem.q.shape[1]}, device);
}

GpuDecode::~GpuDecode() = default;

void GpuDecode::plan() {
  state_->decode->plan(state_->host_kv_indptr, state_->host_last_page_len, state_->stream->get());
}

void GpuDecode::run() {
  State& s = *state_;
  const bool softmax = s.decode->config().params.use_softmax;
  s.decode->run(s.q.view, PagedKVPages::of(s.kv), s.o.view,
                softmax ? std::optional(s.lse.view) : std::nullopt, s.stream->get());
}

double GpuDecode::time_calls_ms(int calls) {
  return cli::time_calls_ms(state_->stream->get(), calls, [this] { run(); });
}

void GpuDecode::synchronize() { cuda::stream_synchronize(state_->stream->get()); }

HostTensor GpuDecode::o() const { return download(state_->o, state_->stream->get()); }

HostTensor GpuDecode::lse() const { return download(state_->lse, state_->stream->get()); }

std::string GpuDecode::device_label() const { return cuda_device_label(state_->device); }

int GpuDecode::num_ctas() const { return state_->decode->num_ctas(); }

int64_t GpuDecode::num_work_items() const {
  return static_cast<int64_t>(state_->decode->last_plan().work_items.size());
}

}  // namespace flare::cli
