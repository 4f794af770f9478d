// GPU batch decode for the flare tool (see gpu_decode.h).
#include "tools/flare/gpu_decode.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <variant>
#include <vector>

#include "flare/api/batch_decode.h"
#include "flare/core/error.h"
#include "flare/format/ragged.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"

namespace flare::cli {
namespace {

// A contiguous device copy of a contiguous host tensor, and the view of it.
struct DeviceTensor {
  cuda::DeviceBuffer buffer;
  TensorView view;
};

DeviceTensor upload(const TensorView& host, int device, const char* name) {
  FLARE_CHECK(host.device.is_cpu() && host.is_contiguous(), ErrorCode::kInvalidArgument, name,
              " must be a contiguous CPU tensor to copy to the GPU");
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_bytes(host.dtype);
  DeviceTensor copy{cuda::DeviceBuffer(bytes > 0 ? bytes : 16), {}};
  if (bytes > 0) cuda::memcpy_htod(copy.buffer.data(), host.data, bytes);
  copy.view = host;
  copy.view.data = copy.buffer.data();
  copy.view.device = Device::cuda(device);
  return copy;
}

DeviceTensor allocate(DType dtype, std::initializer_list<int64_t> shape, int device) {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;
  const size_t bytes = static_cast<size_t>(numel) * dtype_bytes(dtype);
  DeviceTensor tensor{cuda::DeviceBuffer(bytes > 0 ? bytes : 16), {}};
  tensor.view = TensorView::contiguous(tensor.buffer.data(), dtype, shape, Device::cuda(device));
  return tensor;
}

HostTensor download(const DeviceTensor& tensor) {
  const TensorView& v = tensor.view;
  HostTensor host(v.dtype, std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.ndim));
  const size_t bytes = static_cast<size_t>(host.numel()) * dtype_bytes(v.dtype);
  if (bytes > 0) cuda::memcpy_dtoh(host.data<std::byte>(), tensor.buffer.data(), bytes);
  return host;
}

}  // namespace

struct GpuDecode::State {
  int device = 0;
  std::string name;
  TensorView host_kv_indptr, host_last_page_len;
  std::optional<cuda::OwnedStream> stream;  // created once the device's context is current
  DeviceTensor q, k, v, kv_indptr, kv_indices, last_page_len, o, lse;
  PagedKV kv;
  std::optional<BatchDecode> decode;
};

GpuDecode::GpuDecode(const AttentionProblem& problem, int device)
    : state_(std::make_unique<State>()) {
  FLARE_CHECK(cuda::available(), ErrorCode::kNoCudaDevice, "cuda:", device,
              ": no usable CUDA device (", cuda::unavailable_reason(), ")");
  FLARE_CHECK(device >= 0 && device < cuda::device_count(), ErrorCode::kNoCudaDevice,
              "cuda:", device, ": no such device, this machine has ", cuda::device_count());
  const auto* paged = std::get_if<PagedKV>(&problem.kv);
  FLARE_CHECK(paged != nullptr, ErrorCode::kUnsupported,
              "the CUDA backend is not available yet for ragged KV");
  const int64_t batch = ragged_batch(problem.qo_indptr);
  for (int64_t i = 0; i < batch; ++i) {
    FLARE_CHECK(ragged_length(problem.qo_indptr, i) == 1, ErrorCode::kUnsupported,
                "the CUDA backend is not available yet for prefill (request ", i, " has ",
                ragged_length(problem.qo_indptr, i), " query tokens)");
  }
  FLARE_CHECK(paged->head_dim_qk() == paged->head_dim_vo(), ErrorCode::kUnsupported,
              "the CUDA decode needs equal head dims for q/k and v, got ", paged->head_dim_qk(),
              " and ", paged->head_dim_vo());

  State& s = *state_;
  s.device = device;
  cuda::set_device(device);
  s.name = cuda::device_properties(device).name;
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
  s.o = allocate(problem.q.dtype, {batch, problem.q.shape[1], paged->head_dim_vo()}, device);
  s.lse = allocate(DType::kF32, {batch, problem.q.shape[1]}, device);
}

GpuDecode::~GpuDecode() = default;

void GpuDecode::plan() {
  state_->decode->plan(state_->host_kv_indptr, state_->host_last_page_len, state_->stream->get());
}

void GpuDecode::run() {
  State& s = *state_;
  const bool softmax = s.decode->config().params.use_softmax;
  s.decode->run(s.q.view, s.kv, s.o.view, softmax ? std::optional(s.lse.view) : std::nullopt,
                s.stream->get());
}

double GpuDecode::time_calls_ms(int calls) {
  cuda::Event start(true), stop(true);
  start.record(state_->stream->get());
  for (int i = 0; i < calls; ++i) run();
  stop.record(state_->stream->get());
  stop.synchronize();
  return stop.elapsed_ms_since(start);
}

void GpuDecode::synchronize() { cuda::stream_synchronize(state_->stream->get()); }

HostTensor GpuDecode::o() const {
  cuda::stream_synchronize(state_->stream->get());
  return download(state_->o);
}

HostTensor GpuDecode::lse() const {
  cuda::stream_synchronize(state_->stream->get());
  return download(state_->lse);
}

std::string GpuDecode::device_label() const {
  return "cuda:" + std::to_string(state_->device) + " (" + state_->name + ")";
}

int GpuDecode::num_ctas() const { return state_->decode->num_ctas(); }

int64_t GpuDecode::num_work_items() const {
  return static_cast<int64_t>(state_->decode->last_plan().work_items.size());
}

}  // namespace flare::cli
