// flare::model (issue 22) for python/flare/models.py: Llama configs as dicts, the RoPE table,
// the decode schedule, and LlamaDecoder over torch tensors (the Python object keeps them alive).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "flare/core/error.h"
#include "flare/model/int4_weights.h"
#include "flare/model/llama_config.h"
#include "flare/model/llama_decoder.h"
#include "object_view.h"

namespace flare::python {
namespace {

using model::LlamaConfig;

nb::dict config_dict(const LlamaConfig& c) {
  nb::dict d;
  d["name"] = c.name;
  d["num_layers"] = c.num_layers;
  d["hidden"] = c.hidden;
  d["intermediate"] = c.intermediate;
  d["heads"] = c.heads;
  d["kv_heads"] = c.kv_heads;
  d["head_dim"] = c.head_dim;
  d["vocab"] = c.vocab;
  d["rope_theta"] = c.rope_theta;
  d["rms_eps"] = c.rms_eps;
  d["tie_embeddings"] = c.tie_embeddings;
  d["weight_format"] = model::weight_format_name(c.weight_format);
  if (c.rope_scaling.enabled) {
    nb::dict s;
    s["factor"] = c.rope_scaling.factor;
    s["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    s["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    s["original_max_position"] = c.rope_scaling.original_max_position;
    d["rope_scaling"] = s;
  } else {
    d["rope_scaling"] = nb::none();
  }
  return d;
}

template <class T>
T field(const nb::dict& d, const char* key) {
  FLARE_CHECK(d.contains(key), ErrorCode::kInvalidArgument, "LlamaConfig: missing field '", key,
              "'");
  return nb::cast<T>(d[key]);
}

LlamaConfig config_of(const nb::dict& d) {
  LlamaConfig c;
  c.name = field<std::string>(d, "name");
  c.num_layers = field<int>(d, "num_layers");
  c.hidden = field<int>(d, "hidden");
  c.intermediate = field<int>(d, "intermediate");
  c.heads = field<int>(d, "heads");
  c.kv_heads = field<int>(d, "kv_heads");
  c.head_dim = field<int>(d, "head_dim");
  c.vocab = field<int>(d, "vocab");
  c.rope_theta = field<double>(d, "rope_theta");
  c.rms_eps = field<double>(d, "rms_eps");
  c.tie_embeddings = field<bool>(d, "tie_embeddings");
  if (d.contains("weight_format"))
    c.weight_format = model::parse_weight_format(nb::cast<std::string>(d["weight_format"]));
  if (d.contains("rope_scaling") && !d["rope_scaling"].is_none()) {
    const nb::dict s = nb::cast<nb::dict>(d["rope_scaling"]);
    c.rope_scaling.enabled = true;
    c.rope_scaling.factor = field<double>(s, "factor");
    c.rope_scaling.low_freq_factor = field<double>(s, "low_freq_factor");
    c.rope_scaling.high_freq_factor = field<double>(s, "high_freq_factor");
    c.rope_scaling.original_max_position = field<int>(s, "original_max_position");
  }
  return c;
}

nb::dict schedule_dict(const model::DecodeSchedule& s) {
  nb::dict d;
  d["num_ctas"] = s.num_ctas;
  d["stages"] = s.stages;
  d["shared_bytes"] = s.shared_bytes;
  d["attention_splits"] = s.attention_splits;
  d["activation_rows"] = s.activation_rows;
  d["activation_cols"] = s.activation_cols;
  nb::list ops;
  for (const model::OperatorShare& o : s.operators) {
    nb::dict op;
    op["name"] = o.name;
    op["blocks"] = o.blocks;
    op["chunks_per_block"] = o.chunks_per_block;
    op["chunk_cols"] = o.chunk_cols;
    op["max_blocks_per_cta"] = o.max_blocks_per_cta;
    op["min_blocks_per_cta"] = o.min_blocks_per_cta;
    ops.append(op);
  }
  d["operators"] = ops;
  d["chunks_per_cta"] = s.chunks_per_cta;
  return d;
}

// weights: embed_tokens, norm, lm_head, then per layer q, k, v, o, gate, up, down (bf16, or
// 4-bit codes), input_layernorm, post_attention_layernorm (9 a layer); scales: for 4-bit
// weights, the 7 projections' scales of each layer in the same order (else empty).
void construct(model::LlamaDecoder* self, const nb::dict& config, const nb::list& weights,
               const nb::list& scales, const nb::list& k_caches, const nb::list& v_caches) {
  const LlamaConfig c = config_of(config);
  model::validate(c);
  const size_t expected = 3 + 9 * static_cast<size_t>(c.num_layers);
  FLARE_CHECK(nb::len(weights) == expected, ErrorCode::kInvalidArgument, "LlamaDecoder: ", expected,
              " weight tensors expected, got ", nb::len(weights));
  const bool int4 = c.weight_format == model::WeightFormat::kInt4;
  const size_t expected_scales = int4 ? 7 * static_cast<size_t>(c.num_layers) : 0;
  FLARE_CHECK(nb::len(scales) == expected_scales, ErrorCode::kInvalidArgument,
              "LlamaDecoder: ", expected_scales, " scale tensors expected for ",
              model::weight_format_name(c.weight_format), " weights, got ", nb::len(scales));
  model::LlamaWeights w;
  w.embed_tokens = object_view(weights[0], "embed_tokens");
  w.norm = object_view(weights[1], "norm");
  w.lm_head = object_view(weights[2], "lm_head");
  for (int l = 0; l < c.num_layers; ++l) {
    const size_t at = 3 + 9 * static_cast<size_t>(l);
    model::LlamaLayerTensors t;
    size_t i = 0;
    for (const model::ProjectionSlot& slot : model::projection_slots(c, t)) {
      *slot.weight = object_view(weights[at + i], "layer weight");
      if (int4) *slot.scales = object_view(scales[7 * static_cast<size_t>(l) + i], "weight scales");
      ++i;
    }
    t.input_layernorm = object_view(weights[at + 7], "input_layernorm");
    t.post_attention_layernorm = object_view(weights[at + 8], "post_attention_layernorm");
    w.layers.push_back(t);
  }
  model::LlamaKvCache cache;
  for (size_t l = 0; l < nb::len(k_caches); ++l)
    cache.k.push_back(object_view(k_caches[l], "k_cache"));
  for (size_t l = 0; l < nb::len(v_caches); ++l)
    cache.v.push_back(object_view(v_caches[l], "v_cache"));
  nb::gil_scoped_release release;  // compiling the kernel can take seconds
  new (self) model::LlamaDecoder(c, std::move(w), std::move(cache));
}

}  // namespace

void bind_model(nb::module_& m) {
  m.def(
      "quantize_int4",
      [](nb::bytes weight, int64_t rows, int64_t cols) {
        FLARE_CHECK(static_cast<int64_t>(weight.size()) == rows * cols * 4,
                    ErrorCode::kInvalidArgument, "quantize_int4: ", rows * cols * 4,
                    " bytes of float32 expected, got ", weight.size());
        const model::Int4Weight q =
            model::quantize_int4(reinterpret_cast<const float*>(weight.c_str()), rows, cols);
        return nb::make_tuple(
            nb::bytes(reinterpret_cast<const char*>(q.codes.data()), q.codes.size()),
            nb::bytes(reinterpret_cast<const char*>(q.scales.data()), q.scales.size() * 2));
      },
      nb::arg("weight"), nb::arg("rows"), nb::arg("cols"),
      "The C++ reference of the 4-bit format (flare/model/int4_weights.h): float32 bytes in, "
      "(codes uint8, scales bf16) bytes out.");
  m.def(
      "llama_preset",
      [](const std::string& name) { return config_dict(model::llama_preset(name)); },
      nb::arg("name"), "A named Llama shape as a dict (flare/model/llama_config.h).");
  m.def("llama_preset_names", &model::llama_preset_names);
  m.def(
      "llama_step_weight_bytes", [](const nb::dict& d) { return config_of(d).step_weight_bytes(); },
      nb::arg("config"), "Bytes of weights a decode step reads (flare/model/llama_config.h).");
  m.def(
      "llama_validate", [](const nb::dict& d) { model::validate(config_of(d)); },
      nb::arg("config"));
  m.def(
      "llama_rope_inv_freq", [](const nb::dict& d) { return model::rope_inv_freq(config_of(d)); },
      nb::arg("config"), "inv_freq [head_dim / 2] with Llama 3's scaling (float32 values).");
  m.def(
      "llama_decode_schedule",
      [](const nb::dict& d, int batch, int num_ctas, int max_shared_bytes) {
        return schedule_dict(
            model::build_decode_schedule(config_of(d), batch, num_ctas, max_shared_bytes));
      },
      nb::arg("config"), nb::arg("batch"), nb::arg("num_ctas"), nb::arg("max_shared_bytes"));
  nb::class_<model::LlamaDecoder>(m, "LlamaDecoder", "flare::model::LlamaDecoder (internal).")
      .def("__init__", &construct, nb::arg("config"), nb::arg("weights"), nb::arg("scales"),
           nb::arg("k_caches"), nb::arg("v_caches"))
      .def(
          "step",
          [](model::LlamaDecoder& d, nb::handle tokens, nb::handle positions, nb::handle kv_indptr,
             nb::handle kv_indices, nb::handle next_tokens, nb::handle logits, float temperature,
             int top_k, float top_p, uint64_t seed) {
            d.step(object_view(tokens, "tokens"), object_view(positions, "positions"),
                   object_view(kv_indptr, "kv_indptr"), object_view(kv_indices, "kv_indices"),
                   object_view(next_tokens, "next_tokens"), object_view(logits, "logits"),
                   reinterpret_cast<cuda::Stream>(torch_current_stream(d.device())),
                   model::SamplingParams{temperature, top_k, top_p, seed});
          },
          nb::arg("tokens"), nb::arg("positions"), nb::arg("kv_indptr"), nb::arg("kv_indices"),
          nb::arg("next_tokens"), nb::arg("logits"), nb::arg("temperature") = 0.f,
          nb::arg("top_k") = 0, nb::arg("top_p") = 1.f, nb::arg("seed") = 0)
      .def(
          "generate",
          [](model::LlamaDecoder& d, nb::handle tokens, nb::handle positions, nb::handle kv_indptr,
             nb::handle kv_indices, int num_steps, nb::handle step_tokens, nb::handle logits,
             float temperature, int top_k, float top_p, uint64_t seed) {
            d.generate(object_view(tokens, "tokens"), object_view(positions, "positions"),
                       object_view(kv_indptr, "kv_indptr"), object_view(kv_indices, "kv_indices"),
                       num_steps, object_view(step_tokens, "step_tokens"),
                       object_view(logits, "logits"),
                       reinterpret_cast<cuda::Stream>(torch_current_stream(d.device())),
                       model::SamplingParams{temperature, top_k, top_p, seed});
          },
          nb::arg("tokens"), nb::arg("positions"), nb::arg("kv_indptr"), nb::arg("kv_indices"),
          nb::arg("num_steps"), nb::arg("step_tokens"), nb::arg("logits"),
          nb::arg("temperature") = 0.f, nb::arg("top_k") = 0, nb::arg("top_p") = 1.f,
          nb::arg("seed") = 0)
      .def("take_error", [](model::LlamaDecoder& d) { return static_cast<int>(d.take_error()); })
      .def(
          "prepare",
          [](model::LlamaDecoder& d, int batch) {
            nb::gil_scoped_release release;
            d.prepare(batch);
          },
          nb::arg("batch"))
      .def(
          "set_trace",
          [](model::LlamaDecoder& d, nb::handle trace) {
            d.set_trace(trace.is_none() ? TensorView{} : object_view(trace, "trace"));
          },
          nb::arg("trace").none(),
          "Profiling: int64 [num_ctas, trace_events] CUDA tensor, or None.")
      .def_prop_ro("trace_events", &model::LlamaDecoder::trace_events)
      .def_prop_ro("num_ctas", &model::LlamaDecoder::num_ctas)
      .def(
          "schedule",
          [](const model::LlamaDecoder& d, int batch) { return schedule_dict(d.schedule(batch)); },
          nb::arg("batch"))
      .def_prop_ro("device", &model::LlamaDecoder::device);
}

}  // namespace flare::python
