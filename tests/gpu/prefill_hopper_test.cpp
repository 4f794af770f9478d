// The Hopper prefill family (backend kFA3: warpgroup MMAs, kernels/wgmma.cuh) against the CPU
// float64 reference, on sm_90 only: every head-dim pair, both query tiles (64 and 128; 128 only
// at head_dim_vo 256) and KV tiles (64 and 128), ragged and paged KV at page sizes 1 / 5
// (gathered) and 16 / 64 / 128 / 256 (bulk copies, box by box), NHD and HND, GQA 1 / 4 / 7 / 8,
// odd lengths, prefill and append, no mask / causal / custom mask, the built-in variant
// flags and fused RoPE, split-KV through the merge kernel, Q copied in bulk or gathered. The rest
// of tests/gpu/prefill_test.cpp runs on this family too under backend kAuto
// (FLARE_TEST_PREFILL_BACKEND picks either one). Outputs are NaN-poisoned before each run. Skips
// without an sm_90 device.
#include <gtest/gtest.h>

#include <vector>

#include "flare/api/batch_prefill.h"
#include "gpu/prefill_test_support.h"
#include "testing/expect_error.h"
#include "testing/user_variants.h"

namespace flare {
namespace {

using namespace prefill_testing;

// Checks the case on the Hopper family and that its plan used it.
void check_hopper(Case c) {
  c.backend = PrefillBackend::kFA3;
  check(c, [](const BatchPrefill& prefill) { EXPECT_TRUE(prefill.last_tiles().warpgroup); });
}

TEST(PrefillHopper, EveryHeadDimBothQueryTilesCausalAndNoMask) {
  SKIP_WITHOUT_HOPPER();
  const std::pair<int, int> dims[] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  for (const auto& [qk, vo] : dims) {
    for (const int tile : {64, 128}) {
      if (tile == 64 && vo > 128) continue;  // 128 rows only (prefill_config.cpp)
      for (const MaskMode mask : {MaskMode::kNone, MaskMode::kCausal}) {
        Case c;
        c.q_lens = {1, 77, 130, 300};
        c.kv_lens = {64, 200, 130, 511};
        c.head_dim_qk = qk;
        c.head_dim_vo = vo;
        c.query_tile = tile;
        c.mask = mask;
        c.seed = static_cast<uint64_t>(qk + tile + static_cast<int>(mask));
        SCOPED_TRACE(::testing::Message() << "D " << qk << "/" << vo << " tile " << tile << " mask "
                                          << static_cast<int>(mask));
        check_hopper(c);
      }
    }
  }
}

// Q by one bulk copy a panel (a query tile's packed rows are whole tokens of the group's heads)
// or gathered (a group of 6, which 128 rows do not divide into tokens), both on views of a
// larger q (head strides of 256 and 272 bytes: run() takes only multiples of 16 bytes, which
// BatchPrefillErrors tests), ragged and paged, both query tiles, odd lengths that end tiles
// mid-token.
TEST(PrefillHopper, StridedQueriesByBulkCopyOrGather) {
  SKIP_WITHOUT_HOPPER();
  for (const int pad : {0, 8}) {
    for (const int group : {4, 6}) {
      for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
        for (const int tile : {64, 128}) {
          Case c;
          c.q_lens = {1, 37, 129, 300};
          c.kv_lens = {70, 37, 200, 300};
          c.num_kv_heads = 2;
          c.num_qo_heads = 2 * group;
          c.kv = kv;
          c.query_tile = tile;
          c.q_dim_pad = pad;
          c.seed = static_cast<uint64_t>(pad * 100 + group * 10 + tile);
          SCOPED_TRACE(::testing::Message() << "pad " << pad << " group " << group << " tile "
                                            << tile << (kv == PrefillKV::kPaged ? " paged" : ""));
          check_hopper(c);
        }
      }
    }
  }
}

// A q whose head stride is not a multiple of 16 bytes (264 bytes: 4 elements of padding) is
// refused by name before any launch; the NaN-poisoned outputs stay as they were.
TEST(PrefillHopper, QueriesWithUnalignedStridesAreRefused) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.q_lens = {1, 37};
  c.kv_lens = {70, 37};
  c.num_kv_heads = 2;
  c.num_qo_heads = 8;
  c.q_dim_pad = 4;
  c.backend = PrefillBackend::kFA3;
  const Problem p = make_problem(c);
  BatchPrefill prefill(config_of(p));
  DeviceProblem d(p);
  plan(prefill, p, nullptr);
  EXPECT_FLARE_ERROR(d.run(prefill, p, nullptr), ErrorCode::kInvalidArgument,
                     "q needs a 16-byte aligned data pointer");
  d.download();
  EXPECT_EQ(testing::count_nan(d.o_host.view()), d.o_host.numel()) << "o written";
  EXPECT_EQ(testing::count_nan(d.lse_host.view()), d.lse_host.numel()) << "lse written";
}

TEST(PrefillHopper, RaggedF16Gqa8OddLengths) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.q_lens = {97, 1, 300, 7, 129};
  c.kv_lens = {97, 50, 511, 1023, 129};
  c.num_qo_heads = 16;
  c.num_kv_heads = 2;
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  check_hopper(c);
}

TEST(PrefillHopper, PagedPageSizes1And5AppendGqa7Hnd) {
  SKIP_WITHOUT_HOPPER();
  for (const int page_size : {1, 5, 16}) {
    for (const KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      Case c;
      c.q_lens = {128, 33, 5, 200};
      c.kv_lens = {2049, 33, 1023, 700};
      c.num_qo_heads = 7;
      c.num_kv_heads = 1;
      c.page_size = page_size;
      c.layout = layout;
      c.seed = static_cast<uint64_t>(page_size * 2 + static_cast<int>(layout));
      SCOPED_TRACE(::testing::Message()
                   << "page " << page_size << " layout " << static_cast<int>(layout));
      check_hopper(c);
    }
  }
}

// Pages of 64 rows and more arrive by bulk tensor copies, box by box (one page's rows each),
// except an item's last, partial tile and items that start mid-box (a window's), which gather.
TEST(PrefillHopper, PagesOf64To256RowsByBulkCopies) {
  SKIP_WITHOUT_HOPPER();
  for (const int page_size : {64, 128, 256}) {
    for (const KVLayout layout : {KVLayout::kNHD, KVLayout::kHND}) {
      Case c;
      c.q_lens = {128, 33, 5, 200, 1};
      c.kv_lens = {2049, 33, 1023, 700, 4096};
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.page_size = page_size;
      c.layout = layout;
      c.seed = static_cast<uint64_t>(page_size + static_cast<int>(layout));
      SCOPED_TRACE(::testing::Message()
                   << "page " << page_size << " layout " << static_cast<int>(layout));
      check_hopper(c);
    }
  }
  Case small;  // 64-row query tiles, fp16, padded page strides, no mask
  small.q_lens = {64, 70, 3};
  small.kv_lens = {640, 1000, 65};
  small.page_size = 64;
  small.query_tile = 64;
  small.dtype = DType::kF16;
  small.strided = true;
  small.mask = MaskMode::kNone;
  check_hopper(small);
  Case window;  // items start mid-box: gathered
  window.q_lens = {300, 17};
  window.kv_lens = {2000, 900};
  window.page_size = 64;
  window.window_left = 200;
  check_hopper(window);
  Case split;  // long requests split into chunks of whole pages, merged
  split.q_lens = {64, 100};
  split.kv_lens = {20000, 9000};
  split.num_qo_heads = 32;
  split.num_kv_heads = 8;
  split.page_size = 128;
  check_hopper(split);
  Case wide;  // head dim 256: KV tiles of 64 rows, two per page of 128
  wide.q_lens = {100, 7};
  wide.kv_lens = {1000, 130};
  wide.head_dim_qk = wide.head_dim_vo = 256;
  wide.page_size = 128;
  check_hopper(wide);
}

TEST(PrefillHopper, CustomMaskAndVariantFlags) {
  SKIP_WITHOUT_HOPPER();
  Case custom;
  custom.q_lens = {70, 9, 130};
  custom.kv_lens = {100, 300, 130};
  custom.mask = MaskMode::kCustom;
  custom.num_qo_heads = 4;
  custom.num_kv_heads = 1;
  check_hopper(custom);

  // Head dim 256 (the mask bits gathered before S = Q K^T is issued): paged at 128-token pages,
  // and ragged fp16 with ALiBi and a soft cap (FlashInfer's custom-mask test shape).
  Case wide = custom;
  wide.q_lens = {130, 9, 77, 200};
  wide.kv_lens = {500, 300, 77, 1000};
  wide.head_dim_qk = wide.head_dim_vo = 256;
  wide.num_qo_heads = 8;
  wide.num_kv_heads = 2;
  wide.page_size = 128;
  check_hopper(wide);
  wide.kv = PrefillKV::kRagged;
  wide.dtype = DType::kF16;
  wide.alibi = true;
  wide.soft_cap = 30.0f;
  wide.seed = 7;
  check_hopper(wide);

  Case flags;
  flags.q_lens = {300, 17, 129};
  flags.kv_lens = {900, 400, 129};
  flags.window_left = 127;
  flags.soft_cap = 30.0f;
  flags.alibi = true;
  check_hopper(flags);

  Case rope;
  rope.q_lens = {150, 64};
  rope.kv_lens = {400, 64};
  rope.rope = true;
  rope.kv = PrefillKV::kRagged;
  check_hopper(rope);
}

// ALiBi alone takes the affine-logits softmax (kernels/variant.cuh has_affine_logits: the row's
// term once a tile, two FMAs a logit), built in and as a user variant that declares the hook:
// keys thousands of positions from the diagonal, GQA 4, paged and ragged, odd lengths.
TEST(PrefillHopper, AlibiAloneBuiltInAndAsAnAffineUserVariant) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.q_lens = {300, 17, 129, 1};
  c.kv_lens = {2100, 400, 129, 5000};
  c.num_qo_heads = 16;
  c.num_kv_heads = 4;
  c.alibi = true;
  check_hopper(c);
  c.kv = PrefillKV::kRagged;
  c.dtype = DType::kF16;
  c.seed = 11;
  check_hopper(c);

  HostTensor slopes(DType::kF32, {16});
  for (int h = 0; h < 16; ++h)
    slopes.data<float>()[h] = 0.02f + 0.41f * static_cast<float>(h % 7) / 7;
  const gpu_testing::DeviceCopy device_slopes = gpu_testing::to_device(slopes);
  c.alibi_slopes = slopes.view();
  c.variant = testing::user_alibi_slopes();
  c.variant_tensors = {device_slopes.view};
  check_hopper(c);
  c.kv = PrefillKV::kPaged;
  check_hopper(c);
}

TEST(PrefillHopper, LongCacheSplitsKvAndMerges) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.q_lens = {64, 100};
  c.kv_lens = {20000, 9000};
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  check_hopper(c);
}

// Two CTAs take every work item in turn (dozens each; with the window some warpgroups see no
// tile of an item): the producer's two hand-off slots, the Q tile and the stages that run on
// across items are each reused many times, ragged and paged, at both query tiles.
TEST(PrefillHopper, FewCtasTakeManyItemsInTurn) {
  SKIP_WITHOUT_HOPPER();
  for (const int tile : {128, 64}) {
    for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
      Case c;
      c.q_lens = {300, 1, 517, 129, 64, 1000};
      c.kv_lens = {300, 90, 700, 129, 2000, 1000};
      c.num_qo_heads = 8;
      c.num_kv_heads = 2;
      c.kv = kv;
      c.query_tile = tile;
      c.window_left = 150;
      c.num_sms_to_use = 2;
      c.seed = static_cast<uint64_t>(tile + static_cast<int>(kv));
      SCOPED_TRACE(::testing::Message() << "tile " << tile << " kv " << static_cast<int>(kv));
      check_hopper(c);
    }
  }
}

// Soft-cap in bfloat16 takes the fixed-offset softmax up to a cap of 54.7 (kernels/variant.cuh
// has_logits_bound: cap 50 here, probabilities between 2^-112 and 2^32) and the running max past
// it (cap 100). Requests 0 and 1 hold one key each, with q = -256 k and q = 256 k: their one logit
// sits at -cap and +cap, the ends of the fixed offset's range (o must be that key's v, lse
// -+cap); the others are random, at an sm_scale that saturates the tanh at both ends of a row
// (4) and one that does not (the default), with a window of 90 keys, ragged and paged, both
// query tiles.
TEST(PrefillHopper, SoftCapFixedOffsetAtTheEndsOfItsRange) {
  SKIP_WITHOUT_HOPPER();
  for (const float cap : {50.0f, 100.0f}) {
    for (const float sm_scale : {4.0f, 0.0f}) {
      for (const int tile : {128, 64}) {
        for (const PrefillKV kv : {PrefillKV::kRagged, PrefillKV::kPaged}) {
          Case c;
          c.q_lens = {1, 1, 70, 200};
          c.kv_lens = {1, 1, 301, 600};
          c.num_qo_heads = 8;
          c.num_kv_heads = 2;
          c.soft_cap = cap;
          c.sm_scale = sm_scale;
          c.window_left = 90;  // the window's key checks too
          c.query_tile = tile;
          c.kv = kv;
          c.backend = PrefillBackend::kFA3;
          c.seed = static_cast<uint64_t>(cap + tile + static_cast<int>(kv));
          SCOPED_TRACE(::testing::Message() << "cap " << cap << " sm_scale " << sm_scale << " tile "
                                            << tile << " kv " << static_cast<int>(kv));
          Problem p = make_problem(c);
          put_logits_at_the_cap(p);
          BatchPrefill prefill(config_of(p));
          DeviceProblem device(p);
          plan(prefill, p, nullptr);
          device.run(prefill, p, nullptr, RunOptions{});
          device.download();
          EXPECT_TRUE(prefill.last_tiles().warpgroup);
          if (sm_scale == 0.0f) {
            expect_matches(p, device);
            continue;
          }
          // Saturated, tanh.approx's error (2^-11: a logit of 50 moves by 0.024) puts o up to
          // ~0.022 from the float64 reference within the 90-key window, on either softmax: the
          // built-in against the same math on a running max (a user variant that declares no
          // bound), each against the reference.
          BatchPrefillConfig running_config = config_of(p);
          running_config.variant = testing::user_soft_cap(/*bounded=*/false);
          running_config.params.logits_soft_cap = 0.0f;
          running_config.params.window_left = -1;
          BatchPrefill running(running_config);
          DeviceProblem running_device(p);
          plan(running, p, nullptr);
          RunOptions options;
          options.variant_scalars = {&cap, 1};
          running_device.run(running, p, nullptr, options);
          running_device.download();
          const testing::ErrorStats built_in =
              testing::error_stats(device.o_host.view(), p.o_ref.view());
          const testing::ErrorStats running_max =
              testing::error_stats(running_device.o_host.view(), p.o_ref.view());
          EXPECT_LE(built_in.max_abs, 1.5 * tolerance_abs(c.dtype)) << built_in;
          EXPECT_LE(built_in.relative_l2, tolerance_l2(c.dtype)) << built_in;
          EXPECT_LE(built_in.relative_l2, 1.25 * running_max.relative_l2 + 1e-4)
              << built_in << " vs the running max's " << running_max;
          const testing::ErrorStats lse =
              testing::error_stats(device.lse_host.view(), p.lse_ref.view());
          EXPECT_LE(lse.max_abs, kLseTolerance) << lse;
        }
      }
    }
  }
}

TEST(PrefillHopper, LargeLogitsRescaleMidStream) {
  SKIP_WITHOUT_HOPPER();
  Case c;
  c.q_lens = {300};
  c.kv_lens = {1000};
  c.sm_scale = 1.0f;  // logits of tens: the running max moves by more than the threshold
  check_hopper(c);
}

}  // namespace
}  // namespace flare
