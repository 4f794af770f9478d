// validate_attention: every shape, dtype, device and option check of one attention call,
// each naming its argument and the expected versus actual value (DESIGN decision 6).
#include <cmath>
#include <initializer_list>
#include <sstream>
#include <string>
#include <variant>

#include "flare/core/error.h"
#include "flare/format/validate.h"
#include "flare/reference/attention.h"

namespace flare {
namespace {

constexpr int64_t kMinHeadDim = 8;
constexpr int64_t kMaxHeadDim = 512;
constexpr int64_t kHeadDimMultiple = 8;  // the reference's dot product and every GPU tile

std::string shape_text(std::initializer_list<int64_t> dims) {
  std::ostringstream text;
  text << "[";
  const char* separator = "";
  for (int64_t dim : dims) {
    text << separator << dim;
    separator = ", ";
  }
  text << "]";
  return text.str();
}

// On the CPU, of rank `ndim` (described by `layout`, e.g. "[total_q, num_qo_heads, head_dim]").
void check_host_tensor(const TensorView& t, const char* name, int ndim, const char* layout) {
  FLARE_CHECK(t.device.is_cpu(), ErrorCode::kInvalidArgument, name,
              " must be on the CPU for the reference backend, got ", t.device.str());
  FLARE_CHECK(t.ndim == ndim, ErrorCode::kInvalidArgument, name, " must have rank ", ndim, " ",
              layout, ", got rank ", t.ndim);
  bool empty = false;
  for (int dim = 0; dim < ndim; ++dim) {
    FLARE_CHECK(t.shape[dim] >= 0, ErrorCode::kInvalidArgument, name,
                " must have non-negative sizes, got ", t.shape_str());
    empty = empty || t.shape[dim] == 0;
  }
  FLARE_CHECK(empty || t.data != nullptr, ErrorCode::kInvalidArgument, name,
              " has no data (null pointer) but shape ", t.shape_str());
}

void check_shape(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                 const char* layout) {
  bool same = true;
  int dim = 0;
  for (int64_t size : expected) same = same && t.shape[dim++] == size;
  FLARE_CHECK(same, ErrorCode::kInvalidArgument, name, " must have shape ", shape_text(expected),
              " ", layout, ", got ", t.shape_str());
}

void check_dtype(const TensorView& t, const char* name, DType expected) {
  FLARE_CHECK(t.dtype == expected, ErrorCode::kInvalidArgument, name, " must be ",
              dtype_name(expected), ", got ", dtype_name(t.dtype));
}

// q and o: float32, float16 or bfloat16. Other floating types are well-formed but not
// implemented (kUnsupported); integers are malformed.
void check_activation_dtype(const TensorView& t, const char* name) {
  const DType dtype = t.dtype;
  if (dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16) return;
  fail(is_floating(dtype) ? ErrorCode::kUnsupported : ErrorCode::kInvalidArgument, name,
       " dtype must be float32, float16 or bfloat16, got ", dtype_name(dtype));
}

void check_head_dim(int64_t head_dim, const char* name) {
  FLARE_CHECK(
      head_dim >= kMinHeadDim && head_dim <= kMaxHeadDim && head_dim % kHeadDimMultiple == 0,
      ErrorCode::kUnsupported, name, " must be a multiple of ", kHeadDimMultiple, " in [",
      kMinHeadDim, ", ", kMaxHeadDim, "], got ", head_dim);
}

void check_finite(float value, const char* name) {
  FLARE_CHECK(std::isfinite(value), ErrorCode::kInvalidArgument, name, " must be finite, got ",
              value);
}

int64_t int32_at(const TensorView& array, int64_t i) {
  return array.ptr<const int32_t>()[i * array.strides[0]];
}

void validate_kv(const KVCache& cache) {
  if (const PagedKV* paged = std::get_if<PagedKV>(&cache)) {
    const char* layout = paged->layout == KVLayout::kNHD
                             ? "[pages, page_size, num_kv_heads, head_dim] (NHD)"
                             : "[pages, num_kv_heads, page_size, head_dim] (HND)";
    check_host_tensor(paged->k, "k_cache", 4, layout);
    check_host_tensor(paged->v, "v_cache", 4, layout);
    validate_paged_kv(*paged);
  } else {
    const RaggedKV& ragged = std::get<RaggedKV>(cache);
    check_host_tensor(ragged.k, "k", 3, "[total_kv, num_kv_heads, head_dim_qk]");
    check_host_tensor(ragged.v, "v", 3, "[total_kv, num_kv_heads, head_dim_vo]");
    validate_ragged_kv(ragged);
  }
  // validate_*_kv check that K and V share one floating dtype: f32, f16, bf16, e4m3 or e5m2,
  // all of which the reference reads.
}

void validate_output(const AttentionProblem& problem, const AttentionOutput& out, int64_t total_q) {
  const int64_t num_qo_heads = problem.q.shape[1];
  check_host_tensor(out.o, "o", 3, "[total_q, num_qo_heads, head_dim_vo]");
  check_activation_dtype(out.o, "o");
  check_shape(out.o, "o", {total_q, num_qo_heads, head_dim_vo(problem.kv)},
              "[total_q, num_qo_heads, head_dim_vo]");
  if (!out.lse) return;
  FLARE_CHECK(problem.params.use_softmax, ErrorCode::kInvalidArgument,
              "lse must not be given when use_softmax is false (sigmoid attention has no "
              "log-sum-exp)");
  check_host_tensor(*out.lse, "lse", 2, "[total_q, num_qo_heads]");
  check_dtype(*out.lse, "lse", DType::kF32);
  check_shape(*out.lse, "lse", {total_q, num_qo_heads}, "[total_q, num_qo_heads]");
}

void validate_custom_mask(const AttentionProblem& problem, int64_t batch) {
  const AttentionParams& params = problem.params;
  if (params.mask != MaskMode::kCustom) {
    FLARE_CHECK(!params.custom_mask && !params.mask_indptr, ErrorCode::kInvalidArgument,
                "custom_mask / mask_indptr are given but mask is not MaskMode::kCustom");
    return;
  }
  FLARE_CHECK(params.custom_mask && params.mask_indptr, ErrorCode::kInvalidArgument,
              "mask MaskMode::kCustom needs both custom_mask and mask_indptr");
  const TensorView& bits = *params.custom_mask;
  check_host_tensor(bits, "custom_mask", 1, "[total bytes]");
  check_dtype(bits, "custom_mask", DType::kU8);
  FLARE_CHECK(bits.shape[0] <= 1 || bits.strides[0] == 1, ErrorCode::kInvalidArgument,
              "custom_mask must be contiguous (stride 1), got stride ", bits.strides[0]);
  const TensorView& indptr = *params.mask_indptr;
  validate_indptr(indptr, "mask_indptr", batch + 1, bits.shape[0]);
  for (int64_t request = 0; request < batch; ++request) {
    const int64_t q_len = ragged_length(problem.qo_indptr, request);
    const int64_t kv_len = kv_length(problem.kv, request);
    const int64_t expected = (q_len * kv_len + 7) / 8;
    const int64_t actual = int32_at(indptr, request + 1) - int32_at(indptr, request);
    FLARE_CHECK(actual == expected, ErrorCode::kInvalidArgument, "custom_mask segment of request ",
                request, " (mask_indptr[", request + 1, "] - mask_indptr[", request,
                "]) must hold ceil(q_len * kv_len / 8) = ceil(", q_len, " * ", kv_len,
                " / 8) = ", expected, " bytes, got ", actual);
  }
}

void validate_positions(const AttentionProblem& problem, int64_t batch) {
  const AttentionParams& params = problem.params;
  check_rope_params(params, "");
  if (params.rope_offsets) {
    FLARE_CHECK(params.pos_encoding == PosEncoding::kRopeLlama, ErrorCode::kInvalidArgument,
                "rope_offsets is given but pos_encoding is not PosEncoding::kRopeLlama");
    check_host_tensor(*params.rope_offsets, "rope_offsets", 1, "[batch]");
    check_dtype(*params.rope_offsets, "rope_offsets", DType::kI32);
    check_shape(*params.rope_offsets, "rope_offsets", {batch}, "[batch]");
  }
  if (params.prefix_len) {
    FLARE_CHECK(params.mask == MaskMode::kCausal, ErrorCode::kInvalidArgument,
                "prefix_len is given but mask is not MaskMode::kCausal (prefix-LM widens the "
                "causal mask)");
    check_host_tensor(*params.prefix_len, "prefix_len", 1, "[batch]");
    check_dtype(*params.prefix_len, "prefix_len", DType::kI32);
    check_shape(*params.prefix_len, "prefix_len", {batch}, "[batch]");
  }
  if (params.document_id) {
    check_host_tensor(*params.document_id, "document_id", 2, "[batch, L]");
    check_dtype(*params.document_id, "document_id", DType::kI32);
    FLARE_CHECK(params.document_id->shape[0] == batch && params.document_id->strides[1] == 1,
                ErrorCode::kInvalidArgument, "document_id must be [batch = ", batch,
                ", L] with contiguous rows, got ", params.document_id->shape_str());
  }
  if (params.relative_bias) {
    check_host_tensor(*params.relative_bias, "relative_bias", 2, "[num_qo_heads, 32]");
    check_dtype(*params.relative_bias, "relative_bias", DType::kF32);
    check_shape(*params.relative_bias, "relative_bias", {problem.q.shape[1], kRelativeBiasBuckets},
                "[num_qo_heads, 32]");
    FLARE_CHECK(std::isfinite(params.relative_max_distance) && params.relative_max_distance > 16.0f,
                ErrorCode::kInvalidArgument, "relative_max_distance must be finite and > 16, got ",
                params.relative_max_distance);
  }
  if (params.alibi_slopes) {
    FLARE_CHECK(params.pos_encoding == PosEncoding::kAlibi, ErrorCode::kInvalidArgument,
                "alibi_slopes is given but pos_encoding is not PosEncoding::kAlibi");
    check_host_tensor(*params.alibi_slopes, "alibi_slopes", 1, "[num_qo_heads]");
    check_dtype(*params.alibi_slopes, "alibi_slopes", DType::kF32);
    check_shape(*params.alibi_slopes, "alibi_slopes", {problem.q.shape[1]}, "[num_qo_heads]");
  }
}

void validate_scalars(const AttentionParams& params) {
  check_finite(params.sm_scale, "sm_scale");
  check_finite(params.logits_soft_cap, "logits_soft_cap");
  FLARE_CHECK(params.logits_soft_cap >= 0.0f, ErrorCode::kInvalidArgument,
              "logits_soft_cap must be >= 0 (0 = off), got ", params.logits_soft_cap);
  FLARE_CHECK(params.window_left >= -1, ErrorCode::kInvalidArgument,
              "window_left must be >= -1 (-1 = no window), got ", params.window_left);
  check_finite(params.sigmoid_bias, "sigmoid_bias");
  check_finite(params.k_scale, "k_scale");
  check_finite(params.v_scale, "v_scale");
}

}  // namespace

void validate_attention(const AttentionProblem& problem, const AttentionOutput& out) {
  const TensorView& q = problem.q;
  check_host_tensor(q, "q", 3, "[total_q, num_qo_heads, head_dim_qk]");
  check_activation_dtype(q, "q");
  const int64_t total_q = q.shape[0];
  validate_indptr(problem.qo_indptr, "qo_indptr");
  const int64_t batch = problem.qo_indptr.shape[0] - 1;
  const int64_t last = int32_at(problem.qo_indptr, batch);
  FLARE_CHECK(last == total_q, ErrorCode::kInvalidArgument, "qo_indptr[", batch,
              "] must equal total_q (q.shape[0]) = ", total_q, ", got ", last);

  validate_kv(problem.kv);
  const int64_t kv_batch = std::visit([](const auto& kv) { return kv.batch(); }, problem.kv);
  FLARE_CHECK(kv_batch == batch, ErrorCode::kInvalidArgument,
              "KV batch (requests in the KV indptr) must equal the qo batch (qo_indptr size - 1 = ",
              batch, "), got ", kv_batch);

  const int64_t num_qo_heads = q.shape[1];
  const int64_t kv_heads = num_kv_heads(problem.kv);
  FLARE_CHECK(kv_heads >= 1, ErrorCode::kInvalidArgument, "num_kv_heads must be >= 1, got ",
              kv_heads);
  FLARE_CHECK(num_qo_heads % kv_heads == 0, ErrorCode::kInvalidArgument, "num_qo_heads (",
              num_qo_heads, ") must be a multiple of num_kv_heads (", kv_heads, ")");
  check_head_dim(q.shape[2], "q head_dim_qk");
  check_head_dim(head_dim_qk(problem.kv), "k head_dim_qk");
  check_head_dim(head_dim_vo(problem.kv), "v head_dim_vo");
  FLARE_CHECK(q.shape[2] == head_dim_qk(problem.kv), ErrorCode::kInvalidArgument, "q head_dim_qk (",
              q.shape[2], ") must equal k head_dim_qk (", head_dim_qk(problem.kv), ")");

  validate_output(problem, out, total_q);
  validate_scalars(problem.params);
  validate_positions(problem, batch);
  validate_custom_mask(problem, batch);
}

}  // namespace flare
