// One randomized attention test case: q, a paged and a ragged KV cache holding the same
// values, optional RoPE offsets / ALiBi slopes / custom mask, NaN-poisoned o and lse, and the
// same inputs as plain float64 vectors for the naive reference of naive_attention.h.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "flare/reference/attention.h"
#include "naive_attention.h"
#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/index_arrays.h"
#include "testing/kv_builder.h"
#include "testing/random.h"

namespace flare::testing {

struct AttentionCaseSpec {
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  int64_t num_qo_heads = 4;
  int64_t num_kv_heads = 1;
  int64_t head_dim_qk = 64;
  int64_t head_dim_vo = 64;
  DType q_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;
  DType o_dtype = DType::kF32;
  int64_t page_size = 16;
  KVLayout layout = KVLayout::kNHD;
  bool combined = false;
  bool strided = false;         // q, o, lse and both KV caches are views into padded buffers
  float kv_value_scale = 1.0f;  // stored K/V values are normal(0, 1) * this
  AttentionParams params;       // its tensors are made from the three fields below
  bool give_rope_offsets = false;
  bool give_alibi_slopes = false;
  bool give_prefix_len = false;     // prefix-LM (with kCausal): random prefixes up to kv_len + 2
  bool give_relative_bias = false;  // T5's relative bias: a random [H_qo, 32] table
  // Document mask: random runs of 1-5 positions per request, rows of max kv_len - 2 columns
  // (the longest request's last positions lie past its row).
  bool give_document_id = false;
  double mask_density = 0.5;  // kCustom: probability that a bit is set
  bool with_lse = true;
  uint64_t seed = 1;
};

enum class KVSource { kPaged, kRagged };

class AttentionCase {
 public:
  explicit AttentionCase(const AttentionCaseSpec& spec) : spec_(spec), kv_(build_kv(spec)) {
    const int64_t total_q = total(spec.q_lens);
    const int64_t batch = static_cast<int64_t>(spec.q_lens.size());
    q_ = padded_view(q_storage_, spec.q_dtype, {total_q, spec.num_qo_heads, spec.head_dim_qk});
    fill_random(q_, spec.seed + 10);
    o_ = padded_view(o_storage_, spec.o_dtype, {total_q, spec.num_qo_heads, spec.head_dim_vo});
    lse_ = padded_view(lse_storage_, DType::kF32, {total_q, spec.num_qo_heads});
    qo_indptr_ = indptr_tensor(spec.q_lens);

    naive_.q_lens = spec.q_lens;
    naive_.kv_lens = spec.kv_lens;
    naive_.num_qo_heads = spec.num_qo_heads;
    naive_.num_kv_heads = spec.num_kv_heads;
    naive_.head_dim_qk = spec.head_dim_qk;
    naive_.head_dim_vo = spec.head_dim_vo;
    naive_.q = to_double_vector(q_);
    naive_.k = to_double_vector(kv_.ragged.k);
    naive_.v = to_double_vector(kv_.ragged.v);
    naive_.params = spec.params;

    Rng rng(spec.seed + 20);
    params_ = spec.params;
    if (spec.give_rope_offsets) {
      for (int64_t r = 0; r < batch; ++r) {
        naive_.rope_offsets.push_back(static_cast<int32_t>(rng.uniform_int(0, 3000)));
      }
      rope_offsets_ = int32_tensor(naive_.rope_offsets);
      params_.rope_offsets = rope_offsets_.view();
    }
    if (spec.give_alibi_slopes) {
      alibi_slopes_ = HostTensor(DType::kF32, {spec.num_qo_heads});
      for (int64_t h = 0; h < spec.num_qo_heads; ++h) {
        alibi_slopes_.set(h, static_cast<float>(rng.uniform(0.01, 1.0)));
        naive_.alibi_slopes.push_back(alibi_slopes_.get(h));
      }
      params_.alibi_slopes = alibi_slopes_.view();
    }
    if (spec.give_prefix_len) {
      for (int64_t r = 0; r < batch; ++r) {
        naive_.prefix_len.push_back(static_cast<int32_t>(rng.uniform_int(0, spec.kv_lens[r] + 2)));
      }
      prefix_len_ = int32_tensor(naive_.prefix_len);
      params_.prefix_len = prefix_len_.view();
    }
    if (spec.give_relative_bias) {
      relative_bias_ = HostTensor(DType::kF32, {spec.num_qo_heads, kRelativeBiasBuckets});
      for (int64_t i = 0; i < spec.num_qo_heads * kRelativeBiasBuckets; ++i) {
        relative_bias_.set(i, static_cast<float>(rng.uniform(-2.0, 2.0)));
        naive_.relative_bias.push_back(relative_bias_.get(i));
      }
      params_.relative_bias = relative_bias_.view();
    }
    if (spec.give_document_id) {
      const int64_t columns =
          std::max<int64_t>(1, *std::max_element(spec.kv_lens.begin(), spec.kv_lens.end()) - 2);
      naive_.document_columns = columns;
      for (int64_t r = 0; r < batch; ++r) {
        int32_t id = 0;
        for (int64_t j = 0; j < columns; ++j) {
          if (j == 0 || rng.uniform_int(0, 3) == 0) ++id;
          naive_.document_id.push_back(id);
        }
      }
      document_id_ = HostTensor(DType::kI32, {batch, columns});
      std::copy(naive_.document_id.begin(), naive_.document_id.end(), document_id_.data<int32_t>());
      params_.document_id = document_id_.view();
    }
    if (spec.params.mask == MaskMode::kCustom) make_custom_mask(rng);
  }

  AttentionProblem problem(KVSource source = KVSource::kPaged) const {
    AttentionProblem problem{q_, qo_indptr_.view(), KVCache{kv_.paged}, params_};
    if (source == KVSource::kRagged) problem.kv = kv_.ragged;
    return problem;
  }
  AttentionOutput output() const {
    return AttentionOutput{o_, spec_.with_lse ? std::optional<TensorView>(lse_) : std::nullopt};
  }

  // NaN into o and lse, then reference_attention: every element must be written.
  void run(KVSource source = KVSource::kPaged, ReferenceOptions options = {}) {
    poison(o_);
    poison(lse_);
    reference_attention(problem(source), output(), options);
  }

  NaiveOutputs naive() const { return naive_attention(naive_); }

  // o and lse against `expected` within `tolerance` plus the rounding of the expected values
  // to the output dtype (relative); NaN or unwritten elements fail. lse is only compared when
  // the case asks for it, and must stay untouched otherwise.
  void expect_near(const NaiveOutputs& expected, double o_tolerance, double lse_tolerance) const {
    const ErrorStats o_error = error_stats(o_, expected.o);
    EXPECT_LE(o_error.max_abs, o_tolerance + dtype_rounding(spec_.o_dtype) * max_abs(expected.o))
        << "o: " << o_error;
    if (spec_.with_lse) {
      const ErrorStats lse_error = error_stats(lse_, expected.lse);
      EXPECT_LE(lse_error.max_abs,
                lse_tolerance + dtype_rounding(DType::kF32) * max_abs(expected.lse))
          << "lse: " << lse_error;
    } else {
      EXPECT_EQ(count_nan(lse_), element_count(lse_)) << "lse must stay untouched";
    }
  }

  const TensorView& o() const { return o_; }
  const TensorView& lse() const { return lse_; }
  const TestKVCache& kv() const { return kv_; }
  const NaiveInputs& naive_inputs() const { return naive_; }
  AttentionParams& params() { return params_; }

 private:
  static int64_t total(const std::vector<int32_t>& lens) {
    int64_t sum = 0;
    for (int32_t len : lens) sum += len;
    return sum;
  }
  static double max_abs(const std::vector<double>& values) {
    double largest = 0.0;
    for (double x : values) {
      if (std::isfinite(x)) largest = std::max(largest, std::fabs(x));
    }
    return largest;
  }
  // Half an ulp at 1 of the output dtype: the relative error of rounding a result to it.
  static double dtype_rounding(DType dtype) {
    switch (dtype) {
      case DType::kBF16:
        return std::ldexp(1.0, -8);
      case DType::kF16:
        return std::ldexp(1.0, -11);
      default:
        return std::ldexp(1.0, -24);
    }
  }

  static TestKVCache build_kv(const AttentionCaseSpec& spec) {
    KVCacheSpec kv_spec;
    kv_spec.kv_lens = spec.kv_lens;
    kv_spec.num_kv_heads = spec.num_kv_heads;
    kv_spec.head_dim_qk = spec.head_dim_qk;
    kv_spec.head_dim_vo = spec.head_dim_vo;
    kv_spec.dtype = spec.kv_dtype;
    kv_spec.page_size = spec.page_size;
    kv_spec.layout = spec.layout;
    kv_spec.combined = spec.combined;
    kv_spec.strided = spec.strided;
    kv_spec.seed = spec.seed;
    kv_spec.scale = spec.kv_value_scale;
    return build_kv_cache(kv_spec);
  }

  // A view of `shape` inside a buffer padded by one leading index per dimension and 8
  // trailing elements in the last when the case is strided (padding holds NaN).
  TensorView padded_view(HostTensor& storage, DType dtype, std::vector<int64_t> shape) const {
    if (!spec_.strided) {
      storage = HostTensor(dtype, shape);
      return storage.view();
    }
    std::vector<int64_t> full = shape;
    std::vector<int64_t> begin(shape.size(), 0);
    for (size_t d = 1; d < shape.size(); ++d) {
      full[d] += 1;
      begin[d] = 1;
    }
    full.back() += 7;
    storage = HostTensor(dtype, full);
    storage.fill(std::numeric_limits<float>::quiet_NaN());
    return sub_view(storage, begin, shape);
  }

  void make_custom_mask(Rng& rng) {
    std::vector<uint8_t> bytes;
    std::vector<int32_t> segment_lens;
    for (size_t r = 0; r < spec_.q_lens.size(); ++r) {
      const int64_t q_len = spec_.q_lens[r];
      const int64_t kv_len = spec_.kv_lens[r];
      std::vector<bool> visible(static_cast<size_t>(q_len * kv_len));
      for (size_t bit = 0; bit < visible.size(); ++bit) {
        // The first query row of every request sees nothing: a fully masked row.
        const bool first_row = static_cast<int64_t>(bit) < kv_len;
        visible[bit] = !first_row && rng.uniform() < spec_.mask_density;
      }
      const size_t begin = bytes.size();
      bytes.resize(begin + (visible.size() + 7) / 8, 0);
      for (size_t bit = 0; bit < visible.size(); ++bit) {
        if (visible[bit]) bytes[begin + bit / 8] |= static_cast<uint8_t>(1u << (bit % 8));
      }
      segment_lens.push_back(static_cast<int32_t>(bytes.size() - begin));
      naive_.visible.push_back(std::move(visible));
    }
    custom_mask_ = HostTensor(DType::kU8, {static_cast<int64_t>(bytes.size())});
    std::copy(bytes.begin(), bytes.end(), custom_mask_.data<uint8_t>());
    mask_indptr_ = indptr_tensor(segment_lens);
    params_.custom_mask = custom_mask_.view();
    params_.mask_indptr = mask_indptr_.view();
  }

  AttentionCaseSpec spec_;
  TestKVCache kv_;
  HostTensor q_storage_, o_storage_, lse_storage_;
  TensorView q_, o_, lse_;
  HostTensor qo_indptr_, rope_offsets_, alibi_slopes_, prefix_len_, relative_bias_, document_id_,
      custom_mask_, mask_indptr_;
  AttentionParams params_;
  NaiveInputs naive_;
};

// Builds `spec`, runs the reference on `source` and compares with the naive float64 result.
inline void expect_matches_naive(const AttentionCaseSpec& spec, double o_tolerance,
                                 double lse_tolerance, KVSource source = KVSource::kPaged,
                                 ReferenceOptions options = {}) {
  AttentionCase test_case(spec);
  test_case.run(source, options);
  test_case.expect_near(test_case.naive(), o_tolerance, lse_tolerance);
}

// Same dtype, shape and bytes of every element (views may have different strides).
inline bool bitwise_equal(const TensorView& a, const TensorView& b) {
  const HostTensor a_bytes = to_contiguous(a);
  const HostTensor b_bytes = to_contiguous(b);
  return a.dtype == b.dtype && a_bytes.shape() == b_bytes.shape() &&
         std::equal(a_bytes.data<std::byte>(),
                    a_bytes.data<std::byte>() + element_count(a) * dtype_bytes(a.dtype),
                    b_bytes.data<std::byte>());
}

}  // namespace flare::testing
