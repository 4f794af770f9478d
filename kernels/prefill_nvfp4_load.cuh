// NVFP4 K/V for the mma.sync family (T::kNvfp4): the code and scale rows of a tile copied as
// they are into a raw stage, then converted in shared memory into the 16-bit stage the MMAs read
// (include/flare/format/nvfp4.h for the format; kernels/prefill_load.cuh for 16-bit K/V).
#pragma once

#include "prefill_load.cuh"

namespace flare::prefill {

// NVFP4 K/V (T::kNvfp4): tile `tile`'s code rows (D / 2 bytes) and scale rows (D / 16 bytes) of K
// and V into raw stage `stage` as they are, rows past the item (and rows of out-of-range page
// ids) zero-filled: zero codes decode to 0. Copies of 16 bytes, else 8 or 4 where a row is not
// whole 16-byte pieces (scale rows of 4, 8 or 12 bytes; run() checks the alignments).
template <int kRowBytes, int kWidest>
struct Nvfp4RowCopies {
  static constexpr int kBytes = kRowBytes % kWidest == 0 ? kWidest : kRowBytes % 8 == 0 ? 8 : 4;
  static constexpr int kCopies = kRowBytes / kBytes;
  static_assert(kRowBytes % kBytes == 0 && (kBytes == 4 || kBytes == 8 || kBytes == 16),
                "whole copies of 4, 8 or 16 bytes");
};
template <int kRowBytes, int kWidest = 16>
__device__ __forceinline__ void copy_nvfp4_rows(const PrefillParams& p, const ItemGeometry& g,
                                                int start, const int* page_ids, unsigned dst,
                                                const unsigned char* base, long long stride_page,
                                                long long stride_slot, long long stride_head) {
  using Copies = Nvfp4RowCopies<kRowBytes, kWidest>;
#pragma unroll 1
  for (int index = load_thread(); index < T::kKvTile * Copies::kCopies; index += T::kLoadThreads) {
    const int row = index / Copies::kCopies;
    const int part = index % Copies::kCopies;
    const int pos = start + row;
    const long long element =
        pos < g.kv_hi ? kv_element(p, g, pos, row, page_ids, stride_page, stride_slot, stride_head)
                      : -1;
    const bool valid = element >= 0;
    cp_async_ca<Copies::kBytes>(dst + row * kRowBytes + part * Copies::kBytes,
                                base + (valid ? element + part * Copies::kBytes : 0), valid);
  }
}
// Code rows of 16-byte copies, or of 8 where run() found a code row only 8-byte aligned
// (p.nvfp4_narrow_codes: rows packed with their scales, as FlashInfer's strided views are).
template <int kRowBytes>
__device__ __forceinline__ void copy_nvfp4_codes(const PrefillParams& p, const ItemGeometry& g,
                                                 int start, const int* page_ids, unsigned dst,
                                                 const unsigned char* base, long long stride_page,
                                                 long long stride_slot, long long stride_head) {
  if (p.nvfp4_narrow_codes != 0) {
    copy_nvfp4_rows<kRowBytes, 8>(p, g, start, page_ids, dst, base, stride_page, stride_slot,
                                  stride_head);
  } else {
    copy_nvfp4_rows<kRowBytes, 16>(p, g, start, page_ids, dst, base, stride_page, stride_slot,
                                   stride_head);
  }
}
// A tile whose rows all lie in the item: one copy unit per (row, tensor), the unit's code row in
// pieces of kCodeBytes and its scale row in pieces of the widest size dividing it. Units
// [0, kKvTile) are K's rows, the rest V's; thread t takes unit t / kThreadsPerUnit (its code
// pieces j with j % kThreadsPerUnit == t % kThreadsPerUnit, the scales by the first of them) or
// units t + i * kLoadThreads, so that a warp copies rows of one tensor. A unit's pieces share its
// page id, slot and row address: one address a unit, then one cp.async a piece at a constant
// offset, where copy_nvfp4_rows derives an element offset and range check per piece (27% of the
// kernel's instructions at b16 q16 kv4096: ncu, docs/perf.md NVFP4 prefill).
template <int kCodeBytes>
struct Nvfp4FullTile {
  static constexpr int kUnits = 2 * T::kKvTile;
  static constexpr bool kThreadsCover = T::kLoadThreads % kUnits == 0;
  static constexpr int kThreadsPerUnit = kThreadsCover ? T::kLoadThreads / kUnits : 1;
  static constexpr int kUnitsPerThread = kThreadsCover ? 1 : kUnits / T::kLoadThreads;
  template <int kHeadDim>
  static constexpr bool kPiecesSplit = (kHeadDim / 2 / kCodeBytes) % kThreadsPerUnit == 0;
  static constexpr bool kApplies = (kThreadsCover || kUnits % T::kLoadThreads == 0) &&
                                   (!kThreadsCover || (T::kKvTile * kThreadsPerUnit) % 32 == 0) &&
                                   kPiecesSplit<T::kHeadDimQK> && kPiecesSplit<T::kHeadDimVO>;
};

// One unit: KV position `pos` (page id `page` when paged) of one tensor; `sub` the thread's
// share of its code pieces. Returns whether the page id was out of range (the row zero-filled).
template <int kHeadDim, int kCodeBytes, int kThreadsPerUnit>
__device__ __forceinline__ bool copy_nvfp4_unit(const PrefillParams& p, const ItemGeometry& g,
                                                int pos, int page, int sub, unsigned codes_dst,
                                                unsigned scales_dst, const unsigned char* codes,
                                                const unsigned char* scales,
                                                const long long (&code_strides)[3],
                                                const long long (&scale_strides)[3]) {
  constexpr int kCodePieces = kHeadDim / 2 / kCodeBytes;
  using Scales = Nvfp4RowCopies<kHeadDim / 16, 16>;
  bool valid = true;
  long long code_offset, scale_offset;
  if constexpr (T::kPaged) {
    valid = static_cast<unsigned>(page) < static_cast<unsigned>(p.num_pages);
    const long long slot = pos % T::kPageSize;
    code_offset = page * code_strides[0] + slot * code_strides[1] + g.kv_head * code_strides[2];
    scale_offset = page * scale_strides[0] + slot * scale_strides[1] + g.kv_head * scale_strides[2];
  } else {
    const long long row = g.kv_base + pos;
    code_offset = row * code_strides[0] + g.kv_head * code_strides[2];
    scale_offset = row * scale_strides[0] + g.kv_head * scale_strides[2];
  }
  const unsigned char* code_row = codes + (valid ? code_offset : 0) + sub * kCodeBytes;
  const unsigned code_dst = codes_dst + sub * kCodeBytes;
#pragma unroll
  for (int j = 0; j < kCodePieces / kThreadsPerUnit; ++j) {
    constexpr int kStep = kThreadsPerUnit * kCodeBytes;
    cp_async_ca<kCodeBytes>(code_dst + j * kStep, code_row + j * kStep, valid);
  }
  if (sub == 0) {
    const unsigned char* scale_row = scales + (valid ? scale_offset : 0);
#pragma unroll
    for (int j = 0; j < Scales::kCopies; ++j) {
      cp_async_ca<Scales::kBytes>(scales_dst + j * Scales::kBytes, scale_row + j * Scales::kBytes,
                                  valid);
    }
  }
  return !valid;
}

template <int kCodeBytes>
__device__ __forceinline__ void copy_nvfp4_full_tile(const PrefillParams& p, const ItemGeometry& g,
                                                     int start, const int* page_ids, unsigned raw) {
  using Tile = Nvfp4FullTile<kCodeBytes>;
  constexpr int kTpu = Tile::kThreadsPerUnit;
  const int tid = load_thread();
  const int sub = tid % kTpu;
  bool unread = false;
#pragma unroll
  for (int i = 0; i < Tile::kUnitsPerThread; ++i) {
    const int unit = tid / kTpu + i * T::kLoadThreads;
    const bool is_v = unit >= T::kKvTile;  // warp-uniform (Nvfp4FullTile)
    const int row = is_v ? unit - T::kKvTile : unit;
    const int page = T::kPaged ? page_ids[row] : 0;
    if (!is_v) {
      unread |= copy_nvfp4_unit<T::kHeadDimQK, kCodeBytes, kTpu>(
          p, g, start + row, page, sub, raw + row * (T::kHeadDimQK / 2),
          raw + T::kRawKScales + row * (T::kHeadDimQK / 16), static_cast<const unsigned char*>(p.k),
          p.k_scales, {p.k_stride_page, p.k_stride_slot, p.k_stride_head},
          {p.k_scale_stride_page, p.k_scale_stride_slot, p.k_scale_stride_head});
    } else {
      unread |= copy_nvfp4_unit<T::kHeadDimVO, kCodeBytes, kTpu>(
          p, g, start + row, page, sub, raw + T::kRawVCodes + row * (T::kHeadDimVO / 2),
          raw + T::kRawVScales + row * (T::kHeadDimVO / 16), static_cast<const unsigned char*>(p.v),
          p.v_scales, {p.v_stride_page, p.v_stride_slot, p.v_stride_head},
          {p.v_scale_stride_page, p.v_scale_stride_slot, p.v_scale_stride_head});
    }
  }
  if constexpr (T::kPaged) {
    if (unread) report_tile_pages(p, g, start, page_ids);  // cold
  }
}

// Tile `tile`'s K and V code and scale rows into raw stage `raw_stage` (convert_landed_nvfp4 makes
// the 16-bit stage once they land), page ids from slot tile % kPageIdSlots.
__device__ __forceinline__ void issue_kv_nvfp4(const PrefillParams& p, const ItemGeometry& g,
                                               int tile, int raw_stage, unsigned char* smem) {
  const unsigned raw = shared_address(smem + T::kRawOffset + raw_stage * T::kRawStageBytes);
  const int* page_ids = reinterpret_cast<const int*>(smem + T::kPageIdsOffset) +
                        (tile % T::kPageIdSlots) * T::kKvTile;
  const int start = g.kv_lo + tile * T::kKvTile;
  if (start + T::kKvTile <= g.kv_hi) {  // CTA-uniform
    if constexpr (Nvfp4FullTile<16>::kApplies && Nvfp4FullTile<8>::kApplies) {
      if (p.nvfp4_narrow_codes != 0) {
        copy_nvfp4_full_tile<8>(p, g, start, page_ids, raw);
      } else {
        copy_nvfp4_full_tile<16>(p, g, start, page_ids, raw);
      }
      return;
    }
  }
  const auto* k = static_cast<const unsigned char*>(p.k);
  const auto* v = static_cast<const unsigned char*>(p.v);
  copy_nvfp4_codes<T::kHeadDimQK / 2>(p, g, start, page_ids, raw, k, p.k_stride_page,
                                      p.k_stride_slot, p.k_stride_head);
  copy_nvfp4_rows<T::kHeadDimQK / 16>(p, g, start, page_ids, raw + T::kRawKScales, p.k_scales,
                                      p.k_scale_stride_page, p.k_scale_stride_slot,
                                      p.k_scale_stride_head);
  copy_nvfp4_codes<T::kHeadDimVO / 2>(p, g, start, page_ids, raw + T::kRawVCodes, v,
                                      p.v_stride_page, p.v_stride_slot, p.v_stride_head);
  copy_nvfp4_rows<T::kHeadDimVO / 16>(p, g, start, page_ids, raw + T::kRawVScales, p.v_scales,
                                      p.v_scale_stride_page, p.v_scale_stride_slot,
                                      p.v_scale_stride_head);
}

// NVFP4: a landed raw stage into a 16-bit stage in the swizzled layout the MMAs read, at 2^-8
// of the values (decode_utils.cuh nvfp4_word_to_16bit: one exact product a pair; score_scale and
// output_scale take the 2^8 back): a 16-value block (8 code bytes, one e4m3 scale) to two
// 16-byte chunks per step, by the loading threads (the CTA, or the Hopper family's producer).
// Each thread keeps one block column where the threads cover whole rows 8 at a time (the
// swizzles repeat every 8 rows: addresses advance by a constant), and stores its two chunks in
// the order that puts a quarter warp's stores in 8 distinct bank groups of the mma.sync layout
// (blocks 4-7 of every 8 high chunk first). The global scales are run()'s k_scale / v_scale, as
// for 16-bit K/V.
__device__ __forceinline__ void convert_nvfp4_block(uint2 word, unsigned char scale_bits,
                                                    bool high_first, unsigned first,
                                                    unsigned second) {
  const unsigned factor2 = nvfp4_scale2<T::kCode>(scale_bits);
  unsigned a[4], b[4];
  nvfp4_word_to_16bit<T::kCode>(high_first ? word.y : word.x, factor2, a);
  nvfp4_word_to_16bit<T::kCode>(high_first ? word.x : word.y, factor2, b);
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(first), "r"(a[0]), "r"(a[1]),
               "r"(a[2]), "r"(a[3])
               : "memory");
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(second), "r"(b[0]), "r"(b[1]),
               "r"(b[2]), "r"(b[3])
               : "memory");
}
// A block's code word and scale byte (read before the stores of the blocks converted ahead of
// it: the stores' "memory" clobber keeps later loads from moving above them).
__device__ __forceinline__ uint2 nvfp4_block_word(const unsigned char* codes) {
  return *reinterpret_cast<const uint2*>(codes);
}
template <int kHeadDim, int kRowBytes16>
__device__ __forceinline__ void convert_nvfp4_rows(const unsigned char* codes,
                                                   const unsigned char* scales, unsigned dst) {
  constexpr int kBlocks = kHeadDim / 16;
  constexpr int kCodeBytes = kHeadDim / 2;
  if constexpr (T::kLoadThreads % kBlocks == 0 && (T::kLoadThreads / kBlocks) % 8 == 0) {
    constexpr int kRowStep = T::kLoadThreads / kBlocks;
    static_assert(T::kWarpgroup || kRowBytes16 % 128 == 0,
                  "mma::swizzled_offset repeats every 8 rows");
    const int block = load_thread() % kBlocks;
    const int row0 = load_thread() / kBlocks;
    const bool high_first = (block & 4) != 0;
    const unsigned lo = dst + tile_offset<kRowBytes16, T::kKvTile>(row0, 2 * block);
    const unsigned hi = dst + tile_offset<kRowBytes16, T::kKvTile>(row0, 2 * block + 1);
    const unsigned first = high_first ? hi : lo;
    const unsigned second = high_first ? lo : hi;
    // Both layouts' swizzles repeat every 8 rows: kRowStep rows on is a constant offset.
    const unsigned step = tile_offset<kRowBytes16, T::kKvTile>(kRowStep, 0) -
                          tile_offset<kRowBytes16, T::kKvTile>(0, 0);
    // Batches of steps where registers allow (one m16 tile a warp): a batch's shared loads are
    // issued together, then its blocks converted and stored, so the loads' latency is paid once
    // a batch instead of once a step (ncu: the scale byte's load was the producer's top stall).
    constexpr int kSteps = T::kKvTile / kRowStep;
    constexpr int kBatch = T::kMmaQ == 1 ? (kSteps < 4 ? kSteps : 4) : 1;
    static_assert(kSteps % kBatch == 0, "whole batches");
#pragma unroll 1
    for (int i0 = 0; i0 < kSteps; i0 += kBatch) {
      uint2 words[kBatch];
      unsigned char scale_bits[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int row = row0 + (i0 + j) * kRowStep;
        words[j] = nvfp4_block_word(codes + row * kCodeBytes + block * 8);
        scale_bits[j] = scales[row * kBlocks + block];
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        convert_nvfp4_block(words[j], scale_bits[j], high_first, first + (i0 + j) * step,
                            second + (i0 + j) * step);
      }
    }
  } else {
#pragma unroll 1
    for (int index = load_thread(); index < T::kKvTile * kBlocks; index += T::kLoadThreads) {
      const int row = index / kBlocks;
      const int block = index % kBlocks;
      convert_nvfp4_block(nvfp4_block_word(codes + row * kCodeBytes + block * 8),
                          scales[row * kBlocks + block], false,
                          dst + tile_offset<kRowBytes16, T::kKvTile>(row, 2 * block),
                          dst + tile_offset<kRowBytes16, T::kKvTile>(row, 2 * block + 1));
    }
  }
}
// Raw stage `raw_stage` (landed) into 16-bit stage `stage`: its K half (kK) and V half (kV).
template <bool kK = true, bool kV = true>
__device__ __forceinline__ void convert_landed_nvfp4(int raw_stage, int stage,
                                                     unsigned char* smem) {
  const unsigned char* raw = smem + T::kRawOffset + raw_stage * T::kRawStageBytes;
  const unsigned k_dst = shared_address(smem + T::kQBytes + stage * T::kStageBytes);
  if constexpr (kK)
    convert_nvfp4_rows<T::kHeadDimQK, T::kQKRowBytes>(raw, raw + T::kRawKScales, k_dst);
  if constexpr (kV) {
    convert_nvfp4_rows<T::kHeadDimVO, T::kVRowBytes>(raw + T::kRawVCodes, raw + T::kRawVScales,
                                                     k_dst + T::kKBytes);
  }
}

}  // namespace flare::prefill
