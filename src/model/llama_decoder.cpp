// flare::model::LlamaDecoder (flare/model/llama_decoder.h): tensor checks, the kernel's
// compile-time shape, scratch, and the step's launch.
#include "flare/model/llama_decoder.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "flare/model/int4_weights.h"
#include "kernels/llama_decode_params.cuh"

namespace flare::model {
namespace {

constexpr const char* kWhat = "LlamaDecoder";
static_assert(kMaxDecodeBatch == llama::kMaxBatch);
constexpr int kSharedMargin = 1024;  // the kernel's static shared memory (two flags) and slack

void check_tensor(const TensorView& t, const std::string& name, DType dtype,
                  std::vector<int64_t> shape, const Device& device) {
  bool ok = t.ndim == static_cast<int>(shape.size()) && t.dtype == dtype && t.device == device &&
            t.is_contiguous() && t.data != nullptr && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = t.shape[i] == shape[i];
  std::string expected = "[";
  for (size_t i = 0; i < shape.size(); ++i) expected += (i ? ", " : "") + std::to_string(shape[i]);
  expected += "]";
  FLARE_CHECK(ok, ErrorCode::kInvalidArgument, kWhat, ": ", name,
              " must be a contiguous, 16-byte "
              "aligned ",
              dtype_name(dtype), " ", expected, " tensor on ", device.str(), ", got ",
              dtype_name(t.dtype), " ", t.shape_str(), " on ", t.device.str(),
              t.is_contiguous() ? "" : " (not contiguous)");
}

void check_step_array(const char* method, const TensorView& t, const char* name, int64_t size,
                      const Device& device) {
  FLARE_CHECK(t.ndim == 1 && (size < 0 || t.shape[0] == size) && t.dtype == DType::kI32 &&
                  t.device == device && (t.shape[0] <= 1 || t.strides[0] == 1) &&
                  (t.shape[0] == 0 || t.data != nullptr),
              ErrorCode::kInvalidArgument, kWhat, ".", method, ": ", name,
              " must be a contiguous int32 [", size < 0 ? std::string("n") : std::to_string(size),
              "] tensor on ", device.str(), ", got ", dtype_name(t.dtype), " ", t.shape_str(),
              " on ", t.device.str());
}

const uint16_t* bf16_ptr(const TensorView& t) { return static_cast<const uint16_t*>(t.data); }

// A projection [rows, cols]: bf16, or 4-bit codes and scales; into the kernel's pointers.
void check_projection(const TensorView& weight, const TensorView& scales, const std::string& name,
                      WeightFormat format, int64_t rows, int64_t cols, const Device& device,
                      const void*& w, const unsigned short*& s) {
  if (format == WeightFormat::kBf16) {
    check_tensor(weight, name + ".weight", DType::kBF16, {rows, cols}, device);
    FLARE_CHECK(scales.data == nullptr, ErrorCode::kInvalidArgument, kWhat, ": ", name,
                " has scales but the config's weight_format is bf16");
    w = weight.data;
    s = nullptr;
    return;
  }
  check_tensor(weight, name + ".weight_codes", DType::kU8, {rows, cols / 2}, device);
  check_tensor(scales, name + ".weight_scales", DType::kBF16, {rows, cols / kInt4GroupSize},
               device);
  w = weight.data;
  s = bf16_ptr(scales);
}

}  // namespace

std::array<ProjectionSlot, 7> projection_slots(const LlamaConfig& c, LlamaLayerTensors& t) {
  static_assert(llama::kNumProjections == 7);
  const int64_t h = c.hidden, qd = int64_t{c.heads} * c.head_dim,
                kvd = int64_t{c.kv_heads} * c.head_dim, f = c.intermediate;
  return {{{"self_attn.q_proj", qd, h, &t.q_proj, &t.q_scales},
           {"self_attn.k_proj", kvd, h, &t.k_proj, &t.k_scales},
           {"self_attn.v_proj", kvd, h, &t.v_proj, &t.v_scales},
           {"self_attn.o_proj", h, qd, &t.o_proj, &t.o_scales},
           {"mlp.gate_proj", f, h, &t.gate_proj, &t.gate_scales},
           {"mlp.up_proj", f, h, &t.up_proj, &t.up_scales},
           {"mlp.down_proj", h, f, &t.down_proj, &t.down_scales}}};
}

jit::KernelSpec llama_decode_kernel_spec(const LlamaConfig& config, const DecodeSchedule& schedule,
                                         bool multi_step) {
  validate(config);
  FLARE_CHECK(schedule.stages >= 2 && schedule.activation_rows >= 0 &&
                  schedule.activation_rows <= llama::kMaxBatch,
              ErrorCode::kInvalidArgument, kWhat, ": no kernel for ", schedule.stages,
              " stages and ", schedule.activation_rows, " activation rows");
  const int group = config.heads / config.kv_heads;
  jit::KernelSpec spec;
  spec.family_header = "llama_decode.cuh";
  spec.entry = "flare_llama_decode";
  spec.defines = {{"FLARE_LLAMA_HEAD_DIM", std::to_string(config.head_dim)},
                  {"FLARE_LLAMA_GROUP", std::to_string(group)},
                  {"FLARE_LLAMA_STAGES", std::to_string(schedule.stages)},
                  {"FLARE_LLAMA_ACT_ROWS", std::to_string(schedule.activation_rows)},
                  {"FLARE_LLAMA_ACT_COLS", std::to_string(schedule.activation_cols)},
                  {"FLARE_LLAMA_WEIGHT_BITS", std::to_string(config.weight_bits())},
                  {"FLARE_LLAMA_MULTI_STEP", multi_step ? "1" : "0"}};
  spec.label = "llama decode " + std::string(weight_format_name(config.weight_format)) +
               " d=" + std::to_string(config.head_dim) + " g=" + std::to_string(group) +
               " stages=" + std::to_string(schedule.stages) +
               " act=" + std::to_string(schedule.activation_rows) + "x" +
               std::to_string(schedule.activation_cols) + (multi_step ? " multi-step" : "");
  return spec;
}

std::vector<jit::KernelSpec> shipped_llama_decode_kernel_specs() {
  constexpr int kH100SharedOptin = 232448;  // 227 KiB
  std::vector<jit::KernelSpec> specs;
  // The 70B only with 4-bit weights: in bf16 it does not fit one GPU.
  struct Shipped {
    const char* name;
    WeightFormat format;
    std::vector<int> batches;
  };
  const Shipped shipped[] = {{"llama-3.1-8b", WeightFormat::kBf16, {1, 2, 4, 8}},
                             {"llama-3.2-1b", WeightFormat::kBf16, {1}},
                             {"llama-3.2-3b", WeightFormat::kBf16, {1}},
                             {"llama-3.1-8b", WeightFormat::kInt4, {1, 4}},
                             {"llama-3.1-70b", WeightFormat::kInt4, {1}}};
  for (const Shipped& m : shipped) {
    LlamaConfig c = llama_preset(m.name);
    c.weight_format = m.format;
    for (int batch : m.batches) {
      const DecodeSchedule s =
          build_decode_schedule(c, batch, 132, kH100SharedOptin - kSharedMargin);
      specs.push_back(llama_decode_kernel_spec(c, s));
    }
  }
  return specs;
}

struct LlamaDecoder::Scratch {
  cuda::DeviceBuffer layers, inv_freq, x, norm_partials, q, attn_partials, attn_out, mlp_act, xg,
      argmax_partials, sample_partials, counters, error;
  int counter_count = 0;
};

LlamaDecoder::LlamaDecoder(LlamaConfig config, LlamaWeights weights, LlamaKvCache cache)
    : config_(std::move(config)), weights_(std::move(weights)) {
  validate(config_);
  const LlamaConfig& c = config_;
  const Device device = weights_.embed_tokens.device;
  FLARE_CHECK(device.is_cuda(), ErrorCode::kInvalidArgument, kWhat,
              ": weights must be CUDA tensors, got embed_tokens on ", device.str());
  device_ = device.index;
  const int64_t h = c.hidden, qd = int64_t{c.heads} * c.head_dim;
  check_tensor(weights_.embed_tokens, "embed_tokens", DType::kBF16, {c.vocab, h}, device);
  check_tensor(weights_.norm, "norm", DType::kBF16, {h}, device);
  check_tensor(weights_.lm_head, "lm_head", DType::kBF16, {c.vocab, h}, device);
  FLARE_CHECK(static_cast<int>(weights_.layers.size()) == c.num_layers, ErrorCode::kInvalidArgument,
              kWhat, ": ", c.num_layers, " layers of weights expected, got ",
              weights_.layers.size());
  FLARE_CHECK(static_cast<int>(cache.k.size()) == c.num_layers &&
                  static_cast<int>(cache.v.size()) == c.num_layers,
              ErrorCode::kInvalidArgument, kWhat, ": ", c.num_layers,
              " K and V cache tensors expected, got ", cache.k.size(), " and ", cache.v.size());
  FLARE_CHECK(cache.k[0].ndim == 4, ErrorCode::kInvalidArgument, kWhat,
              ": k_cache[0] must be [num_pages, page_size, kv_heads, head_dim], got ",
              cache.k[0].shape_str());
  num_pages_ = static_cast<int>(cache.k[0].shape[0]);
  page_size_ = static_cast<int>(cache.k[0].shape[1]);
  FLARE_CHECK(num_pages_ > 0 && page_size_ > 0 && cache.k[0].shape[0] < (int64_t{1} << 31),
              ErrorCode::kInvalidArgument, kWhat, ": k_cache[0] must have pages, got ",
              cache.k[0].shape_str());
  std::vector<llama::LayerWeights> layers(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string at = "layers." + std::to_string(l) + ".";
    LlamaLayerTensors& t = weights_.layers[static_cast<size_t>(l)];
    llama::LayerWeights& w = layers[static_cast<size_t>(l)];
    int i = 0;
    for (const ProjectionSlot& slot : projection_slots(c, t)) {
      check_projection(*slot.weight, *slot.scales, at + slot.name, c.weight_format, slot.rows,
                       slot.cols, device, w.w[i], w.scales[i]);
      ++i;
    }
    check_tensor(t.input_layernorm, at + "input_layernorm.weight", DType::kBF16, {h}, device);
    check_tensor(t.post_attention_layernorm, at + "post_attention_layernorm.weight", DType::kBF16,
                 {h}, device);
    const std::vector<int64_t> cache_shape = {num_pages_, page_size_, c.kv_heads, c.head_dim};
    check_tensor(cache.k[static_cast<size_t>(l)], "k_cache[" + std::to_string(l) + "]",
                 DType::kBF16, cache_shape, device);
    check_tensor(cache.v[static_cast<size_t>(l)], "v_cache[" + std::to_string(l) + "]",
                 DType::kBF16, cache_shape, device);
    w.attn_norm = bf16_ptr(t.input_layernorm);
    w.mlp_norm = bf16_ptr(t.post_attention_layernorm);
    w.k_cache = static_cast<uint16_t*>(cache.k[static_cast<size_t>(l)].data);
    w.v_cache = static_cast<uint16_t*>(cache.v[static_cast<size_t>(l)].data);
  }

  const cuda::DeviceScope scope(device_);
  const cuda::DeviceProperties props = cuda::device_properties(device_);
  FLARE_CHECK(props.cc_major >= 9, ErrorCode::kUnsupported, kWhat,
              ": the decode megakernel streams weights with bulk async copies (sm_90); ",
              props.name, " is sm_", props.cc_major, props.cc_minor);
  num_ctas_ = props.num_sms;
  max_shared_ = props.max_shared_bytes_per_block_optin - kSharedMargin;
  variant(1);  // compiles the batch-1 kernel; checks that it fits
  const int group = c.heads / c.kv_heads;

  scratch_ = std::make_unique<Scratch>();
  Scratch& s = *scratch_;
  const auto floats = [](int64_t n) { return static_cast<size_t>(n) * 4; };
  const int64_t max_items = std::max<int64_t>(num_ctas_, int64_t{llama::kMaxBatch} * c.kv_heads);
  s.layers = cuda::DeviceBuffer(layers.size() * sizeof(llama::LayerWeights));
  cuda::memcpy_htod(s.layers.data(), layers.data(), s.layers.bytes());
  const std::vector<float> inv_freq = rope_inv_freq(c);
  s.inv_freq = cuda::DeviceBuffer(floats(static_cast<int64_t>(inv_freq.size())));
  cuda::memcpy_htod(s.inv_freq.data(), inv_freq.data(), s.inv_freq.bytes());
  s.x = cuda::DeviceBuffer(floats(llama::kMaxBatch * h));
  s.norm_partials =
      cuda::DeviceBuffer(floats((2 * int64_t{c.num_layers} + 1) * num_ctas_ * llama::kMaxBatch));
  s.q = cuda::DeviceBuffer(floats(llama::kMaxBatch * qd));
  s.attn_partials = cuda::DeviceBuffer(floats(max_items * group * (c.head_dim + 1)));
  s.attn_out = cuda::DeviceBuffer(static_cast<size_t>(llama::kMaxBatch * qd) * 2);
  s.mlp_act =
      cuda::DeviceBuffer(static_cast<size_t>(int64_t{llama::kMaxBatch} * c.intermediate) * 2);
  s.xg = cuda::DeviceBuffer(static_cast<size_t>(llama::kMaxBatch * h) * 2);
  s.argmax_partials = cuda::DeviceBuffer(floats(int64_t{num_ctas_} * llama::kMaxBatch * 2));
  s.sample_partials = cuda::DeviceBuffer(floats(int64_t{num_ctas_} * llama::kMaxBatch * 8));
  s.counter_count = llama::counter_count(c.num_layers, c.kv_heads);
  s.counters = cuda::DeviceBuffer(static_cast<size_t>(s.counter_count) * 4);
  s.error = cuda::DeviceBuffer(4);
  const int32_t zero = 0;
  cuda::memcpy_htod(s.error.data(), &zero, 4);
}

LlamaDecoder::~LlamaDecoder() = default;

void LlamaDecoder::prepare(int batch) {
  FLARE_CHECK(batch >= 1 && batch <= llama::kMaxBatch, ErrorCode::kInvalidArgument, kWhat,
              ".prepare: batch must be in [1, ", llama::kMaxBatch, "], got ", batch);
  const cuda::DeviceScope scope(device_);
  variant(batch);
}

DecodeSchedule LlamaDecoder::schedule(int batch) const {
  return build_decode_schedule(config_, batch, num_ctas_, max_shared_);
}

LlamaDecoder::Variant& LlamaDecoder::variant(int batch) {
  std::optional<Variant>& slot = by_batch_[static_cast<size_t>(batch)];
  if (slot.has_value()) return *slot;
  DecodeSchedule s = schedule(batch);
  Variant v;
  v.kernel = jit::get_kernel(llama_decode_kernel_spec(config_, s), "flare_llama_decode", device_);
  cuda::set_max_dynamic_shared(v.kernel, s.shared_bytes);
  FLARE_CHECK(cuda::max_active_blocks_per_sm(v.kernel, llama::kThreads,
                                             static_cast<size_t>(s.shared_bytes)) >= 1,
              ErrorCode::kUnsupported, kWhat, ": one block of ", llama::kThreads, " threads and ",
              s.shared_bytes, " bytes of shared memory does not fit an SM of device ", device_);
  v.schedule = std::move(s);
  return slot.emplace(std::move(v));
}

void LlamaDecoder::step(const TensorView& tokens, const TensorView& positions,
                        const TensorView& kv_indptr, const TensorView& kv_indices,
                        const TensorView& next_tokens, const TensorView& logits,
                        cuda::Stream stream, const SamplingParams& sampling) {
  launch(false, tokens, positions, kv_indptr, kv_indices, 1, next_tokens, logits, stream, sampling);
}

void LlamaDecoder::generate(const TensorView& tokens, const TensorView& positions,
                            const TensorView& kv_indptr, const TensorView& kv_indices,
                            int num_steps, const TensorView& step_tokens, const TensorView& logits,
                            cuda::Stream stream, const SamplingParams& sampling) {
  launch(true, tokens, positions, kv_indptr, kv_indices, num_steps, step_tokens, logits, stream,
         sampling);
}

void LlamaDecoder::launch(bool generate, const TensorView& tokens, const TensorView& positions,
                          const TensorView& kv_indptr, const TensorView& kv_indices, int num_steps,
                          const TensorView& next_tokens, const TensorView& logits,
                          cuda::Stream stream, const SamplingParams& sampling) {
  const Device device = Device::cuda(device_);
  const char* method = generate ? "generate" : "step";
  check_sampling(sampling, generate ? "LlamaDecoder.generate" : "LlamaDecoder.step");
  FLARE_CHECK(tokens.ndim == 1 && tokens.shape[0] >= 1 && tokens.shape[0] <= llama::kMaxBatch,
              ErrorCode::kInvalidArgument, kWhat, ".", method,
              ": tokens must be [batch] with batch in [1, ", llama::kMaxBatch, "], got ",
              tokens.shape_str());
  const int batch = static_cast<int>(tokens.shape[0]);
  FLARE_CHECK(num_steps >= 1, ErrorCode::kInvalidArgument, kWhat, ".", method,
              ": num_steps must be >= 1, got ", num_steps);
  check_step_array(method, tokens, "tokens", batch, device);
  check_step_array(method, positions, "positions", batch, device);
  check_step_array(method, kv_indptr, "kv_indptr", batch + 1, device);
  check_step_array(method, kv_indices, "kv_indices", -1, device);
  if (!generate) {
    check_step_array(method, next_tokens, "next_tokens", batch, device);
  } else {
    FLARE_CHECK(next_tokens.ndim == 2 && next_tokens.shape[0] == num_steps &&
                    next_tokens.shape[1] == batch && next_tokens.dtype == DType::kI32 &&
                    next_tokens.device == device && next_tokens.is_contiguous() &&
                    next_tokens.data != nullptr,
                ErrorCode::kInvalidArgument, kWhat, ".", method,
                ": step_tokens must be a contiguous int32 [", num_steps, ", ", batch,
                "] tensor on ", device.str(), ", got ", dtype_name(next_tokens.dtype), " ",
                next_tokens.shape_str(), " on ", next_tokens.device.str());
  }
  FLARE_CHECK(kv_indices.shape[0] < (int64_t{1} << 31), ErrorCode::kInvalidArgument, kWhat, ".",
              method, ": kv_indices must have fewer than 2^31 entries, got ", kv_indices.shape[0]);
  FLARE_CHECK(logits.ndim == 2 && logits.shape[0] == batch && logits.shape[1] == config_.vocab &&
                  logits.dtype == DType::kF32 && logits.device == device && logits.is_contiguous(),
              ErrorCode::kInvalidArgument, kWhat, ".", method,
              ": logits must be a contiguous float32 [", batch, ", ", config_.vocab, "] tensor on ",
              device.str(), ", got ", dtype_name(logits.dtype), " ", logits.shape_str(), " on ",
              logits.device.str());

  Scratch& s = *scratch_;
  llama::DecodeParams p{};
  p.layers = static_cast<const llama::LayerWeights*>(s.layers.data());
  p.embed = bf16_ptr(weights_.embed_tokens);
  p.final_norm = bf16_ptr(weights_.norm);
  p.lm_head = bf16_ptr(weights_.lm_head);
  p.rope_inv_freq = static_cast<const float*>(s.inv_freq.data());
  p.num_layers = config_.num_layers;
  p.head_dim = config_.head_dim;
  p.hidden = config_.hidden;
  p.intermediate = config_.intermediate;
  p.heads = config_.heads;
  p.kv_heads = config_.kv_heads;
  p.vocab = config_.vocab;
  p.rms_eps = static_cast<float>(config_.rms_eps);
  p.sm_scale_log2 =
      static_cast<float>(1.0 / std::sqrt(static_cast<double>(config_.head_dim)) * M_LOG2E);
  p.batch = batch;
  p.tokens = tokens.ptr<const int32_t>();
  p.positions = positions.ptr<const int32_t>();
  p.kv_indptr = kv_indptr.ptr<const int32_t>();
  p.kv_indices = kv_indices.ptr<const int32_t>();
  p.num_kv_indices = static_cast<int>(kv_indices.shape[0]);
  p.num_pages = num_pages_;
  p.page_size = page_size_;
  const cuda::DeviceScope scope(device_);
  Variant& v = variant(batch);
  p.attention_splits = v.schedule.attention_splits;
  p.num_steps = num_steps;
  p.logits = logits.ptr<float>();
  p.next_tokens = next_tokens.ptr<int32_t>();
  p.x = static_cast<float*>(s.x.data());
  p.norm_partials = static_cast<float*>(s.norm_partials.data());
  p.q = static_cast<float*>(s.q.data());
  p.attn_partials = static_cast<float*>(s.attn_partials.data());
  p.attn_out = static_cast<uint16_t*>(s.attn_out.data());
  p.mlp_act = static_cast<uint16_t*>(s.mlp_act.data());
  p.xg = static_cast<uint16_t*>(s.xg.data());
  p.argmax_partials = static_cast<float*>(s.argmax_partials.data());
  p.sample_partials = static_cast<float*>(s.sample_partials.data());
  p.temperature = sampling.temperature;
  p.top_k = sampling.top_k >= config_.vocab ? 0 : sampling.top_k;  // all tokens: off
  p.top_p = sampling.top_p;
  p.seed = sampling.seed;
  p.counters = static_cast<unsigned*>(s.counters.data());
  p.error = static_cast<int32_t*>(s.error.data());
  p.trace = trace_;

  cuda::memset_d8_async(s.counters.data(), 0, s.counters.bytes(), stream);
  void* args[] = {&p};
  // More than one step: the generate() kernel, compiled on the batch's first multi-step launch.
  if (num_steps > 1 && v.multi_step_kernel == nullptr) {
    v.multi_step_kernel = jit::get_kernel(llama_decode_kernel_spec(config_, v.schedule, true),
                                          "flare_llama_decode", device_);
    cuda::set_max_dynamic_shared(v.multi_step_kernel, v.schedule.shared_bytes);
  }
  cuda::launch(num_steps > 1 ? v.multi_step_kernel : v.kernel, static_cast<unsigned>(num_ctas_), 1,
               1, llama::kThreads, 1, 1, static_cast<unsigned>(v.schedule.shared_bytes), stream,
               args);
}

int LlamaDecoder::trace_events() const { return llama::trace_events(config_.num_layers); }

void LlamaDecoder::set_trace(const TensorView& trace) {
  if (trace.data == nullptr) {
    trace_ = nullptr;
    return;
  }
  FLARE_CHECK(trace.ndim == 2 && trace.shape[0] == num_ctas_ && trace.shape[1] == trace_events() &&
                  trace.dtype == DType::kI64 && trace.device == Device::cuda(device_) &&
                  trace.is_contiguous(),
              ErrorCode::kInvalidArgument, kWhat, ".set_trace: trace must be a contiguous int64 [",
              num_ctas_, ", ", trace_events(), "] tensor on cuda:", device_, ", got ",
              dtype_name(trace.dtype), " ", trace.shape_str());
  trace_ = static_cast<long long*>(trace.data);
}

DecodeError LlamaDecoder::take_error() {
  const cuda::DeviceScope scope(device_);
  cuda::device_synchronize();
  int32_t value = 0;
  cuda::memcpy_dtoh(&value, scratch_->error.data(), 4);
  const int32_t zero = 0;
  cuda::memcpy_htod(scratch_->error.data(), &zero, 4);
  return static_cast<DecodeError>(value);
}

}  // namespace flare::model
