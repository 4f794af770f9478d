// Llama-family model shapes for the whole-model decode megakernel (issue 22): the presets the
// issue names, validation that names the offending field, the RoPE frequency table with
// Llama-3.1 scaling, and the partition of the weights over CTAs (the schedule the kernel walks,
// computed by the same functions as kernels/llama_decode_params.cuh).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace flare::model {

// Llama 3 RoPE scaling ("rope_type": "llama3" in Hugging Face's config).
struct RopeScaling {
  bool enabled = false;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position = 8192;
};

// The layers' projection weights: bf16, or 4-bit codes with bf16 scales per 128 columns
// (flare/model/int4_weights.h). The embedding, the norms and the LM head are bf16 in both.
enum class WeightFormat { kBf16, kInt4 };
const char* weight_format_name(WeightFormat format);  // "bf16", "int4"
// Throws kInvalidArgument naming the accepted names for another.
WeightFormat parse_weight_format(const std::string& name);

struct LlamaConfig {
  std::string name;
  int num_layers = 0;
  int hidden = 0;
  int intermediate = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 128;
  int vocab = 0;
  double rope_theta = 500000.0;
  RopeScaling rope_scaling;
  double rms_eps = 1e-5;
  bool tie_embeddings = false;
  WeightFormat weight_format = WeightFormat::kBf16;

  int64_t parameter_count() const;  // every weight, the embedding once when tied
  int weight_bits() const { return weight_format == WeightFormat::kInt4 ? 4 : 16; }
  // Bytes of weights one decode step reads: the layers' projections (codes and scales when
  // 4-bit), the norms and the LM head (not the embedding, of which a step reads one row).
  int64_t step_weight_bytes() const;
};

// "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b" (Hugging Face's configs).
// Throws kInvalidArgument listing the names for another.
LlamaConfig llama_preset(const std::string& name);
std::vector<std::string> llama_preset_names();

// Throws kInvalidArgument naming the field for a shape the megakernel does not take: positive
// sizes; head_dim 64 or 128; heads a multiple of kv_heads with at most 8 per group; hidden,
// intermediate and heads * head_dim multiples of 64 (whole 128-byte copies); vocab a multiple
// of 8; rms_eps > 0; for 4-bit weights, hidden, intermediate and heads * head_dim multiples of
// 1024 (each 4-bit chunk's scales are whole 16-byte copies).
void validate(const LlamaConfig& config);

// inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2, with Llama 3's scaling when
// enabled (long wavelengths divided by the factor, a smooth blend between the two bounds),
// computed in double and rounded to float.
std::vector<float> rope_inv_freq(const LlamaConfig& config);

// The decode step's work split over `num_ctas` CTAs (one per SM): per operator, the number of
// 8-row blocks, chunks a block, and the largest and smallest share of a CTA; the KV splits of
// attention; the activation area (each stage's inputs in shared memory for a batch capacity of
// the next power of two, when that takes at most kMaxActivationShared bytes; else none: the
// products read them from L2); the pipeline depth the rest of a device's per-block limit allows.
struct OperatorShare {
  std::string name;
  int blocks = 0;
  int chunks_per_block = 0;  // chunks of one 8-row block (gate/up: of each half)
  int chunk_cols = 0;
  int max_blocks_per_cta = 0;
  int min_blocks_per_cta = 0;
};
inline constexpr int kMaxActivationShared = 120 * 1024;
inline constexpr int kMaxDecodeBatch = 8;  // requests per step (the kernel's mma m rows used)
struct DecodeSchedule {
  int num_ctas = 0;
  int stages = 0;
  int shared_bytes = 0;
  int activation_rows = 0;  // the batch capacity of the shared activation area (0: none)
  int activation_cols = 0;  // its row width: the widest product input
  int attention_splits = 0;
  std::vector<OperatorShare> operators;  // qkv, o, gate_up, down, lm_head
  // [cta] -> the stage chunks the CTA streams per step, in order (the producer's sequence).
  std::vector<int64_t> chunks_per_cta;
};
// Throws kUnsupported when even 2 stages do not fit in `max_shared_bytes`.
DecodeSchedule build_decode_schedule(const LlamaConfig& config, int batch, int num_ctas,
                                     int max_shared_bytes, int max_stages = 12);

}  // namespace flare::model
