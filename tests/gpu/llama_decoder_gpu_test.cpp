// LlamaDecoder on the GPU from C++ (flare/model/llama_decoder.h): a 2-layer model of random
// weights and caches, three requests of ragged lengths on permuted pages. The numbers are
// checked against the PyTorch reference in python/tests/test_llama_decoder.py; here: finite
// logits, the greedy token is their argmax, two runs are bit-identical (deterministic), and
// bad index data (a token outside the vocabulary, a page id outside the cache, a position the
// page table does not cover) is reported with nothing written outside the tensors; sampled tokens
// are the CPU reference sampler's draws from the kernel's logits. The small
// case compute-sanitizer runs (scripts/gpu_check.sh). The 4-bit path: a model of 4-bit
// projections whose scales are powers of two (so every dequantized weight is a bf16) gives the
// logits of the same model with those weights in bf16; only the order of the sums differs.
// Skips without an sm_90 device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "flare/model/int4_weights.h"
#include "flare/model/llama_decoder.h"
#include "flare/model/sampling.h"
#include "gpu/decode_test_support.h"
#include "testing/compare.h"
#include "testing/random.h"

namespace flare::model {
namespace {

using gpu_testing::DeviceCopy;
using gpu_testing::to_device;

HostTensor random_bf16(std::vector<int64_t> shape, uint64_t seed, float scale, float mean = 0.f) {
  HostTensor t(DType::kBF16, std::move(shape));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(mean, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, normal(rng));
  return t;
}

HostTensor int32s(const std::vector<int32_t>& values) {
  HostTensor t(DType::kI32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// How a TinyModel holds its projections: bf16, 4-bit, or bf16 of the 4-bit ones dequantized.
enum class Projections { kBf16, kInt4, kInt4Dequantized };

struct TinyModel {
  LlamaConfig config;
  std::vector<HostTensor> host;    // kept alive for the device copies' views
  std::vector<DeviceCopy> device;  // weights, then K caches, then V caches
  LlamaWeights weights;
  LlamaKvCache cache;
  int num_pages = 40, page_size = 16;

  explicit TinyModel(Projections projections = Projections::kBf16) {
    cuda::set_device(0);
    const bool four_bit = projections != Projections::kBf16;
    config.name = "tiny";
    config.num_layers = 2;
    config.hidden = four_bit ? 1024 : 256;  // 4-bit: multiples of 1024
    config.intermediate = four_bit ? 2048 : 512;
    config.heads = four_bit ? 8 : 4;
    config.kv_heads = 2;
    config.head_dim = 128;
    config.vocab = 512;
    if (projections == Projections::kInt4) config.weight_format = WeightFormat::kInt4;
    uint64_t seed = 1;
    const auto upload = [&](HostTensor t) {
      host.push_back(std::move(t));
      device.push_back(to_device(host.back()));
      return device.back().view;
    };
    const auto add = [&](std::vector<int64_t> shape, float scale, float mean = 0.f) {
      return upload(random_bf16(std::move(shape), seed++, scale, mean));
    };
    // A projection [rows, cols]: bf16 normal(0, 0.05), or those values quantized to 4 bits.
    const auto projection = [&](int64_t rows, int64_t cols, TensorView& weight,
                                TensorView& scales) {
      HostTensor w = random_bf16({rows, cols}, seed++, 0.05f);
      if (!four_bit) {
        weight = upload(std::move(w));
        return;
      }
      std::vector<float> values(static_cast<size_t>(rows * cols));
      for (int64_t i = 0; i < rows * cols; ++i) values[static_cast<size_t>(i)] = w.get(i);
      Int4Weight q = quantize_int4(values.data(), rows, cols);
      // Scales rounded down to powers of two: scale * (q - 8) is then exact in bf16, and the
      // bf16 twin holds the 4-bit model's weights exactly.
      for (uint16_t& scale : q.scales) scale &= 0xFF80u;
      if (projections == Projections::kInt4Dequantized) {
        const std::vector<float> back = dequantize_int4(q);
        HostTensor d(DType::kBF16, {rows, cols});
        for (int64_t i = 0; i < rows * cols; ++i) d.set(i, back[static_cast<size_t>(i)]);
        weight = upload(std::move(d));
        return;
      }
      HostTensor codes(DType::kU8, {rows, cols / 2});
      std::copy(q.codes.begin(), q.codes.end(), codes.data<uint8_t>());
      HostTensor scale(DType::kBF16, {rows, cols / kInt4GroupSize});
      std::copy(q.scales.begin(), q.scales.end(), scale.data<uint16_t>());
      weight = upload(std::move(codes));
      scales = upload(std::move(scale));
    };
    const int64_t h = config.hidden;
    weights.embed_tokens = add({config.vocab, h}, 1.f);
    weights.norm = add({h}, 0.05f, 1.f);
    weights.lm_head = add({config.vocab, h}, 0.05f);
    for (int l = 0; l < config.num_layers; ++l) {
      LlamaLayerTensors t;
      for (const ProjectionSlot& slot : projection_slots(config, t))
        projection(slot.rows, slot.cols, *slot.weight, *slot.scales);
      t.input_layernorm = add({h}, 0.05f, 1.f);
      t.post_attention_layernorm = add({h}, 0.05f, 1.f);
      weights.layers.push_back(t);
    }
    for (int l = 0; l < config.num_layers; ++l) {
      cache.k.push_back(add({num_pages, page_size, config.kv_heads, config.head_dim}, 1.f));
      cache.v.push_back(add({num_pages, page_size, config.kv_heads, config.head_dim}, 1.f));
    }
  }
};

struct StepOutputs {
  std::vector<float> logits;
  std::vector<int32_t> next;
};

constexpr int kOneStep = -1;

// num_steps kOneStep: one step() (tokens [batch]); otherwise generate(): num_steps steps in one
// launch (every step's tokens [num_steps, batch]). The last step's logits either way.
StepOutputs run_steps(LlamaDecoder& decoder, const std::vector<int32_t>& tokens,
                      const std::vector<int32_t>& positions, const std::vector<int32_t>& indptr,
                      const std::vector<int32_t>& indices, int num_steps,
                      const SamplingParams& sampling) {
  const int batch = static_cast<int>(tokens.size());
  const int token_rows = num_steps == kOneStep ? 1 : num_steps;
  const HostTensor t = int32s(tokens), p = int32s(positions), ip = int32s(indptr),
                   ix = int32s(indices);
  const DeviceCopy dt = to_device(t), dp = to_device(p), dip = to_device(ip), dix = to_device(ix);
  HostTensor logits(DType::kF32, {batch, decoder.config().vocab});
  logits.fill(std::nanf(""));
  HostTensor next = num_steps == kOneStep ? HostTensor(DType::kI32, {batch})
                                          : HostTensor(DType::kI32, {num_steps, batch});
  std::fill_n(next.data<int32_t>(), token_rows * batch, -7);
  const DeviceCopy dl = to_device(logits), dn = to_device(next);
  if (num_steps == kOneStep) {
    decoder.step(dt.view, dp.view, dip.view, dix.view, dn.view, dl.view, nullptr, sampling);
  } else {
    decoder.generate(dt.view, dp.view, dip.view, dix.view, num_steps, dn.view, dl.view, nullptr,
                     sampling);
  }
  cuda::device_synchronize();
  StepOutputs out;
  out.logits.resize(static_cast<size_t>(logits.numel()));
  out.next.resize(static_cast<size_t>(token_rows) * batch);
  cuda::memcpy_dtoh(out.logits.data(), dl.buffer.data(), out.logits.size() * 4);
  cuda::memcpy_dtoh(out.next.data(), dn.buffer.data(), out.next.size() * 4);
  return out;
}

StepOutputs run_step(LlamaDecoder& decoder, const std::vector<int32_t>& tokens,
                     const std::vector<int32_t>& positions, const std::vector<int32_t>& indptr,
                     const std::vector<int32_t>& indices, const SamplingParams& sampling = {}) {
  return run_steps(decoder, tokens, positions, indptr, indices, kOneStep, sampling);
}

bool sm90() { return cuda::available() && cuda::device_properties(0).cc_major >= 9; }

std::vector<float> download(const TensorView& t) {
  std::vector<float> out(static_cast<size_t>(t.numel() / 2));
  cuda::memcpy_dtoh(out.data(), t.data, static_cast<size_t>(t.numel()) * 2);
  return out;
}

// Requests at `positions` on permuted pages: (indptr, indices); `order`, when given, receives
// the page permutation.
std::pair<std::vector<int32_t>, std::vector<int32_t>> permuted_pages(
    const TinyModel& m, const std::vector<int32_t>& positions,
    std::vector<int32_t>* order = nullptr) {
  std::vector<int32_t> pages(static_cast<size_t>(m.num_pages));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(7));
  std::vector<int32_t> indptr = {0}, indices;
  for (int32_t pos : positions) {
    const int n = pos / m.page_size + 1;
    indices.insert(indices.end(), pages.begin() + indptr.back(), pages.begin() + indptr.back() + n);
    indptr.push_back(indptr.back() + n);
  }
  if (order != nullptr) *order = pages;
  return {indptr, indices};
}

TEST(LlamaDecoderGpu, RaggedBatchIsFiniteDeterministicAndGreedy) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  TinyModel m;
  LlamaDecoder decoder(m.config, m.weights, m.cache);
  // Requests of 1, 37 and 200 cached tokens on permuted pages.
  const std::vector<int32_t> positions = {1, 37, 200};
  std::vector<int32_t> pages;
  const auto [indptr, indices] = permuted_pages(m, positions, &pages);
  const std::vector<int32_t> tokens = {3, 511, 100};
  const StepOutputs first = run_step(decoder, tokens, positions, indptr, indices);
  EXPECT_EQ(decoder.take_error(), DecodeError::kNone);
  for (size_t b = 0; b < tokens.size(); ++b) {
    const float* row = first.logits.data() + b * static_cast<size_t>(m.config.vocab);
    int best = 0;
    for (int i = 0; i < m.config.vocab; ++i) {
      ASSERT_TRUE(std::isfinite(row[i])) << b << " " << i;
      if (row[i] > row[best]) best = i;
    }
    EXPECT_EQ(first.next[b], best) << b;
  }
  const StepOutputs second = run_step(decoder, tokens, positions, indptr, indices);
  EXPECT_EQ(first.logits, second.logits);
  EXPECT_EQ(first.next, second.next);

  // Bad index data: reported; the caches outside the valid slots are untouched.
  const std::vector<float> k_before = download(m.cache.k[0]);
  run_step(decoder, {512}, {5}, {0, 1}, {pages[0]});
  EXPECT_EQ(decoder.take_error(), DecodeError::kTokenOutOfRange);
  run_step(decoder, {1}, {5}, {0, 1}, {m.num_pages + 3});
  EXPECT_EQ(decoder.take_error(), DecodeError::kPageOutOfRange);
  run_step(decoder, {1}, {40}, {0, 1}, {pages[0]});  // position 40 needs 3 pages
  EXPECT_EQ(decoder.take_error(), DecodeError::kPageOutOfRange);
  run_step(decoder, {1}, {-4}, {0, 1}, {pages[0]});
  EXPECT_EQ(decoder.take_error(), DecodeError::kPageOutOfRange);
  std::vector<float> k_after = download(m.cache.k[0]);
  // Only page pages[0], slot 5 (the first step's valid write) may differ.
  for (size_t i = 0; i < k_after.size(); ++i) {
    const size_t slot_row = i / (m.config.kv_heads * m.config.head_dim / 2);
    if (slot_row == static_cast<size_t>(pages[0] * m.page_size + 5)) continue;
    ASSERT_EQ(std::memcmp(&k_after[i], &k_before[i], 4), 0) << i;
  }
}

// The bf16 values of `cache` at the slots of `positions` (request b's position in its pages).
std::vector<uint16_t> slot_values(const TensorView& cache, const TinyModel& m,
                                  const std::vector<int32_t>& positions,
                                  const std::vector<int32_t>& indptr,
                                  const std::vector<int32_t>& indices) {
  std::vector<uint16_t> all(static_cast<size_t>(cache.numel()));
  cuda::memcpy_dtoh(all.data(), cache.data, all.size() * 2);
  const size_t row = static_cast<size_t>(m.config.kv_heads * m.config.head_dim);
  std::vector<uint16_t> out;
  for (size_t b = 0; b < positions.size(); ++b) {
    const int32_t pos = positions[b];
    const size_t slot =
        static_cast<size_t>(indices[static_cast<size_t>(indptr[b] + pos / m.page_size)]) *
            static_cast<size_t>(m.page_size) +
        static_cast<size_t>(pos % m.page_size);
    out.insert(out.end(), all.begin() + static_cast<std::ptrdiff_t>(slot * row),
               all.begin() + static_cast<std::ptrdiff_t>((slot + 1) * row));
  }
  return out;
}

TEST(LlamaDecoderGpu, FourBitWeightsGiveTheDequantizedModelsLogits) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  TinyModel four_bit(Projections::kInt4), dequantized(Projections::kInt4Dequantized);
  LlamaDecoder int4_decoder(four_bit.config, four_bit.weights, four_bit.cache);
  LlamaDecoder bf16_decoder(dequantized.config, dequantized.weights, dequantized.cache);
  // Batch 3 (the 4-row activation area) and batch 1, two steps each (the second reads the
  // first's K/V). Each step runs twice on the 4-bit model (it rewrites the same slots):
  // deterministic.
  for (const std::vector<int32_t>& start :
       {std::vector<int32_t>{1, 37, 200}, std::vector<int32_t>{95}}) {
    std::vector<int32_t> positions = start, tokens = {3, 511, 100};
    tokens.resize(start.size());
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE("batch " + std::to_string(start.size()) + " step " + std::to_string(step));
      const auto [indptr, indices] = permuted_pages(four_bit, positions);
      const StepOutputs a = run_step(int4_decoder, tokens, positions, indptr, indices);
      const StepOutputs again = run_step(int4_decoder, tokens, positions, indptr, indices);
      const StepOutputs b = run_step(bf16_decoder, tokens, positions, indptr, indices);
      EXPECT_EQ(int4_decoder.take_error(), DecodeError::kNone);
      EXPECT_EQ(bf16_decoder.take_error(), DecodeError::kNone);
      for (float v : a.logits) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(a.logits, again.logits);
      // Sums in another order: the logits agree to ~1e-7 until a bf16 rounding of an
      // activation or K/V flips (measured: 1 step in 3 of this tiny random model, then ~1e-3).
      const TensorView logits =
          TensorView::contiguous(const_cast<float*>(a.logits.data()), DType::kF32,
                                 {static_cast<int64_t>(a.logits.size())}, Device::cpu());
      EXPECT_LT(testing::relative_l2_error(logits, b.logits), step == 0 ? 2e-4 : 5e-3);
      // The K and V each layer wrote: equal but for rare bf16 rounding flips of equal sums in
      // another order.
      for (int l = 0; l < four_bit.config.num_layers; ++l) {
        for (int kv = 0; kv < 2; ++kv) {
          const auto& c4 = kv == 0 ? four_bit.cache.k : four_bit.cache.v;
          const auto& c16 = kv == 0 ? dequantized.cache.k : dequantized.cache.v;
          const std::vector<uint16_t> x = slot_values(c4[static_cast<size_t>(l)], four_bit,
                                                      positions, indptr, indices),
                                      y = slot_values(c16[static_cast<size_t>(l)], dequantized,
                                                      positions, indptr, indices);
          size_t differ = 0;
          for (size_t i = 0; i < x.size(); ++i) differ += x[i] != y[i];
          EXPECT_LE(differ, x.size() / 50) << "layer " << l << (kv == 0 ? " K" : " V");
        }
      }
      for (auto& p : positions) ++p;
      tokens = a.next;
    }
  }
}

// Sampling in the kernel draws what the CPU reference sampler draws from the kernel's logits
// (same Philox draws, same rejection rounds), for temperature alone and with top-k / top-p,
// deterministically; bad sampling arguments are refused before launch.
TEST(LlamaDecoderGpu, SampledTokensAreTheReferenceSamplersDraws) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  TinyModel m;
  LlamaDecoder decoder(m.config, m.weights, m.cache);
  const std::vector<int32_t> positions = {1, 37, 200}, tokens = {3, 511, 100};
  const auto [indptr, indices] = permuted_pages(m, positions);
  const SamplingParams cases[] = {{1.f, 0, 1.f, 11},    {0.7f, 0, 0.9f, 12}, {1.3f, 5, 1.f, 13},
                                  {0.6f, 20, 0.5f, 14}, {1.f, 0, 0.05f, 15}, {2.f, 2, 1.f, 16},
                                  {0.8f, 3, 0.7f, 17},  {1.f, 600, 1.f, 18}};
  int most_rounds = 0;
  for (const SamplingParams& s : cases) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + " top_k " +
                 std::to_string(s.top_k) + " top_p " + std::to_string(s.top_p));
    const StepOutputs out = run_step(decoder, tokens, positions, indptr, indices, s);
    EXPECT_EQ(decoder.take_error(), DecodeError::kNone);
    for (size_t b = 0; b < tokens.size(); ++b) {
      int rounds = 0;
      const int expected =
          sample_reference(out.logits.data() + b * static_cast<size_t>(m.config.vocab),
                           m.config.vocab, s, static_cast<int>(b), positions[b], &rounds);
      EXPECT_EQ(out.next[b], expected) << "request " << b << " (" << rounds << " rounds)";
      most_rounds = std::max(most_rounds, rounds);
    }
    EXPECT_EQ(run_step(decoder, tokens, positions, indptr, indices, s).next, out.next);
  }
  EXPECT_GT(most_rounds, 1);  // the rejection rounds ran on the GPU

  // Seeds change the draws (8 seeds at temperature 2 give more than one token set).
  std::vector<std::vector<int32_t>> seen;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    seen.push_back(run_step(decoder, tokens, positions, indptr, indices,
                            {2.f, 0, 1.f, seed * 0x9E3779B97F4A7C15ull})
                       .next);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_GT(std::unique(seen.begin(), seen.end()) - seen.begin(), 1);

  EXPECT_THROW(run_step(decoder, tokens, positions, indptr, indices, {0.f, 0, 0.9f, 0}), Error);
  EXPECT_THROW(run_step(decoder, tokens, positions, indptr, indices, {-1.f, 0, 1.f, 0}), Error);
}

// generate() (the GPU-side loop) gives the tokens, logits and cache of as many step() calls,
// greedy and sampled: the same launch-independent draws, K/V rows, and rounding.
TEST(LlamaDecoderGpu, GenerateEqualsRepeatedSteps) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  TinyModel m;
  LlamaDecoder decoder(m.config, m.weights, m.cache);
  constexpr int kSteps = 6;
  const std::vector<int32_t> positions = {1, 37, 200}, tokens = {3, 511, 100};
  std::vector<int32_t> last = positions;
  for (int32_t& pos : last) pos += kSteps;  // pages for every step's position
  const auto [indptr, indices] = permuted_pages(m, last);
  for (const SamplingParams& s : {SamplingParams{}, SamplingParams{0.9f, 0, 0.8f, 3}}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature));
    const StepOutputs looped = run_steps(decoder, tokens, positions, indptr, indices, kSteps, s);
    EXPECT_EQ(decoder.take_error(), DecodeError::kNone);
    const std::vector<float> k_looped = download(m.cache.k[1]);
    std::vector<int32_t> step_tokens = tokens, step_positions = positions, all;
    StepOutputs one;
    for (int i = 0; i < kSteps; ++i) {
      one = run_step(decoder, step_tokens, step_positions, indptr, indices, s);
      all.insert(all.end(), one.next.begin(), one.next.end());
      step_tokens = one.next;
      for (int32_t& pos : step_positions) ++pos;
    }
    EXPECT_EQ(decoder.take_error(), DecodeError::kNone);
    EXPECT_EQ(looped.next, all);
    EXPECT_EQ(looped.logits, one.logits);
    EXPECT_EQ(download(m.cache.k[1]), k_looped);
  }
}

TEST(LlamaDecoderGpu, StepArgumentsAreCheckedBeforeLaunch) {
  if (!sm90()) GTEST_SKIP() << "needs an sm_90 device";
  TinyModel m;
  LlamaDecoder decoder(m.config, m.weights, m.cache);
  EXPECT_THROW(run_step(decoder, {1, 2}, {3}, {0, 1, 2}, {0, 1}), Error);
  EXPECT_THROW(run_steps(decoder, {1}, {3}, {0, 1}, {0}, 0, {}), Error);  // generate(0 steps)
}

}  // namespace
}  // namespace flare::model
