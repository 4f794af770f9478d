// Llama model shapes, validation, RoPE frequencies and the decode schedule
// (flare/model/llama_config.h).
#include "flare/model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "flare/core/error.h"
#include "flare/model/int4_weights.h"
#include "kernels/llama_decode_params.cuh"

namespace flare::model {
namespace {

LlamaConfig make(const char* name, int layers, int hidden, int intermediate, int heads,
                 int kv_heads, int head_dim, double scaling_factor, bool tied) {
  LlamaConfig c;
  c.name = name;
  c.num_layers = layers;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab = 128256;
  c.rope_theta = 500000.0;
  c.rope_scaling.enabled = true;
  c.rope_scaling.factor = scaling_factor;
  c.rms_eps = 1e-5;
  c.tie_embeddings = tied;
  return c;
}

const std::vector<LlamaConfig>& presets() {
  static const std::vector<LlamaConfig> all = {
      make("llama-3.1-8b", 32, 4096, 14336, 32, 8, 128, 8.0, false),
      make("llama-3.1-70b", 80, 8192, 28672, 64, 8, 128, 8.0, false),
      make("llama-3.2-1b", 16, 2048, 8192, 32, 8, 64, 32.0, true),
      make("llama-3.2-3b", 28, 3072, 8192, 24, 8, 128, 32.0, true),
  };
  return all;
}

}  // namespace

int64_t LlamaConfig::parameter_count() const {
  const int64_t h = hidden, d = head_dim;
  const int64_t per_layer =
      h * (heads + 2 * kv_heads) * d + heads * d * h + 3 * h * intermediate + 2 * h;
  return num_layers * per_layer + int64_t{vocab} * h * (tie_embeddings ? 1 : 2) + h;
}

const char* weight_format_name(WeightFormat format) {
  return format == WeightFormat::kInt4 ? "int4" : "bf16";
}

WeightFormat parse_weight_format(const std::string& name) {
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "int4") return WeightFormat::kInt4;
  fail(ErrorCode::kInvalidArgument, "weight format must be 'bf16' or 'int4', got '", name, "'");
}

int64_t LlamaConfig::step_weight_bytes() const {
  const int64_t h = hidden, qd = int64_t{heads} * head_dim, kvd = int64_t{kv_heads} * head_dim;
  const auto projection = [&](int64_t rows, int64_t cols) {
    return weight_format == WeightFormat::kInt4 ? int4_bytes(rows, cols) : rows * cols * 2;
  };
  const int64_t per_layer = projection(qd + 2 * kvd, h) + projection(h, qd) +
                            2 * projection(intermediate, h) + projection(h, intermediate) + 4 * h;
  return num_layers * per_layer + int64_t{vocab} * h * 2 + 2 * h;
}

LlamaConfig llama_preset(const std::string& name) {
  for (const LlamaConfig& c : presets()) {
    if (c.name == name) return c;
  }
  std::string names;
  for (const LlamaConfig& c : presets()) names += (names.empty() ? "" : ", ") + c.name;
  fail(ErrorCode::kInvalidArgument, "llama_preset: unknown model '", name, "'; the presets are ",
       names);
}

std::vector<std::string> llama_preset_names() {
  std::vector<std::string> names;
  for (const LlamaConfig& c : presets()) names.push_back(c.name);
  return names;
}

void validate(const LlamaConfig& c) {
  const auto positive = [&](int v, const char* field) {
    FLARE_CHECK(v > 0, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name, "': ", field,
                " must be positive, got ", v);
  };
  positive(c.num_layers, "num_layers");
  positive(c.hidden, "hidden");
  positive(c.intermediate, "intermediate");
  positive(c.heads, "heads");
  positive(c.kv_heads, "kv_heads");
  positive(c.vocab, "vocab");
  FLARE_CHECK(c.head_dim == 64 || c.head_dim == 128, ErrorCode::kInvalidArgument, "LlamaConfig '",
              c.name, "': head_dim must be 64 or 128, got ", c.head_dim);
  FLARE_CHECK(
      c.heads % c.kv_heads == 0 && c.heads / c.kv_heads <= 8, ErrorCode::kInvalidArgument,
      "LlamaConfig '", c.name,
      "': heads must be a multiple of kv_heads with at most 8 query heads per KV head, got ",
      c.heads, " heads and ", c.kv_heads, " kv_heads");
  const auto multiple_of_64 = [&](int64_t v, const char* field) {
    FLARE_CHECK(v % 64 == 0, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name, "': ", field,
                " must be a multiple of 64 (weight rows are copied in 128-byte units), got ", v);
  };
  multiple_of_64(c.hidden, "hidden");
  multiple_of_64(c.intermediate, "intermediate");
  multiple_of_64(int64_t{c.heads} * c.head_dim, "heads * head_dim");
  if (c.weight_format == WeightFormat::kInt4) {
    const auto multiple_of_1024 = [&](int64_t v, const char* field) {
      FLARE_CHECK(v % 1024 == 0, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name, "': ", field,
                  " must be a multiple of 1024 for 4-bit weights (each chunk's scales are whole "
                  "16-byte copies), got ",
                  v);
    };
    multiple_of_1024(c.hidden, "hidden");
    multiple_of_1024(c.intermediate, "intermediate");
    multiple_of_1024(int64_t{c.heads} * c.head_dim, "heads * head_dim");
  }
  FLARE_CHECK(c.vocab % 8 == 0, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name,
              "': vocab must be a multiple of 8 (LM-head blocks of 8 rows), got ", c.vocab);
  FLARE_CHECK(c.rms_eps > 0, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name,
              "': rms_eps must be positive, got ", c.rms_eps);
  FLARE_CHECK(c.rope_theta > 1, ErrorCode::kInvalidArgument, "LlamaConfig '", c.name,
              "': rope_theta must be greater than 1, got ", c.rope_theta);
  if (c.rope_scaling.enabled) {
    const RopeScaling& s = c.rope_scaling;
    FLARE_CHECK(s.factor >= 1 && s.high_freq_factor > s.low_freq_factor && s.low_freq_factor > 0 &&
                    s.original_max_position > 0,
                ErrorCode::kInvalidArgument, "LlamaConfig '", c.name,
                "': rope_scaling needs factor >= 1, high_freq_factor > low_freq_factor > 0 and "
                "original_max_position > 0, got ",
                s.factor, ", ", s.high_freq_factor, ", ", s.low_freq_factor, ", ",
                s.original_max_position);
  }
}

std::vector<float> rope_inv_freq(const LlamaConfig& c) {
  std::vector<float> out(static_cast<size_t>(c.head_dim / 2));
  const RopeScaling& s = c.rope_scaling;
  const double low_freq_wavelen = s.original_max_position / s.low_freq_factor;
  const double high_freq_wavelen = s.original_max_position / s.high_freq_factor;
  for (int i = 0; i < c.head_dim / 2; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, 2.0 * i / c.head_dim);
    if (s.enabled) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {  // between the bounds: a smooth blend
        const double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                              (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

DecodeSchedule build_decode_schedule(const LlamaConfig& config, int batch, int num_ctas,
                                     int max_shared_bytes, int max_stages) {
  validate(config);
  FLARE_CHECK(batch >= 1 && batch <= llama::kMaxBatch, ErrorCode::kInvalidArgument,
              "build_decode_schedule: batch must be in [1, ", llama::kMaxBatch, "], got ", batch);
  FLARE_CHECK(num_ctas >= 1, ErrorCode::kInvalidArgument,
              "build_decode_schedule: num_ctas must be positive, got ", num_ctas);
  llama::DecodeParams p{};
  p.hidden = config.hidden;
  p.intermediate = config.intermediate;
  p.heads = config.heads;
  p.kv_heads = config.kv_heads;
  p.head_dim = config.head_dim;
  p.vocab = config.vocab;
  const int group = config.heads / config.kv_heads;
  const int bits = config.weight_bits();

  DecodeSchedule s;
  s.num_ctas = num_ctas;
  s.activation_cols =
      std::max({config.hidden, config.heads * config.head_dim, config.intermediate});
  s.activation_rows = 1;
  while (s.activation_rows < batch) s.activation_rows *= 2;
  // Fewer than 4 stages would starve the stream: then the activations stay in L2.
  if (llama::activation_shared_bytes(s.activation_rows, s.activation_cols) > kMaxActivationShared ||
      llama::shared_bytes(4, group, config.head_dim, s.activation_rows, s.activation_cols, bits) >
          max_shared_bytes) {
    s.activation_rows = 0;
  }
  const auto bytes = [&](int stages) {
    return llama::shared_bytes(stages, group, config.head_dim, s.activation_rows, s.activation_cols,
                               bits);
  };
  s.stages = 0;
  for (int stages = std::max(2, max_stages); stages >= 2; --stages) {
    if (bytes(stages) <= max_shared_bytes) {
      s.stages = stages;
      break;
    }
  }
  FLARE_CHECK(s.stages >= 2, ErrorCode::kUnsupported, "LlamaDecoder: the weight pipeline needs ",
              bytes(2), " bytes of shared memory a block (2 stages of ", llama::stage_bytes(bits),
              "), the device allows ", max_shared_bytes);
  s.shared_bytes = bytes(s.stages);
  s.attention_splits = std::max(1, num_ctas / (batch * config.kv_heads));

  static const char* const names[] = {"qkv", "o", "gate_up", "down", "lm_head"};
  s.chunks_per_cta.assign(static_cast<size_t>(num_ctas), 0);
  for (int op = 0; op < llama::kNumOps; ++op) {
    OperatorShare share;
    share.name = names[op];
    share.blocks = llama::op_blocks(p, op);
    const int cols = llama::op_cols(p, op);
    const int op_bits = llama::op_weight_bits(bits, op);
    share.chunks_per_block = llama::op_chunks(cols, op_bits);
    share.chunk_cols = llama::op_chunk_cols(cols, op_bits);
    share.min_blocks_per_cta = share.blocks;
    const int64_t repeats = op == llama::kOpLmHead ? 1 : config.num_layers;
    const int halves = op == llama::kOpGateUp ? 2 : 1;
    for (int cta = 0; cta < num_ctas; ++cta) {
      int begin = 0, end = 0;
      llama::partition_range(share.blocks, num_ctas, cta, begin, end);
      share.max_blocks_per_cta = std::max(share.max_blocks_per_cta, end - begin);
      share.min_blocks_per_cta = std::min(share.min_blocks_per_cta, end - begin);
      s.chunks_per_cta[static_cast<size_t>(cta)] +=
          repeats * (end - begin) * halves * share.chunks_per_block;
    }
    s.operators.push_back(share);
  }
  return s;
}

}  // namespace flare::model
