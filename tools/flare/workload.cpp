// Synthetic serving workloads for `flare bench` (see workload.h).
#include "tools/flare/workload.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "flare/core/error.h"
#include "flare/format/paged_kv.h"
#include "flare/format/ragged.h"

namespace flare::cli {
namespace {

constexpr double kZipfExponent = 1.2;  // the skew of the FlashInfer paper's Zipf batches
constexpr int kZipfRanks = 1000;       // longest request: up to ~1000x the shortest
constexpr float kSoftCap = 50.0f;      // Gemma 2's attention logits cap
// fp8 pages store value / scale; this scale spreads values in [-1, 1) over [-16, 16), well
// inside both formats' normal range, so quantization error stays relative.
constexpr float kFp8Scale = 1.0f / 16.0f;

template <class Enum, size_t N>
Enum parse_name(std::string_view name, const char* what,
                const std::pair<std::string_view, Enum> (&table)[N]) {
  std::string listed;
  for (const auto& [entry, value] : table) {
    if (entry == name) return value;
    if (!listed.empty()) listed += '|';
    listed += entry;
  }
  fail(ErrorCode::kInvalidArgument, what, " must be one of ", listed, ", got '", name, "'");
}

template <class Enum, size_t N>
std::string_view name_in(Enum value, const std::pair<std::string_view, Enum> (&table)[N]) {
  for (const auto& [entry, candidate] : table) {
    if (candidate == value) return entry;
  }
  return "?";
}

constexpr std::pair<std::string_view, BenchMode> kModes[] = {{"decode", BenchMode::kDecode},
                                                             {"prefill", BenchMode::kPrefill}};
constexpr std::pair<std::string_view, BenchKV> kKVs[] = {{"paged", BenchKV::kPaged},
                                                         {"ragged", BenchKV::kRagged}};
constexpr std::pair<std::string_view, LengthDist> kDists[] = {{"constant", LengthDist::kConstant},
                                                              {"uniform", LengthDist::kUniform},
                                                              {"zipf", LengthDist::kZipf}};
constexpr std::pair<std::string_view, BenchVariant> kVariants[] = {
    {"default", BenchVariant::kDefault},
    {"softcap", BenchVariant::kSoftCap},
    {"window", BenchVariant::kWindow},
    {"alibi", BenchVariant::kAlibi}};

std::vector<int32_t> prefix_sum(const std::vector<int32_t>& counts) {
  std::vector<int32_t> indptr(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) {
    FLARE_CHECK(static_cast<int64_t>(indptr[i]) + counts[i] <= INT32_MAX,
                ErrorCode::kInvalidArgument, "the workload needs more than 2^31 - 1 entries");
    indptr[i + 1] = indptr[i] + counts[i];
  }
  return indptr;
}

// Uniform values in [-1, 1) / scale, rounded to the tensor's dtype. A splitmix64 stream:
// filling a few hundred MB of KV with std::uniform_real_distribution would dominate a run.
void fill_uniform(HostTensor& tensor, uint64_t seed, float scale) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  const float inv_scale = 1.0f / scale;
  void* data = tensor.data<void>();
  for (int64_t i = 0; i < tensor.numel(); ++i) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float unit = static_cast<float>(z >> 40) * (1.0f / (1 << 24));  // [0, 1)
    store_float(data, tensor.dtype(), i, (2.0f * unit - 1.0f) * inv_scale);
  }
}

// Visible keys of query i (0-based) of a request: [lo, hi] under the workload's mask.
struct KeyRange {
  int64_t lo, hi;
};
KeyRange visible_keys(const AttentionParams& params, int64_t q_len, int64_t kv_len, int64_t i) {
  const int64_t q_pos = kv_len - q_len + i;
  const int64_t hi = params.mask == MaskMode::kCausal ? std::min(kv_len - 1, q_pos) : kv_len - 1;
  const int64_t lo = params.window_left >= 0 ? std::max<int64_t>(0, q_pos - params.window_left) : 0;
  return {lo, hi};
}

}  // namespace

HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor out(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), out.data<int32_t>());
  return out;
}

BenchMode parse_bench_mode(std::string_view name) { return parse_name(name, "--mode", kModes); }
BenchKV parse_bench_kv(std::string_view name) { return parse_name(name, "--kv", kKVs); }
LengthDist parse_length_dist(std::string_view name) { return parse_name(name, "--dist", kDists); }
BenchVariant parse_bench_variant(std::string_view name) {
  return parse_name(name, "--variant", kVariants);
}
std::string_view name_of(BenchMode mode) { return name_in(mode, kModes); }
std::string_view name_of(BenchKV kv) { return name_in(kv, kKVs); }
std::string_view name_of(LengthDist dist) { return name_in(dist, kDists); }
std::string_view name_of(BenchVariant variant) { return name_in(variant, kVariants); }

std::vector<int32_t> sample_lengths(LengthDist dist, int64_t count, int64_t mean,
                                    std::mt19937_64& rng) {
  FLARE_CHECK(count >= 0 && mean >= 1 && mean <= INT32_MAX / 2, ErrorCode::kInvalidArgument,
              "lengths need count >= 0 and a mean in [1, 2^30], got count=", count, " mean=", mean);
  std::vector<int32_t> lengths(static_cast<size_t>(count), static_cast<int32_t>(mean));
  switch (dist) {
    case LengthDist::kConstant:
      break;
    case LengthDist::kUniform: {
      std::uniform_int_distribution<int64_t> uniform(1, 2 * mean - 1);
      for (int32_t& length : lengths) length = static_cast<int32_t>(uniform(rng));
      break;
    }
    case LengthDist::kZipf: {
      std::vector<double> weights(kZipfRanks);
      for (int r = 0; r < kZipfRanks; ++r) weights[r] = std::pow(r + 1.0, -kZipfExponent);
      std::discrete_distribution<int> rank(weights.begin(), weights.end());
      std::vector<double> raw(lengths.size());
      for (double& value : raw) value = rank(rng) + 1.0;
      const double total = std::accumulate(raw.begin(), raw.end(), 0.0);
      const double per_rank = static_cast<double>(mean) * static_cast<double>(count) / total;
      for (size_t i = 0; i < raw.size(); ++i) {
        const double length = std::clamp(std::round(raw[i] * per_rank), 1.0, INT32_MAX / 2.0);
        lengths[i] = static_cast<int32_t>(length);
      }
      break;
    }
  }
  return lengths;
}

int64_t Workload::total_kv() const {
  return std::accumulate(kv_lens.begin(), kv_lens.end(), int64_t{0});
}

AttentionProblem Workload::problem() const {
  if (spec.kv == BenchKV::kRagged) {
    return AttentionProblem{q.view(), qo_indptr.view(),
                            RaggedKV{k.view(), v.view(), kv_indptr.view()}, params};
  }
  const PagedKV kv = PagedKV::from_separate(k.view(), v.view(), KVLayout::kNHD, kv_indptr.view(),
                                            kv_indices.view(), kv_last_page_len.view());
  return AttentionProblem{q.view(), qo_indptr.view(), kv, params};
}

int64_t Workload::visible_pairs() const {
  int64_t pairs = 0;
  for (size_t r = 0; r < kv_lens.size(); ++r) {
    for (int64_t i = 0; i < qo_lens[r]; ++i) {
      const KeyRange keys = visible_keys(params, qo_lens[r], kv_lens[r], i);
      pairs += std::max<int64_t>(0, keys.hi - keys.lo + 1);
    }
  }
  return pairs;
}

int64_t Workload::kv_tokens_read() const {
  int64_t tokens = 0;
  for (size_t r = 0; r < kv_lens.size(); ++r) {
    if (qo_lens[r] == 0 || kv_lens[r] == 0) continue;
    // The first query sees the lowest keys, the last query the highest.
    const int64_t lo = visible_keys(params, qo_lens[r], kv_lens[r], 0).lo;
    const int64_t hi = visible_keys(params, qo_lens[r], kv_lens[r], qo_lens[r] - 1).hi;
    tokens += std::max<int64_t>(0, hi - lo + 1);
  }
  return tokens;
}

Workload make_workload(const WorkloadSpec& spec) {
  FLARE_CHECK(spec.batch >= 1, ErrorCode::kInvalidArgument, "--batch must be >= 1, got ",
              spec.batch);
  FLARE_CHECK(spec.heads_kv >= 1 && spec.heads_qo % spec.heads_kv == 0, ErrorCode::kInvalidArgument,
              "--heads-qo must be a multiple of --heads-kv, got ", spec.heads_qo, " and ",
              spec.heads_kv);
  FLARE_CHECK(spec.head_dim % 8 == 0 && spec.head_dim <= 512, ErrorCode::kInvalidArgument,
              "--head-dim must be a multiple of 8 in [8, 512], got ", spec.head_dim);
  FLARE_CHECK(spec.page_size >= 1, ErrorCode::kInvalidArgument, "--page-size must be >= 1, got ",
              spec.page_size);
  FLARE_CHECK(is_floating(spec.dtype) && !is_fp8(spec.dtype), ErrorCode::kInvalidArgument,
              "--dtype must be f32, f16 or bf16, got ", dtype_name(spec.dtype));
  FLARE_CHECK(is_floating(spec.kv_dtype), ErrorCode::kInvalidArgument,
              "--kv-dtype must be f32, f16, bf16, e4m3 or e5m2, got ", dtype_name(spec.kv_dtype));

  Workload work;
  work.spec = spec;
  std::mt19937_64 rng(spec.seed);
  work.kv_lens = sample_lengths(spec.dist, spec.batch, spec.kv_len, rng);
  if (spec.mode == BenchMode::kDecode) {
    work.qo_lens.assign(static_cast<size_t>(spec.batch), 1);
  } else {
    work.qo_lens = sample_lengths(spec.dist, spec.batch, spec.qo_len, rng);
  }
  // The KV of a request includes its own query tokens.
  for (size_t r = 0; r < work.kv_lens.size(); ++r) {
    work.kv_lens[r] = std::max(work.kv_lens[r], work.qo_lens[r]);
  }

  const std::vector<int32_t> qo_indptr = prefix_sum(work.qo_lens);
  work.qo_indptr = int32_tensor(qo_indptr);
  const float kv_scale = is_fp8(spec.kv_dtype) ? kFp8Scale : 1.0f;
  work.q = HostTensor(spec.dtype, {qo_indptr.back(), spec.heads_qo, spec.head_dim});
  fill_uniform(work.q, spec.seed + 1, 1.0f);

  std::vector<int64_t> kv_shape;
  if (spec.kv == BenchKV::kRagged) {
    const std::vector<int32_t> kv_indptr = prefix_sum(work.kv_lens);
    work.kv_indptr = int32_tensor(kv_indptr);
    kv_shape = {kv_indptr.back(), spec.heads_kv, spec.head_dim};
  } else {
    std::vector<int32_t> pages_per_request(work.kv_lens.size());
    std::vector<int32_t> last_page_len(work.kv_lens.size());
    for (size_t r = 0; r < work.kv_lens.size(); ++r) {
      pages_per_request[r] =
          static_cast<int32_t>((work.kv_lens[r] + spec.page_size - 1) / spec.page_size);
      last_page_len[r] = static_cast<int32_t>((work.kv_lens[r] - 1) % spec.page_size + 1);
    }
    const std::vector<int32_t> page_indptr = prefix_sum(pages_per_request);
    const int32_t num_pages = page_indptr.back();
    // A serving cache hands out pages in no particular order.
    std::vector<int32_t> page_ids(static_cast<size_t>(num_pages));
    std::iota(page_ids.begin(), page_ids.end(), 0);
    std::shuffle(page_ids.begin(), page_ids.end(), rng);
    work.kv_indptr = int32_tensor(page_indptr);
    work.kv_indices = int32_tensor(page_ids);
    work.kv_last_page_len = int32_tensor(last_page_len);
    kv_shape = {num_pages, spec.page_size, spec.heads_kv, spec.head_dim};
  }
  work.k = HostTensor(spec.kv_dtype, kv_shape);
  work.v = HostTensor(spec.kv_dtype, kv_shape);
  fill_uniform(work.k, spec.seed + 2, kv_scale);
  fill_uniform(work.v, spec.seed + 3, kv_scale);

  work.params.k_scale = kv_scale;
  work.params.v_scale = kv_scale;
  if (spec.mode == BenchMode::kPrefill) work.params.mask = MaskMode::kCausal;
  switch (spec.variant) {
    case BenchVariant::kDefault:
      break;
    case BenchVariant::kSoftCap:
      work.params.logits_soft_cap = kSoftCap;
      break;
    case BenchVariant::kWindow:
      work.params.window_left = static_cast<int32_t>(std::max<int64_t>(1, spec.kv_len / 4));
      break;
    case BenchVariant::kAlibi:
      work.params.pos_encoding = PosEncoding::kAlibi;
      break;
  }
  return work;
}

}  // namespace flare::cli
