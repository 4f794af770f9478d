// The decode megakernel's host side without a GPU (flare/model/llama_config.h,
// llama_decoder.h): presets, validation messages, the RoPE table against Hugging Face's
// Llama-3 formula, the partition of every operator's blocks over the CTAs, the QKV row order,
// the shared-memory budget, the kernel's compile for sm_90a (no spills, no local memory), and
// the decoder's refusal of CPU tensors.
#include "flare/model/llama_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <set>
#include <string>
#include <vector>

#include "flare/model/llama_decoder.h"
#include "jit/jit_test_support.h"
#include "kernels/llama_decode_params.cuh"
#include "testing/expect_error.h"
#include "testing/kernel_usage.h"
#include "testing/nvrtc.h"

namespace flare::model {
namespace {

constexpr int kH100Shared = 232448 - 1024;

TEST(LlamaPreset, ShapesOfTheNamedModels) {
  const LlamaConfig c8 = llama_preset("llama-3.1-8b");
  EXPECT_EQ(c8.num_layers, 32);
  EXPECT_EQ(c8.hidden, 4096);
  EXPECT_EQ(c8.intermediate, 14336);
  EXPECT_EQ(c8.heads / c8.kv_heads, 4);
  EXPECT_NEAR(static_cast<double>(c8.parameter_count()), 8.03e9, 0.01e9);
  EXPECT_NEAR(static_cast<double>(llama_preset("llama-3.1-70b").parameter_count()), 70.55e9,
              0.05e9);
  EXPECT_NEAR(static_cast<double>(llama_preset("llama-3.2-1b").parameter_count()), 1.236e9, 0.01e9);
  EXPECT_NEAR(static_cast<double>(llama_preset("llama-3.2-3b").parameter_count()), 3.213e9, 0.01e9);
  EXPECT_EQ(llama_preset("llama-3.2-1b").head_dim, 64);
  EXPECT_TRUE(llama_preset("llama-3.2-3b").tie_embeddings);
  EXPECT_FLARE_ERROR(llama_preset("llama-2-7b"), ErrorCode::kInvalidArgument,
                     "unknown model 'llama-2-7b'; the presets are llama-3.1-8b");
  for (const std::string& name : llama_preset_names())
    EXPECT_NO_THROW(validate(llama_preset(name)));
}

TEST(LlamaConfigValidate, NamesTheField) {
  LlamaConfig c = llama_preset("llama-3.1-8b");
  c.head_dim = 96;
  EXPECT_FLARE_ERROR(validate(c), ErrorCode::kInvalidArgument,
                     "head_dim must be 64 or 128, got 96");
  c = llama_preset("llama-3.1-8b");
  c.kv_heads = 3;
  EXPECT_FLARE_ERROR(validate(c), ErrorCode::kInvalidArgument, "got 32 heads and 3 kv_heads");
  c = llama_preset("llama-3.1-8b");
  c.intermediate = 1000;
  EXPECT_FLARE_ERROR(validate(c), ErrorCode::kInvalidArgument,
                     "intermediate must be a multiple of 64");
  c = llama_preset("llama-3.1-8b");
  c.num_layers = 0;
  EXPECT_FLARE_ERROR(validate(c), ErrorCode::kInvalidArgument,
                     "num_layers must be positive, got 0");
}

// Hugging Face's _compute_llama3_parameters, written out independently (float64).
TEST(RopeInvFreq, MatchesTheLlama3Formula) {
  const LlamaConfig c = llama_preset("llama-3.1-8b");
  const std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 64u);
  int low = 0, mid = 0, high = 0;
  for (int i = 0; i < 64; ++i) {
    const double base = std::pow(500000.0, -2.0 * i / 128);
    const double wavelen = 2 * std::numbers::pi / base;
    double expected = base;
    if (wavelen > 8192.0 / 1.0) {
      expected = base / 8, ++low;
    } else if (wavelen < 8192.0 / 4.0) {
      ++high;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * base / 8 + smooth * base;
      ++mid;
    }
    EXPECT_FLOAT_EQ(f[static_cast<size_t>(i)], static_cast<float>(expected)) << i;
  }
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
  EXPECT_GT(high, 0);
  LlamaConfig plain = c;
  plain.rope_scaling.enabled = false;
  EXPECT_FLOAT_EQ(rope_inv_freq(plain)[63], static_cast<float>(std::pow(500000.0, -126.0 / 128)));
}

TEST(QkvBlockRows, EveryRowOnceWithItsRopePartnerInTheNextColumn) {
  for (int head_dim : {64, 128}) {
    const int heads = 6, rows = heads * head_dim;
    std::vector<int> seen(static_cast<size_t>(rows), 0);
    for (int block = 0; block < rows / llama::kBlockRows; ++block) {
      for (int n = 0; n < llama::kBlockRows; n += 2) {
        const int row = llama::qkv_block_row(block, n, head_dim);
        const int partner = llama::qkv_block_row(block, n + 1, head_dim);
        EXPECT_EQ(partner, row + head_dim / 2);
        EXPECT_EQ(row / head_dim, block / (head_dim / llama::kBlockRows));
        EXPECT_LT(row % head_dim, head_dim / 2);
        ++seen[static_cast<size_t>(row)];
        ++seen[static_cast<size_t>(partner)];
      }
    }
    for (int r = 0; r < rows; ++r)
      EXPECT_EQ(seen[static_cast<size_t>(r)], 1) << head_dim << " " << r;
  }
}

TEST(PartitionRange, ContiguousBalancedAndComplete) {
  for (int count : {0, 1, 7, 256, 16032}) {
    for (int parts : {1, 3, 132}) {
      int next = 0, smallest = count, largest = 0;
      for (int part = 0; part < parts; ++part) {
        int begin = 0, end = 0;
        llama::partition_range(count, parts, part, begin, end);
        EXPECT_EQ(begin, next);
        next = end;
        smallest = std::min(smallest, end - begin);
        largest = std::max(largest, end - begin);
      }
      EXPECT_EQ(next, count);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(DecodeSchedule, EightBOnAnH100) {
  const LlamaConfig c = llama_preset("llama-3.1-8b");
  const DecodeSchedule s = build_decode_schedule(c, 1, 132, kH100Shared);
  // Batch 1: the activations (one row of the widest input, 14336 columns) in shared memory.
  EXPECT_EQ(s.activation_rows, 1);
  EXPECT_EQ(s.activation_cols, 14336);
  EXPECT_EQ(s.stages, 11);
  EXPECT_LE(s.shared_bytes, kH100Shared);
  const DecodeSchedule s4 = build_decode_schedule(c, 3, 132, kH100Shared);
  EXPECT_EQ(s4.activation_rows, 4);
  EXPECT_EQ(s4.stages, 6);
  const DecodeSchedule s8 = build_decode_schedule(c, 8, 132, kH100Shared);
  EXPECT_EQ(s8.activation_rows, 0);  // 224 KiB of activations: products read them from L2
  EXPECT_EQ(s8.stages, 12);
  EXPECT_EQ(s.attention_splits, 16);  // 132 CTAs over 8 KV heads
  ASSERT_EQ(s.operators.size(), 5u);
  EXPECT_EQ(s.operators[0].blocks, 6144 / 8);
  EXPECT_EQ(s.operators[0].chunks_per_block, 4);
  EXPECT_EQ(s.operators[0].chunk_cols, 1024);
  EXPECT_EQ(s.operators[3].chunks_per_block, 14);  // down: 14336 columns
  EXPECT_EQ(s.operators[4].blocks, 128256 / 8);
  // Every chunk of the step is streamed by exactly one CTA.
  int64_t total = 0;
  for (int64_t n : s.chunks_per_cta) total += n;
  const int64_t per_layer = 768 * 4 + 512 * 4 + 1792 * 2 * 4 + 512 * 14;
  EXPECT_EQ(total, 32 * per_layer + 16032 * 4);
  // The 1B's 8192-column down projection and the 70B's 28672: equal chunks of 1024.
  const DecodeSchedule s1 =
      build_decode_schedule(llama_preset("llama-3.2-1b"), 4, 132, kH100Shared);
  EXPECT_EQ(s1.operators[3].chunks_per_block, 8);
  EXPECT_EQ(s1.operators[3].chunk_cols, 1024);
  const DecodeSchedule s3 =
      build_decode_schedule(llama_preset("llama-3.2-3b"), 4, 132, kH100Shared);
  EXPECT_EQ(s3.operators[0].chunk_cols, 1024);
  EXPECT_EQ(s3.attention_splits, 4);
  // 70B: groups of 8 heads need a larger attention area.
  const DecodeSchedule s70 =
      build_decode_schedule(llama_preset("llama-3.1-70b"), 1, 132, kH100Shared);
  EXPECT_GE(s70.stages, 10);
  EXPECT_FLARE_ERROR(build_decode_schedule(c, 1, 132, 48 * 1024), ErrorCode::kUnsupported,
                     "the device allows 49152");
  EXPECT_FLARE_ERROR(build_decode_schedule(c, 9, 132, kH100Shared), ErrorCode::kInvalidArgument,
                     "batch must be in [1, 8], got 9");
}

TEST(DecodeSchedule, FourBitEightB) {
  LlamaConfig c = llama_preset("llama-3.1-8b");
  c.weight_format = WeightFormat::kInt4;
  const DecodeSchedule s = build_decode_schedule(c, 1, 132, kH100Shared);
  // 4-bit chunks: 4096 columns (2 KiB of codes a row); a stage also holds 8 x 80 bytes of scales.
  EXPECT_EQ(llama::stage_bytes(4), 8 * (2048 + 64) + 8 * 80);
  EXPECT_EQ(s.activation_rows, 1);
  EXPECT_EQ(s.shared_bytes, llama::shared_bytes(s.stages, 4, 128, 1, 14336, 4));
  EXPECT_LE(s.shared_bytes, kH100Shared);
  EXPECT_GE(s.stages, 10);
  ASSERT_EQ(s.operators.size(), 5u);
  EXPECT_EQ(s.operators[0].chunk_cols, 4096);  // qkv: the hidden size in one chunk
  EXPECT_EQ(s.operators[0].chunks_per_block, 1);
  EXPECT_EQ(s.operators[3].chunk_cols, 4096);  // down: 14336 = 3 x 4096 + 2048
  EXPECT_EQ(s.operators[3].chunks_per_block, 4);
  EXPECT_EQ(s.operators[4].chunk_cols, 1024);  // the LM head stays bf16
  EXPECT_EQ(s.operators[4].chunks_per_block, 4);
  int64_t total = 0;
  for (int64_t n : s.chunks_per_cta) total += n;
  EXPECT_EQ(total, 32 * (768 + 512 + 1792 * 2 + 512 * 4) + 16032 * 4);
  // The last chunk's columns and scales are whole 16-byte copies.
  EXPECT_EQ(14336 - 3 * 4096, 2048);
  EXPECT_EQ(2048 / llama::kInt4GroupCols * 2 % 16, 0);
  // Batch 4: four rows of 14336 activations still fit.
  const DecodeSchedule s4 = build_decode_schedule(c, 4, 132, kH100Shared);
  EXPECT_EQ(s4.activation_rows, 4);
  EXPECT_GE(s4.stages, 4);
}

TEST(LlamaConfigValidate, FourBitShapesAndFormatNames) {
  LlamaConfig c = llama_preset("llama-3.2-1b");
  c.weight_format = WeightFormat::kInt4;
  validate(c);  // 2048 / 8192 / 2048: multiples of 1024
  c.intermediate = 8192 + 512;
  EXPECT_FLARE_ERROR(validate(c), ErrorCode::kInvalidArgument,
                     "intermediate must be a multiple of 1024 for 4-bit weights");
  c.intermediate = 8192 + 512;
  c.weight_format = WeightFormat::kBf16;
  validate(c);  // bf16 takes multiples of 64
  EXPECT_EQ(parse_weight_format("int4"), WeightFormat::kInt4);
  EXPECT_EQ(parse_weight_format("bf16"), WeightFormat::kBf16);
  EXPECT_STREQ(weight_format_name(WeightFormat::kInt4), "int4");
  EXPECT_FLARE_ERROR(parse_weight_format("int8"), ErrorCode::kInvalidArgument,
                     "weight format must be 'bf16' or 'int4', got 'int8'");
}

TEST(LlamaConfig, StepWeightBytes) {
  LlamaConfig c = llama_preset("llama-3.1-8b");
  // bf16: every parameter but the embedding, 2 bytes each.
  EXPECT_EQ(c.step_weight_bytes(), 2 * (c.parameter_count() - int64_t{128256} * 4096));
  c.weight_format = WeightFormat::kInt4;
  const int64_t per_layer_projections =
      int64_t{6144} * 4096 + int64_t{4096} * 4096 + 3 * int64_t{14336} * 4096;  // weights a layer
  const int64_t int4 = per_layer_projections / 2 + per_layer_projections / 128 * 2;
  EXPECT_EQ(c.step_weight_bytes(), 32 * (int4 + 4 * 4096) + int64_t{128256} * 4096 * 2 + 2 * 4096);
}

TEST(LlamaDecoderArguments, CpuWeightsAreRefusedNamingTheTensor) {
  LlamaConfig c = llama_preset("llama-3.2-1b");
  c.num_layers = 1;
  std::vector<uint16_t> storage(16);
  LlamaWeights w;
  w.embed_tokens = TensorView::contiguous(storage.data(), DType::kBF16, {4, 4}, Device::cpu());
  EXPECT_FLARE_ERROR(LlamaDecoder(c, w, LlamaKvCache{}), ErrorCode::kInvalidArgument,
                     "weights must be CUDA tensors, got embed_tokens on cpu");
}

class ShippedLlamaKernels : public jit::testing::JitTest {};

TEST_F(ShippedLlamaKernels, CompileForSm90WithoutSpillsOrLocalMemory) {
  FLARE_SKIP_WITHOUT_NVRTC();
  std::set<std::string> units;
  for (const jit::KernelSpec& spec : shipped_llama_decode_kernel_specs()) {
    if (!units.insert(spec.translation_unit()).second) continue;
    const jit::CompiledKernel compiled = jit::compile(spec, "sm_90a");
    ASSERT_EQ(compiled.usage.size(), 1u) << spec.label;
    // 9 warps an SM leave 168 registers a thread (3 warps share a quarter of the register file).
    testing::expect_shipped_usage(compiled, spec.label, 168);
    EXPECT_EQ(compiled.usage[0].max_threads, llama::kThreads) << spec.label;
  }
  // The 8B at 4 batch capacities, the 1B, the 3B; the 4-bit 8B at 2 and the 4-bit 70B.
  EXPECT_EQ(units.size(), 9u);
}

}  // namespace
}  // namespace flare::model
