// apply_rope (flare/api/rope.h): the checks, the CPU reference, and the launch of
// kernels/rope_apply.cuh for CUDA tensors.
#include "flare/api/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "kernels/decode_params.cuh"
#include "kernels/rope_apply.cuh"
#include "src/api/device_checks.h"
#include "src/api/device_variant.h"
#include "src/reference/element_io.h"

namespace flare {

static_assert(kRopeMaxPairs == kRopeApplyMaxPairs, "the kernel's turns table");
static_assert(kCodeF16 == static_cast<int>(DType::kF16) &&
                  kCodeBF16 == static_cast<int>(DType::kBF16),
              "kernel dtype codes are the host's DType values");

namespace {

using api_detail::without_unit_strides;

constexpr auto kInvalid = ErrorCode::kInvalidArgument;
constexpr const char* kWhat = "apply_rope: ";
constexpr int64_t kMaxBlocks = 8192;

// The checked problem: shapes, the rotary dims and the rotation's parameters.
struct Problem {
  int64_t tokens = 0, q_heads = 0, k_heads = 0, head_dim = 0, rotary_dim = 0;
  AttentionParams params;  // kRopeLlama with the options' theta, scale and llama31
};

void check_rows(const TensorView& t, const char* name, const TensorView& like,
                const char* like_name) {
  FLARE_CHECK(t.ndim == 3, kInvalid, kWhat, name,
              " must have rank 3 [nnz, num_heads, head_dim], got ", t.shape_str());
  FLARE_CHECK(t.dtype == like.dtype, kInvalid, kWhat, name, " dtype must be ", like_name, "'s ",
              dtype_name(like.dtype), ", got ", dtype_name(t.dtype));
  FLARE_CHECK(t.device == like.device, kInvalid, kWhat, name, " must be on ", like.device.str(),
              " (the device of ", like_name, "), got ", t.device.str());
  FLARE_CHECK(t.shape[2] <= 1 || t.strides[2] == 1, kInvalid, kWhat, name,
              " must be contiguous in its last dimension, got stride ", t.strides[2]);
}

Problem check_problem(const TensorView& q, const TensorView& k, const TensorView& q_out,
                      const TensorView& k_out, const RopeOptions& options) {
  check_rows(q, "q", q, "q");
  FLARE_CHECK(q.dtype == DType::kF16 || q.dtype == DType::kBF16 ||
                  (q.dtype == DType::kF32 && !q.device.is_cuda()),
              kInvalid, kWhat, "q dtype must be float16 or bfloat16",
              q.device.is_cuda() ? "" : " (or float32 on the CPU)", ", got ", dtype_name(q.dtype));
  check_rows(k, "k", q, "q");
  FLARE_CHECK(k.shape[0] == q.shape[0] && k.shape[2] == q.shape[2], kInvalid, kWhat,
              "k must have q's nnz and head_dim [", q.shape[0], ", num_kv_heads, ", q.shape[2],
              "], got ", k.shape_str());
  check_rows(q_out, "q_out", q, "q");
  check_rows(k_out, "k_out", q, "q");
  FLARE_CHECK(q_out.shape == q.shape, kInvalid, kWhat, "q_out must have q's shape ", q.shape_str(),
              ", got ", q_out.shape_str());
  FLARE_CHECK(k_out.shape == k.shape, kInvalid, kWhat, "k_out must have k's shape ", k.shape_str(),
              ", got ", k_out.shape_str());
  Problem pr;
  pr.tokens = q.shape[0];
  pr.q_heads = q.shape[1];
  pr.k_heads = k.shape[1];
  pr.head_dim = q.shape[2];
  pr.rotary_dim = options.rotary_dim == 0 ? pr.head_dim : options.rotary_dim;
  if (options.cos_sin_cache) {
    const TensorView& table = *options.cos_sin_cache;
    FLARE_CHECK(table.ndim == 2 && table.dtype == DType::kF32 && table.shape[0] >= 1, kInvalid,
                kWhat, "cos_sin_cache must be float32 [max_position >= 1, rotary_dim], got ",
                dtype_name(table.dtype), " ", table.shape_str());
    FLARE_CHECK(table.device == q.device, kInvalid, kWhat, "cos_sin_cache must be on ",
                q.device.str(), " (the device of q), got ", table.device.str());
    FLARE_CHECK(table.shape[1] <= 1 || table.strides[1] == 1, kInvalid, kWhat,
                "cos_sin_cache must be contiguous in its last dimension, got stride ",
                table.strides[1]);
    FLARE_CHECK(options.rotary_dim == 0 || options.rotary_dim == table.shape[1], kInvalid, kWhat,
                "rotary_dim ", options.rotary_dim, " differs from cos_sin_cache's width ",
                table.shape[1]);
    pr.rotary_dim = table.shape[1];
  }
  FLARE_CHECK(pr.rotary_dim > 0 && pr.rotary_dim % 2 == 0 && pr.rotary_dim <= pr.head_dim, kInvalid,
              kWhat, "rotary_dim must be even and in [2, head_dim = ", pr.head_dim, "], got ",
              pr.rotary_dim);
  if (options.cos_sin_cache) return pr;  // the table holds the angles: no theta, scale, llama31
  pr.params.pos_encoding = PosEncoding::kRopeLlama;
  pr.params.rope_theta = options.rope_theta;
  pr.params.rope_scale = options.rope_scale;
  pr.params.rope_llama31 = options.llama31;
  check_rope_params(pr.params, kWhat);
  return pr;
}

void check_index(const TensorView& t, const char* name, const Device& device, int64_t size,
                 const char* layout, bool allow_int64) {
  FLARE_CHECK(t.ndim == 1 && t.shape[0] == size, kInvalid, kWhat, name, " must have shape ", layout,
              " = [", size, "], got ", t.shape_str());
  FLARE_CHECK(t.dtype == DType::kI32 || (allow_int64 && t.dtype == DType::kI64), kInvalid, kWhat,
              name, " dtype must be int32", allow_int64 ? " or int64" : "", ", got ",
              dtype_name(t.dtype));
  FLARE_CHECK(t.device == device, kInvalid, kWhat, name, " must be on ", device.str(),
              " (the device of q), got ", t.device.str());
}

// The positions' form checked against the problem; true for pos_ids.
bool check_positions(const RopePositions& positions, const Problem& pr, const Device& device) {
  const bool by_ids = positions.pos_ids.has_value();
  FLARE_CHECK(by_ids != (positions.indptr.has_value() || positions.offsets.has_value()), kInvalid,
              kWhat, "positions need either pos_ids or indptr and offsets, not both, not neither");
  if (by_ids) {
    check_index(*positions.pos_ids, "pos_ids", device, pr.tokens, "[nnz]", true);
    return true;
  }
  FLARE_CHECK(positions.indptr && positions.offsets, kInvalid, kWhat,
              "indptr and offsets come together");
  const int64_t batch = positions.offsets->ndim == 1 ? positions.offsets->shape[0] : -1;
  check_index(*positions.offsets, "offsets", device, std::max<int64_t>(batch, 0), "[batch]", false);
  check_index(*positions.indptr, "indptr", device, batch + 1, "[batch + 1]", false);
  FLARE_CHECK(batch >= 1 || pr.tokens == 0, kInvalid, kWhat,
              "indptr and offsets describe no request but q has ", pr.tokens, " tokens");
  return false;
}

int64_t element_at(const TensorView& t, int64_t i) {
  const int64_t at = i * t.strides[0];
  return t.dtype == DType::kI64 ? t.ptr<const int64_t>()[at] : t.ptr<const int32_t>()[at];
}

// Every token's position on the CPU, the index arrays checked entry by entry.
std::vector<int64_t> cpu_positions(const RopePositions& positions, int64_t tokens) {
  std::vector<int64_t> out(static_cast<size_t>(tokens));
  if (positions.pos_ids) {
    for (int64_t t = 0; t < tokens; ++t) {
      out[static_cast<size_t>(t)] = element_at(*positions.pos_ids, t);
      FLARE_CHECK(out[static_cast<size_t>(t)] >= 0, kInvalid, kWhat, "pos_ids[", t,
                  "] must be >= 0, got ", out[static_cast<size_t>(t)]);
    }
    return out;
  }
  const TensorView& indptr = *positions.indptr;
  const TensorView& offsets = *positions.offsets;
  const int64_t batch = offsets.shape[0];
  FLARE_CHECK(element_at(indptr, 0) == 0 && element_at(indptr, batch) == tokens, kInvalid, kWhat,
              "indptr must start at 0 and end at nnz = ", tokens,
              ", got indptr[0]=", element_at(indptr, 0), " and indptr[", batch,
              "]=", element_at(indptr, batch));
  // The whole array checked before any position is written: an entry past nnz is caught by
  // the fall after it.
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = element_at(indptr, b), end = element_at(indptr, b + 1);
    FLARE_CHECK(begin <= end, kInvalid, kWhat, "indptr must be non-decreasing: indptr[", b,
                "]=", begin, " > indptr[", b + 1, "]=", end);
    const int64_t offset = element_at(offsets, b);
    FLARE_CHECK(offset >= 0, kInvalid, kWhat, "offsets[", b, "] must be >= 0, got ", offset);
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = element_at(indptr, b), end = element_at(indptr, b + 1);
    for (int64_t t = begin; t < end; ++t) {
      out[static_cast<size_t>(t)] = element_at(offsets, b) + t - begin;
    }
  }
  return out;
}

// The CPU reference: each row read in double, rotated with angles in double, rounded once.
void apply_rope_cpu(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const RopePositions& positions,
                    const RopeOptions& options, const Problem& pr) {
  const std::vector<int64_t> pos = cpu_positions(positions, pr.tokens);
  const int64_t pairs = pr.rotary_dim / 2;
  std::vector<double> frequency(static_cast<size_t>(pairs));
  for (int64_t i = 0; !options.cos_sin_cache && i < pairs; ++i) {
    frequency[static_cast<size_t>(i)] = rope_frequency(pr.params, i, pr.rotary_dim);
  }
  const auto cos_sin = [&](int64_t t, int64_t i, double& c, double& s) {
    const int64_t at = pos[static_cast<size_t>(t)];
    if (!options.cos_sin_cache) {
      const double angle = static_cast<double>(at) * frequency[static_cast<size_t>(i)];
      c = std::cos(angle), s = std::sin(angle);
      return;
    }
    const TensorView& table = *options.cos_sin_cache;
    const float* row = table.ptr<const float>() + at * table.strides[0];
    c = row[i], s = row[pairs + i];
  };
  for (int64_t t = 0; options.cos_sin_cache && t < pr.tokens; ++t) {  // before any write
    const int64_t rows = options.cos_sin_cache->shape[0];
    FLARE_CHECK(pos[static_cast<size_t>(t)] < rows, kInvalid, kWhat, "position ",
                pos[static_cast<size_t>(t)], " of token ", t, " is outside cos_sin_cache's ", rows,
                " rows");
  }
  std::vector<double> row(static_cast<size_t>(pr.head_dim));
  std::vector<float> rounded(static_cast<size_t>(pr.head_dim));
  const auto rotate_rows = [&](const TensorView& in, const TensorView& out) {
    for (int64_t t = 0; t < pr.tokens; ++t) {
      for (int64_t h = 0; h < in.shape[1]; ++h) {
        reference_detail::load_elements<double>(in.data, in.dtype,
                                                t * in.strides[0] + h * in.strides[1], 1,
                                                pr.head_dim, 1.0, row.data());
        for (int64_t i = 0; i < pairs; ++i) {
          const int64_t a = options.interleave ? 2 * i : i;
          const int64_t b = options.interleave ? 2 * i + 1 : i + pairs;
          double c = 0, s = 0;
          cos_sin(t, i, c, s);
          const double x = row[static_cast<size_t>(a)], y = row[static_cast<size_t>(b)];
          row[static_cast<size_t>(a)] = x * c - y * s;
          row[static_cast<size_t>(b)] = y * c + x * s;
        }
        std::transform(row.begin(), row.end(), rounded.begin(),
                       [](double v) { return static_cast<float>(v); });
        reference_detail::store_elements(out.data, out.dtype,
                                         t * out.strides[0] + h * out.strides[1], 1, pr.head_dim,
                                         rounded.data());
      }
    }
  };
  rotate_rows(q, q_out);
  rotate_rows(k, k_out);
}

// The kernel's view of an input and its output; in place when they are the same view.
RopeTensor rope_tensor(const TensorView& in_given, const TensorView& out_given, const char* name,
                       const char* out_name, bool& in_place) {
  const TensorView in = without_unit_strides(in_given);
  const TensorView out = without_unit_strides(out_given);
  const bool same = in.data == out.data && in.strides == out.strides;
  FLARE_CHECK(same || in.data != out.data, kInvalid, kWhat, out_name, " starts where ", name,
              " does but with other strides: in place, pass the same tensor");
  in_place = in_place && same;
  for (const TensorView* t : {&in, &out}) {
    FLARE_CHECK(api_detail::aligned(*t, 2), ErrorCode::kUnsupported, kWhat,
                t == &in ? name : out_name,
                " on the GPU needs a 16-byte aligned pointer and token and head strides of "
                "16-byte multiples, got strides [",
                t->strides[0], ", ", t->strides[1], ", 1]");
  }
  RopeTensor r{};
  r.in = static_cast<const char*>(in.data);
  r.out = static_cast<char*>(out.data);
  r.in_token_stride = in.strides[0] * 2;
  r.in_head_stride = in.strides[1] * 2;
  r.out_token_stride = out.strides[0] * 2;
  r.out_head_stride = out.strides[1] * 2;
  return r;
}

// The turns of the problem's rotation (api_detail::rope_turns), kept for the last rotation this
// thread asked for: a model calls apply_rope once a layer with the same options, and the pow()
// of every pair would otherwise be paid on every call's host path.
const std::vector<float>& turns_of(const Problem& pr) {
  static_assert(sizeof(RopeTurns) == 2 * sizeof(float), "the kernel's turns: hi, lo");
  struct Key {
    float theta = 0, scale = 0;
    std::optional<AttentionParams::Llama31Scaling> llama31;
    int64_t rotary_dim = 0;
    bool operator==(const Key& o) const {
      const auto same31 = [](const auto& a, const auto& b) {
        return a.low_freq_factor == b.low_freq_factor && a.high_freq_factor == b.high_freq_factor &&
               a.old_context_len == b.old_context_len;
      };
      return theta == o.theta && scale == o.scale && rotary_dim == o.rotary_dim &&
             llama31.has_value() == o.llama31.has_value() &&
             (!llama31 || same31(*llama31, *o.llama31));
    }
  };
  thread_local Key last;
  thread_local std::vector<float> turns;
  const Key key{pr.params.rope_theta, pr.params.rope_scale, pr.params.rope_llama31, pr.rotary_dim};
  if (turns.empty() || !(key == last)) {
    turns = api_detail::rope_turns(pr.params, static_cast<int>(pr.rotary_dim));
    last = key;
  }
  return turns;
}

void apply_rope_gpu(const TensorView& q, const TensorView& k, const TensorView& q_out,
                    const TensorView& k_out, const RopePositions& positions,
                    const RopeOptions& options, const Problem& pr, bool by_ids,
                    cuda::Stream stream) {
  const int64_t piece = options.interleave ? 8 : 16;
  FLARE_CHECK(pr.head_dim % 8 == 0 && pr.rotary_dim % piece == 0, ErrorCode::kUnsupported, kWhat,
              "on the GPU head_dim must be a multiple of 8 and rotary_dim of ", piece,
              options.interleave ? " (interleaved pairs)" : " (pairs rotary_dim / 2 apart)",
              ", got head_dim ", pr.head_dim, " and rotary_dim ", pr.rotary_dim);
  FLARE_CHECK(options.cos_sin_cache || pr.rotary_dim / 2 <= kRopeMaxPairs, ErrorCode::kUnsupported,
              kWhat, "on the GPU rotary_dim must be at most ", 2 * kRopeMaxPairs,
              " (or the angles given by cos_sin_cache), got ", pr.rotary_dim);
  bool in_place = true;
  RopeApplyParams p{};
  p.q = rope_tensor(q, q_out, "q", "q_out", in_place);
  p.k = rope_tensor(k, k_out, "k", "k_out", in_place);
  p.rotary_units = static_cast<int32_t>(pr.rotary_dim / piece);
  const int64_t copy_units = in_place ? 0 : (pr.head_dim - pr.rotary_dim) / 8;
  p.units_per_row = static_cast<int32_t>(p.rotary_units + copy_units);
  const int64_t heads = pr.q_heads + pr.k_heads;
  p.heads_per_thread = rope_heads_per_thread(pr.tokens * heads * p.units_per_row);
  const int64_t units =
      pr.tokens * ((heads + p.heads_per_thread - 1) / p.heads_per_thread) * p.units_per_row;
  FLARE_CHECK(units <= INT32_MAX, ErrorCode::kUnsupported, kWhat,
              "on the GPU nnz * (num_qo_heads + num_kv_heads) * pieces / ", p.heads_per_thread,
              " must be below 2^31, got ", units);
  if (units == 0) return;
  p.num_units = static_cast<int32_t>(units);
  p.q_heads = static_cast<int32_t>(pr.q_heads);
  p.k_heads = static_cast<int32_t>(pr.k_heads);
  p.half_bytes = static_cast<int32_t>(pr.rotary_dim);  // rotary_dim / 2 elements of 2 bytes
  p.pairs = static_cast<int32_t>(pr.rotary_dim / 2);
  if (options.cos_sin_cache) {
    const TensorView& table = *options.cos_sin_cache;
    FLARE_CHECK(table.shape[0] <= INT32_MAX, ErrorCode::kUnsupported, kWhat,
                "cos_sin_cache on the GPU needs fewer than 2^31 rows, got ", table.shape[0]);
    p.cos_sin = table.ptr<const float>();
    p.cos_sin_row_stride = table.shape[0] > 1 ? table.strides[0] : 0;
    p.cos_sin_rows = static_cast<int32_t>(table.shape[0]);
  }
  if (!options.cos_sin_cache) {
    const std::vector<float>& turns = turns_of(pr);
    std::memcpy(p.turns, turns.data(), turns.size() * sizeof(float));
  }
  bool pos_ids_i64 = false;
  if (by_ids) {
    p.pos_ids = positions.pos_ids->data;
    pos_ids_i64 = positions.pos_ids->dtype == DType::kI64;
    FLARE_CHECK(pr.tokens <= 1 || positions.pos_ids->strides[0] == 1, kInvalid, kWhat,
                "pos_ids must be contiguous on the GPU, got stride ",
                positions.pos_ids->strides[0]);
  } else {
    for (const auto& [t, name] :
         {std::pair{&*positions.indptr, "indptr"}, std::pair{&*positions.offsets, "offsets"}}) {
      FLARE_CHECK(t->shape[0] <= 1 || t->strides[0] == 1, kInvalid, kWhat, name,
                  " must be contiguous on the GPU, got stride ", t->strides[0]);
    }
    FLARE_CHECK(positions.offsets->shape[0] <= INT32_MAX, ErrorCode::kUnsupported, kWhat,
                "batch must be below 2^31 on the GPU");
    p.batch = static_cast<int32_t>(positions.offsets->shape[0]);
    p.indptr = positions.indptr->ptr<const int32_t>();
    p.offsets = positions.offsets->ptr<const int32_t>();
  }
  const cuda::DeviceScope scope(q.device.index);
  const jit::KernelSpec spec =
      rope_kernel_spec(q.dtype, options.interleave, by_ids ? (pos_ids_i64 ? 64 : 32) : 0,
                       options.cos_sin_cache.has_value());
  const cuda::Function function = jit::get_kernel(spec, "flare_rope_apply", q.device.index);
  const auto blocks = static_cast<unsigned>(
      std::min(kMaxBlocks, (units + kRopeApplyThreads - 1) / kRopeApplyThreads));
  void* args[] = {&p};
  cuda::launch(function, blocks, 1, 1, kRopeApplyThreads, 1, 1, 0, stream, args);
}

}  // namespace

void apply_rope(const TensorView& q, const TensorView& k, const TensorView& q_out,
                const TensorView& k_out, const RopePositions& positions, const RopeOptions& options,
                cuda::Stream stream) {
  const Problem pr = check_problem(q, k, q_out, k_out, options);
  const bool by_ids = check_positions(positions, pr, q.device);
  FLARE_CHECK(by_ids || !options.cos_sin_cache, kInvalid, kWhat,
              "cos_sin_cache takes the positions as pos_ids");
  if (!q.device.is_cuda()) {
    apply_rope_cpu(q, k, q_out, k_out, positions, options, pr);
    return;
  }
  apply_rope_gpu(q, k, q_out, k_out, positions, options, pr, by_ids, stream);
}

jit::KernelSpec rope_kernel_spec(DType dtype, bool interleave, int positions, bool cos_sin_cache) {
  FLARE_CHECK(dtype == DType::kF16 || dtype == DType::kBF16, kInvalid,
              "rope kernels take float16 or bfloat16 rows, got ", dtype_name(dtype));
  FLARE_CHECK(positions == 0 || positions == 32 || positions == 64, kInvalid,
              "rope kernel positions must be 0 (indptr and offsets), 32 or 64 (pos_ids), got ",
              positions);
  FLARE_CHECK(!cos_sin_cache || positions != 0, kInvalid,
              "rope kernels take a cos_sin_cache with pos_ids only");
  jit::KernelSpec spec;
  spec.family_header = "rope_apply.cuh";
  spec.entry = "flare_rope_apply";
  spec.defines = {{"FLARE_ROPE_DTYPE", std::to_string(static_cast<int>(dtype))},
                  {"FLARE_ROPE_INTERLEAVE", interleave ? "1" : "0"},
                  {"FLARE_ROPE_POSITIONS", std::to_string(positions)},
                  {"FLARE_ROPE_COS_SIN_CACHE", cos_sin_cache ? "1" : "0"}};
  spec.label = "rope " + std::string(dtype_name(dtype)) + (interleave ? " interleaved" : "") +
               (positions == 0 ? " indptr" : " pos_ids" + std::to_string(positions)) +
               (cos_sin_cache ? " cos_sin_cache" : "");
  return spec;
}

std::vector<jit::KernelSpec> shipped_rope_kernel_specs() {
  std::vector<jit::KernelSpec> specs;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const bool interleave : {false, true}) {
      for (const int positions : {0, 32, 64}) {
        specs.push_back(rope_kernel_spec(dtype, interleave, positions));
        if (positions != 0) specs.push_back(rope_kernel_spec(dtype, interleave, positions, true));
      }
    }
  }
  return specs;
}

}  // namespace flare
