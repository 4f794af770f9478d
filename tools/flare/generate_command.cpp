// `flare generate`: greedy decoding of a Llama preset with random weights on the whole-model
// decode megakernel (issue 22; flare/model/llama_decoder.h), printing tokens/s.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flare/core/dtype.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "flare/model/int4_weights.h"
#include "flare/model/llama_decoder.h"
#include "tools/flare/args.h"
#include "tools/flare/commands.h"
#include "tools/flare/device_tensor.h"
#include "tools/flare/progress.h"

namespace flare::cli {
namespace {

constexpr const char* kHelp =
    "usage: flare generate --model NAME --random-weights [--prompt-len N] [--new-tokens N]\n"
    "                      [--batch N] [--page-size N] [--weights bf16|int4] [--seed N]\n"
    "                      [--temperature T [--top-k K] [--top-p P]] [--gpu-loop]\n"
    "                      [--device cuda[:N]]\n\n"
    "Decoding of a Llama model with the whole-model decode megakernel: one persistent kernel a\n"
    "step, greedy or sampled in the same launch (flare::model::LlamaDecoder; needs an sm_90\n"
    "GPU).\n\n"
    "  --model NAME       llama-3.1-8b, llama-3.1-70b, llama-3.2-1b or llama-3.2-3b (shapes of\n"
    "                     Hugging Face's configs)\n"
    "  --random-weights   random weights of the exact shapes (required: checkpoints load\n"
    "                     through the Python API, flare.models.LlamaDecoder)\n"
    "  --prompt-len N     tokens already in each request's cache (default 1024; their K/V are\n"
    "                     random: every cached row is read, the values do not change the time)\n"
    "  --new-tokens N     tokens generated per request (default 128)\n"
    "  --batch N          requests, 1 to 8 (default 1)\n"
    "  --page-size N      KV-cache page size (default 16)\n"
    "  --weights FORMAT   bf16 (default), or int4: the layers' projections as 4-bit codes with\n"
    "                     a bf16 scale per 128 columns (the embedding and LM head stay bf16)\n"
    "  --seed N           random seed of the weights, the first tokens and the sampler's draws\n"
    "                     (default 0)\n"
    "  --temperature T    0: greedy (default); > 0: sample from softmax(logits / T)\n"
    "  --top-k K          with --temperature: only the K most likely tokens (default 0: all)\n"
    "  --top-p P          with --temperature: only the most likely tokens of mass P (default 1)\n"
    "  --gpu-loop         all new tokens in one launch (LlamaDecoder::generate: the GPU-side\n"
    "                     loop) instead of one step() call a token\n"
    "  --device cuda[:N]  the GPU (default cuda)\n\n"
    "Prints the tokens/s of all requests together (host loop or GPU loop), the\n"
    "time of a step and each request's last generated token. Progress goes to stderr.\n";

// Random 16-bit values for the weights: a pool of bf16 normal samples (std 0.02; norms near
// 1), or of uniform random bits (4-bit codes), whose slices, at rotating offsets, fill every
// tensor.
class RandomPool {
 public:
  RandomPool(uint64_t seed, float mean, float stddev) : data_(kValues) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(mean, stddev);
    for (uint16_t& v : data_) v = float_to_bf16_bits(normal(rng));
  }
  explicit RandomPool(uint64_t seed) : data_(kValues) {  // uniform bits
    std::mt19937_64 rng(seed);
    for (uint16_t& v : data_) v = static_cast<uint16_t>(rng());
  }
  // Fills `count` 16-bit values at `device_ptr` from the pool (synchronous copies).
  void fill(void* device_ptr, int64_t count) {
    auto* dst = static_cast<uint16_t*>(device_ptr);
    for (int64_t done = 0; done < count;) {
      const int64_t n = std::min<int64_t>(count - done, kValues - offset_);
      cuda::memcpy_htod(dst + done, data_.data() + offset_, static_cast<size_t>(n) * 2);
      done += n;
      offset_ = (offset_ + n + 4099) % (kValues / 2);  // another slice for the next tensor
    }
  }

 private:
  static constexpr int64_t kValues = int64_t{1} << 25;  // 64 MiB of bf16
  std::vector<uint16_t> data_;
  int64_t offset_ = 0;
};

struct DeviceWeights {
  std::vector<cuda::DeviceBuffer> buffers;
  model::LlamaWeights weights;
  model::LlamaKvCache cache;
};

TensorView bf16_view(cuda::DeviceBuffer& buffer, std::vector<int64_t> shape, int device) {
  return TensorView::contiguous(buffer.data(), DType::kBF16, std::move(shape),
                                Device::cuda(device));
}

DeviceWeights make_random_model(const model::LlamaConfig& c, int num_pages, int page_size,
                                uint64_t seed, int device, Progress& progress) {
  RandomPool weights(seed, 0.f, 0.02f), norms(seed + 1, 1.f, 0.05f), kv(seed + 2, 0.f, 1.f);
  // 4-bit only: uniform codes (std of q - 8: 4.61) and scales spread 20% around 0.02 / 4.61.
  std::optional<RandomPool> codes, scales;
  if (c.weight_format == model::WeightFormat::kInt4) {
    codes.emplace(seed + 3);
    scales.emplace(seed + 4, 0.02f / 4.61f, 0.2f * 0.02f / 4.61f);
  }
  DeviceWeights m;
  m.buffers.reserve(static_cast<size_t>(3 + 18 * c.num_layers));
  const auto tensor = [&](std::vector<int64_t> shape, RandomPool& pool) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    m.buffers.emplace_back(static_cast<size_t>(count) * 2);
    pool.fill(m.buffers.back().data(), count);
    return bf16_view(m.buffers.back(), std::move(shape), device);
  };
  // A projection [rows, cols]: bf16, or uint8 codes [rows, cols / 2] and bf16 scales.
  const auto projection = [&](int64_t rows, int64_t cols, TensorView& weight, TensorView& scale) {
    if (c.weight_format == model::WeightFormat::kBf16) {
      weight = tensor({rows, cols}, weights);
      return;
    }
    tensor({rows, cols / 4}, *codes);  // filled as 16-bit pairs of code bytes
    weight = TensorView::contiguous(m.buffers.back().data(), DType::kU8, {rows, cols / 2},
                                    Device::cuda(device));
    scale = tensor({rows, cols / model::kInt4GroupSize}, *scales);
  };
  const int64_t h = c.hidden;
  progress.step("random weights: embedding");
  m.weights.embed_tokens = tensor({c.vocab, h}, weights);
  m.weights.norm = tensor({h}, norms);
  m.weights.lm_head = c.tie_embeddings ? m.weights.embed_tokens : tensor({c.vocab, h}, weights);
  for (int l = 0; l < c.num_layers; ++l) {
    progress.bar("random weights and KV", l, c.num_layers);
    model::LlamaLayerTensors t;
    for (const model::ProjectionSlot& slot : model::projection_slots(c, t))
      projection(slot.rows, slot.cols, *slot.weight, *slot.scales);
    t.input_layernorm = tensor({h}, norms);
    t.post_attention_layernorm = tensor({h}, norms);
    m.weights.layers.push_back(t);
    m.cache.k.push_back(tensor({num_pages, page_size, c.kv_heads, c.head_dim}, kv));
    m.cache.v.push_back(tensor({num_pages, page_size, c.kv_heads, c.head_dim}, kv));
  }
  return m;
}

DeviceTensor int32_device(const std::vector<int32_t>& values, int device) {
  HostTensor host(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  return upload(host.view(), device, "int32 array");
}

}  // namespace

int run_generate(int argc, char** argv) {
  const Args args("generate", argc, argv,
                  {{"model", true},
                   {"random-weights", false},
                   {"prompt-len", true},
                   {"new-tokens", true},
                   {"batch", true},
                   {"page-size", true},
                   {"seed", true},
                   {"temperature", true},
                   {"top-k", true},
                   {"top-p", true},
                   {"gpu-loop", false},
                   {"weights", true},
                   {"device", true}});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  const std::string model_name = args.required("model");
  if (!args.has("random-weights")) {
    args.usage_error(
        "--random-weights is required: this command generates from random weights "
        "of the model's shapes (checkpoints load through flare.models.LlamaDecoder)");
  }
  const int prompt = static_cast<int>(args.integer_or("prompt-len", 1024, 0));
  const int new_tokens = static_cast<int>(args.integer_or("new-tokens", 128, 1));
  const int batch = static_cast<int>(args.integer_or("batch", 1, 1));
  const int page_size = static_cast<int>(args.integer_or("page-size", 16, 1));
  const auto seed = static_cast<uint64_t>(args.integer_or("seed", 0, 0));
  const Device device = args.device_or("device", "cuda");
  model::SamplingParams sampling;
  sampling.temperature = static_cast<float>(args.number_or("temperature", 0.0));
  sampling.top_k = static_cast<int>(args.integer_or("top-k", 0, 0));
  sampling.top_p = static_cast<float>(args.number_or("top-p", 1.0));
  sampling.seed = seed;
  if (sampling.temperature != 0.f && !(std::isfinite(sampling.temperature) &&
                                       sampling.temperature >= model::kMinSamplingTemperature)) {
    args.usage_error("--temperature must be 0 (greedy) or finite and >= 1e-05, got " +
                     std::string(*args.text("temperature")));
  }
  if (!(sampling.top_p > 0.f && sampling.top_p <= 1.f)) {
    args.usage_error("--top-p must be in (0, 1], got " + std::string(*args.text("top-p")));
  }
  if (sampling.temperature == 0.f && (args.has("top-k") || args.has("top-p"))) {
    args.usage_error("--top-k and --top-p filter a sample: they need --temperature > 0");
  }
  if (batch > 8) args.usage_error("--batch must be at most 8, got " + std::to_string(batch));
  if (!device.is_cuda())
    args.usage_error("--device must be a CUDA device (the megakernel is GPU only)");
  model::LlamaConfig config = model::llama_preset(model_name);
  config.weight_format =
      model::parse_weight_format(args.choice_or("weights", {"bf16", "int4"}, "bf16"));
  model::validate(config);

  use_cuda_device(device.index);
  const cuda::DeviceProperties props = cuda::device_properties(device.index);
  const int pages_per_request = (prompt + new_tokens + page_size) / page_size;
  const int num_pages = batch * pages_per_request;
  const int64_t kv_bytes = int64_t{2} * config.num_layers * num_pages * page_size *
                           config.kv_heads * config.head_dim * 2;
  const char* format = model::weight_format_name(config.weight_format);
  const int64_t weight_bytes =
      config.step_weight_bytes() +
      (config.tie_embeddings ? 0 : int64_t{config.vocab} * config.hidden * 2);
  FLARE_CHECK(weight_bytes + kv_bytes < props.global_bytes, ErrorCode::kUnsupported,
              "flare generate: ", model_name, " needs ", weight_bytes / 1e9, " GB of ", format,
              " weights and ", kv_bytes / 1e9, " GB of KV cache; ", cuda_device_label(device.index),
              " has ", props.global_bytes / 1e9, " GB");

  Progress progress("generate");
  DeviceWeights m = make_random_model(config, num_pages, page_size, seed, device.index, progress);
  progress.step("compiling the kernel");
  model::LlamaDecoder decoder(config, m.weights, m.cache);
  decoder.prepare(batch);  // the batch's kernel compiled before the timed loop

  std::vector<int32_t> indptr(static_cast<size_t>(batch) + 1),
      indices(static_cast<size_t>(num_pages));
  for (int b = 0; b <= batch; ++b) indptr[static_cast<size_t>(b)] = b * pages_per_request;
  for (int i = 0; i < num_pages; ++i) indices[static_cast<size_t>(i)] = i;
  std::vector<int32_t> first(static_cast<size_t>(batch));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (int32_t& t : first) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(config.vocab));
  const DeviceTensor d_indptr = int32_device(indptr, device.index);
  const DeviceTensor d_indices = int32_device(indices, device.index);
  // Tokens ping-pong between two buffers: step i reads one and writes its next tokens into
  // the other, which step i + 1 reads. Positions come from one pinned table, a row a step.
  DeviceTensor tokens[2] = {int32_device(first, device.index), int32_device(first, device.index)};
  cuda::PinnedBuffer positions_host(static_cast<size_t>(new_tokens + 1) * batch * 4);
  auto* pos = reinterpret_cast<int32_t*>(positions_host.data());
  for (int s = 0; s <= new_tokens; ++s) {
    for (int b = 0; b < batch; ++b) pos[s * batch + b] = prompt + s;
  }
  const DeviceTensor positions =
      int32_device(std::vector<int32_t>(static_cast<size_t>(batch), prompt), device.index);
  const DeviceTensor logits = allocate_poisoned(DType::kF32, {batch, config.vocab}, device.index);
  cuda::Stream stream = nullptr;

  const auto step = [&](int s) {
    cuda::memcpy_htod_async(positions.buffer.data(), pos + s * batch,
                            static_cast<size_t>(batch) * 4, stream);
    decoder.step(tokens[s % 2].view, positions.view, d_indptr.view, d_indices.view,
                 tokens[(s + 1) % 2].view, logits.view, stream, sampling);
  };
  const bool gpu_loop = args.has("gpu-loop");
  const DeviceTensor all_tokens =
      allocate_poisoned(DType::kI32, {gpu_loop ? new_tokens : 1, batch}, device.index);
  const auto loop = [&]() {
    decoder.generate(tokens[0].view, positions.view, d_indptr.view, d_indices.view, new_tokens,
                     all_tokens.view, logits.view, stream, sampling);
  };
  if (gpu_loop) {  // compiles the generate() kernel and warms up outside the timed launch
    progress.step("compiling the GPU-loop kernel");
    loop();
    cuda::stream_synchronize(stream);
  }
  const auto start = std::chrono::steady_clock::now();
  if (gpu_loop) {
    loop();
  } else {
    for (int s = 0; s < new_tokens; ++s) {
      step(s);
      if (s % 16 == 15 || s + 1 == new_tokens) {  // the progress line follows the GPU
        cuda::stream_synchronize(stream);
        progress.bar("decoding", s + 1, new_tokens);
      }
    }
  }
  cuda::stream_synchronize(stream);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.finish();
  const model::DecodeError error = decoder.take_error();
  FLARE_CHECK(error == model::DecodeError::kNone, ErrorCode::kInternal,
              "flare generate: the decode step reported error ", static_cast<int>(error));

  std::printf("%s (random %s weights, %.2f GB), batch %d, prompt %d, %d new tokens on %s\n",
              model_name.c_str(), format, weight_bytes / 1e9, batch, prompt, new_tokens,
              cuda_device_label(device.index).c_str());
  if (sampling.temperature > 0.f) {
    std::printf("sampled: temperature %g, top-k %d, top-p %g, seed %llu\n", sampling.temperature,
                sampling.top_k, sampling.top_p, static_cast<unsigned long long>(seed));
  } else {
    std::printf("greedy\n");
  }
  const double step_bytes =
      static_cast<double>(config.step_weight_bytes()) +
      kv_bytes / double(num_pages * page_size) * batch * (prompt + new_tokens / 2.0);
  std::printf("%.1f tokens/s (%.3f ms a step, %s; %.2f TB/s of weights and KV)\n",
              batch * new_tokens / seconds, seconds * 1e3 / new_tokens,
              gpu_loop ? "GPU loop, one launch" : "host loop",
              step_bytes * new_tokens / seconds / 1e12);
  std::vector<int32_t> last(static_cast<size_t>(batch));
  cuda::memcpy_dtoh(last.data(),
                    gpu_loop ? static_cast<const int32_t*>(all_tokens.buffer.data()) +
                                   static_cast<size_t>(new_tokens - 1) * batch
                             : tokens[new_tokens % 2].buffer.data(),
                    last.size() * 4);
  std::printf("last generated tokens:");
  for (int32_t t : last) std::printf(" %d", t);
  std::printf("\n");
  return 0;
}

}  // namespace flare::cli
