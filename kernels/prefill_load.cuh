// The loading module of the prefill kernel, the only place ragged and paged KV differ (paper
// 001 §3.2.1): 16-byte cp.async copies of Q and K/V rows into swizzled shared rows, page ids.
#pragma once

#include "prefill_traits.cuh"

namespace flare::prefill {

// Stand-in page id for an entry past the end of kv_indices (never a valid page: the readers'
// range check turns it into a zero-filled row; page_in_range tells it from a stored id by the
// entry).
constexpr int kUnreadPage = 0x7fffffff;

// Page ids of tile `tile`, one per KV row, into page-id slot tile % kPageIdSlots with 4-byte
// cp.async (rows past the item read nothing and get 0): they land with the copy group they are
// committed in, before the copies that read them are issued (prefill_tile_lead), and occupy no
// register meanwhile.
// The ids are the caller's data: readers range-check them (load_row_pages, kv_element).
__device__ __forceinline__ void issue_page_ids(const PrefillParams& p, const ItemGeometry& g,
                                               int tile, unsigned char* smem) {
  if (load_thread() < T::kKvTile) {
    const int pos = g.kv_lo + tile * T::kKvTile + load_thread();
    const bool valid = pos < g.kv_hi;
    const long long entry = g.kv_base + pos / T::kPageSize;
    const unsigned dst = shared_address(smem + T::kPageIdsOffset) +
                         ((tile % T::kPageIdSlots) * T::kKvTile + load_thread()) * 4;
    if (valid && entry >= p.num_indices) {
      record_index_error(p.index_error, kIndexErrorEntry, g.request, entry, -1);
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(kUnreadPage) : "memory");
      return;
    }
    const int* src = p.kv_indices + (valid ? entry : 0);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0)
                 : "memory");
  }
}

// Whether page id `page` (of the row at KV position `pos`) lies in the cache; records it when
// not (an entry past kv_indices was recorded where it was issued).
__device__ __forceinline__ bool page_in_range(const PrefillParams& p, const ItemGeometry& g,
                                              int pos, int page) {
  if (static_cast<unsigned>(page) < static_cast<unsigned>(p.num_pages)) return true;
  const long long entry = g.kv_base + pos / T::kPageSize;
  if (entry < p.num_indices)
    record_index_error(p.index_error, kIndexErrorPageId, g.request, entry, page);
  return false;
}

// Element offset of KV position `pos` (row `row` of its tile) under this item's KV head; -1
// (a zero-filled row) for a page id out of range.
__device__ __forceinline__ long long kv_element(const PrefillParams& p, const ItemGeometry& g,
                                                int pos, int row, const int* page_ids,
                                                long long stride_page, long long stride_slot,
                                                long long stride_head) {
  if constexpr (T::kPaged) {
    const int page = page_ids[row];
    if (!page_in_range(p, g, pos, page)) return -1;
    return page * stride_page + (pos % T::kPageSize) * stride_slot + g.kv_head * stride_head;
  } else {
    return (g.kv_base + pos) * stride_page + g.kv_head * stride_head;
  }
}

// Rows [0, kRows) of 16-byte chunks into swizzled shared rows; rows where element(row) < 0
// are zero-filled (their probabilities are 0, and 0 * NaN would be NaN). When the chunks of a
// row divide the CTA, each thread copies one fixed chunk of every kLoadThreads / kChunks-th row
// (no division per copy).
template <int kRows, int kChunks, class ElementOf>
__device__ __forceinline__ void copy_rows(unsigned dst, const void* base, int tid,
                                          ElementOf element_of) {
  const unsigned char* src = static_cast<const unsigned char*>(base);
  if constexpr (T::kLoadThreads % kChunks == 0) {
    constexpr int kRowStep = T::kLoadThreads / kChunks;
    const int chunk = tid % kChunks;
    // Not unrolled: the copies run while the O accumulators hold 128 registers, and unrolled
    // address arithmetic tips the QK^T peak that follows into spills (measured with ptxas).
#pragma unroll 1
    for (int row = tid / kChunks; row < kRows; row += kRowStep) {
      const long long element = element_of(row);
      const bool valid = element >= 0;
      cp_async_16(dst + tile_offset<kChunks * 16, kRows>(row, chunk),
                  src + (valid ? element * 2 + chunk * 16 : 0), valid);
    }
  } else {
#pragma unroll 1
    for (int index = tid; index < kRows * kChunks; index += T::kLoadThreads) {
      const int row = index / kChunks;
      const int chunk = index % kChunks;
      const long long element = element_of(row);
      const bool valid = element >= 0;
      cp_async_16(dst + tile_offset<kChunks * 16, kRows>(row, chunk),
                  src + (valid ? element * 2 + chunk * 16 : 0), valid);
    }
  }
}

// A tile whose rows are all visible (every tile of an item but possibly its last): each thread
// copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep, i < kCopies. Ragged sources
// advance by a constant stride and paged ones by one page id per row (read from shared memory
// once for K and V), so a 16-byte copy costs 2-5 instructions instead of copy_rows' per-row
// bounds check and element computation (which made the copies ~45% of the kernel's
// instructions: ncu, docs/perf.md prefill v3).
template <int kChunks>
struct FullTileRows {
  static constexpr int kRowStep = T::kLoadThreads / kChunks;
  static constexpr int kCopies = T::kKvTile / kRowStep;
  // (Checked where a copy uses it: the type is named for head dims issue_kv never copies this
  // way, e.g. 192 = 24 chunks.)
  static constexpr bool kExact = T::kLoadThreads % kChunks == 0 && T::kKvTile % kRowStep == 0;
};

// Paged: the page ids of this thread's rows of the tile. An id out of range (the caller's
// data, never trusted) becomes 0: the row reads page 0 of the cache (run() requires one) and
// nothing outside it; the return says whether one was (report_tile_pages names it). Selects,
// no branch: a branch here, or a predicate per copy in copy_full_tile, cost the paged kernel
// ~10% (H200).
template <int kChunks>
__device__ __forceinline__ bool load_row_pages(const PrefillParams& p, const int* page_ids,
                                               int (&pages)[FullTileRows<kChunks>::kCopies]) {
  const int row0 = load_thread() / kChunks;
  bool unread = false;
#pragma unroll
  for (int i = 0; i < FullTileRows<kChunks>::kCopies; ++i) {
    const int page = page_ids[row0 + i * FullTileRows<kChunks>::kRowStep];
    const bool out = static_cast<unsigned>(page) >= static_cast<unsigned>(p.num_pages);
    unread |= out;
    pages[i] = out ? 0 : page;
  }
  return unread;
}

// Records the first out-of-range page id of a full tile (whose first KV position is `start`)
// once load_row_pages flagged one: cold, outside the copies.
__device__ __forceinline__ void report_tile_pages(const PrefillParams& p, const ItemGeometry& g,
                                                  int start, const int* page_ids) {
  for (int row = 0; row < T::kKvTile; ++row) {
    if (!page_in_range(p, g, start + row, page_ids[row])) return;
  }
}

// kv_row: ragged, the tile's first KV token; paged, its first position. kv_head: the item's.
// pages: paged, load_row_pages' ids (unused for ragged KV).
template <int kChunks>
__device__ __forceinline__ void copy_full_tile(unsigned dst, const void* base, long long kv_row,
                                               int kv_head,
                                               const int (&pages)[FullTileRows<kChunks>::kCopies],
                                               long long stride_page, long long stride_slot,
                                               long long stride_head) {
  constexpr int kRowStep = FullTileRows<kChunks>::kRowStep;
  constexpr int kCopies = FullTileRows<kChunks>::kCopies;
  static_assert(FullTileRows<kChunks>::kExact, "whole rows per pass");
  const int tid = load_thread();
  const int row0 = tid / kChunks;
  const unsigned char* head =
      static_cast<const unsigned char*>(base) + kv_head * stride_head * 2 + (tid % kChunks) * 16;
  if constexpr (T::kPaged) {
    // Byte strides of a page and a slot fit 32 bits (BatchPrefill::run checks), so a row's
    // address is one 32x32->64 multiply-add of its page id on the slot's address.
    const int page_bytes = static_cast<int>(stride_page) * 2;
    const int slot_bytes = static_cast<int>(stride_slot) * 2;
    // Row i's slot repeats with period kPeriod (the page size and the row step nest for the
    // usual power-of-two sizes): one slot address per period, then one multiply-add per copy.
    constexpr int kPeriod = kRowStep % T::kPageSize == 0   ? 1
                            : T::kPageSize % kRowStep == 0 ? T::kPageSize / kRowStep
                                                           : kCopies;
    constexpr int kSlots = kPeriod < kCopies ? kPeriod : kCopies;
    const unsigned first_slot = static_cast<unsigned>(static_cast<int>(kv_row) + row0);
    const unsigned char* slot_address[kSlots];
#pragma unroll
    for (int j = 0; j < kSlots; ++j) {
      const int slot = static_cast<int>((first_slot + j * kRowStep) % T::kPageSize);
      slot_address[j] = head + slot * slot_bytes;
    }
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int row = row0 + i * kRowStep;
      cp_async_16(dst + tile_offset<kChunks * 16, T::kKvTile>(row, tid % kChunks),
                  slot_address[i % kSlots] + static_cast<long long>(pages[i]) * page_bytes);
    }
  } else {
    const unsigned char* src = head + (kv_row + row0) * stride_page * 2;
    const long long step = kRowStep * stride_page * 2;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      cp_async_16(dst + tile_offset<kChunks * 16, T::kKvTile>(row0 + i * kRowStep, tid % kChunks),
                  src + i * step);
    }
  }
}

// The Hopper family's producer (40 registers) on a paged tile whose rows are all visible: each
// thread copies chunk tid % kChunks of rows tid / kChunks + i * kRowStep in groups of up to 8
// rows, the group's page ids read from shared memory before its copies are issued (one round
// trip a group: copy_rows reads an id and computes a row's address before each copy, a shared
// load's latency per 16 bytes). Ids out of range read page 0 (load_row_pages' rule); the return
// says whether one was. kv_pos: the tile's first KV position.
template <int kChunks>
__device__ __forceinline__ bool copy_paged_tile_grouped(const PrefillParams& p, unsigned dst,
                                                        const void* base, int kv_pos,
                                                        int kv_head, const int* page_ids,
                                                        long long stride_page,
                                                        long long stride_slot,
                                                        long long stride_head) {
  using Rows = FullTileRows<kChunks>;
  constexpr int kGroup = Rows::kCopies < 8 ? Rows::kCopies : 8;
  static_assert(Rows::kExact && Rows::kCopies % kGroup == 0, "whole groups of whole rows");
  const int tid = load_thread();
  const int row0 = tid / kChunks;
  const unsigned char* head =
      static_cast<const unsigned char*>(base) + kv_head * stride_head * 2 + (tid % kChunks) * 16;
  // Byte strides of a page and a slot fit 32 bits (BatchPrefill::run checks), ids in range are
  // below num_pages and positions are not negative: unsigned 32-bit products, one wide
  // multiply-add per copy.
  const unsigned page_bytes = static_cast<unsigned>(stride_page) * 2u;
  const unsigned slot_bytes = static_cast<unsigned>(stride_slot) * 2u;
  bool unread = false;
#pragma unroll
  for (int first = 0; first < Rows::kCopies; first += kGroup) {
    unsigned pages[kGroup];
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const unsigned page = page_ids[row0 + (first + j) * Rows::kRowStep];
      const bool out = page >= static_cast<unsigned>(p.num_pages);
      unread |= out;
      pages[j] = out ? 0u : page;
    }
#pragma unroll
    for (int j = 0; j < kGroup; ++j) {
      const int row = row0 + (first + j) * Rows::kRowStep;
      const unsigned slot = static_cast<unsigned>(kv_pos + row) % T::kPageSize;
      const unsigned long long offset =
          static_cast<unsigned long long>(pages[j]) * page_bytes + slot * slot_bytes;
      cp_async_16(dst + tile_offset<kChunks * 16, T::kKvTile>(row, tid % kChunks), head + offset);
    }
  }
  return unread;
}

// Tile `tile` of the item into stage `stage` (the mma.sync family's tile % kStages; the Hopper
// family's stages run on across items), its page ids from slot tile % kPageIdSlots. kCopyK /
// kCopyV: which halves of the stage (the Hopper family's producer copies them apart).
template <bool kCopyK = true, bool kCopyV = true>
__device__ __forceinline__ void issue_kv(const PrefillParams& p, const ItemGeometry& g, int tile,
                                         int stage, unsigned char* smem) {
  static_assert(!T::kNvfp4, "NVFP4 tiles: prefill_nvfp4_load.cuh issue_kv_nvfp4");
  const unsigned k_dst = shared_address(smem + T::kQBytes + stage * T::kStageBytes);
  const int* page_ids = reinterpret_cast<const int*>(smem + T::kPageIdsOffset) +
                        (tile % T::kPageIdSlots) * T::kKvTile;
  const int start = g.kv_lo + tile * T::kKvTile;
  // The Hopper family's producer (40 registers, kernels/prefill_hopper.cuh) copies paged tiles
  // a group of rows at a time: the full-tile path's page ids held in registers spill there.
  if constexpr (T::kWarpgroup && T::kPaged && FullTileRows<T::kQKChunks>::kExact &&
                FullTileRows<T::kVChunks>::kExact) {
    if (start + T::kKvTile <= g.kv_hi) {  // CTA-uniform, as below
      const int kv_head = g.kv_head;
      bool unread = false;
      if constexpr (kCopyK) {
        unread |= copy_paged_tile_grouped<T::kQKChunks>(p, k_dst, p.k, start, kv_head, page_ids,
                                                        p.k_stride_page, p.k_stride_slot,
                                                        p.k_stride_head);
      }
      if constexpr (kCopyV) {
        unread |= copy_paged_tile_grouped<T::kVChunks>(p, k_dst + T::kKBytes, p.v, start,
                                                       kv_head, page_ids, p.v_stride_page,
                                                       p.v_stride_slot, p.v_stride_head);
      }
      if (unread) report_tile_pages(p, g, start, page_ids);
      return;
    }
  }
  if constexpr ((!T::kWarpgroup || !T::kPaged) && T::kLoadThreads % T::kQKChunks == 0 &&
                T::kLoadThreads % T::kVChunks == 0) {
    // CTA-uniform: only an item's last tile can hold rows past kv_hi.
    if (start + T::kKvTile <= g.kv_hi) {
      // g and the page ids live in shared memory and the copies' asm clobbers memory: read them
      // once, before the copies (a read after them waits behind them in the memory queue).
      const long long kv_row = T::kPaged ? start : g.kv_base + start;
      const int kv_head = g.kv_head;
      int k_pages[FullTileRows<T::kQKChunks>::kCopies] = {};
      int v_pages[FullTileRows<T::kVChunks>::kCopies] = {};
      bool unread = false;
      if constexpr (T::kPaged) {
        unread = load_row_pages<T::kQKChunks>(p, page_ids, k_pages);
        if constexpr (T::kVChunks == T::kQKChunks) {
#pragma unroll
          for (int i = 0; i < FullTileRows<T::kVChunks>::kCopies; ++i) v_pages[i] = k_pages[i];
        } else {
          unread |= load_row_pages<T::kVChunks>(p, page_ids, v_pages);
        }
      }
      if constexpr (kCopyK) {
        copy_full_tile<T::kQKChunks>(k_dst, p.k, kv_row, kv_head, k_pages, p.k_stride_page,
                                     p.k_stride_slot, p.k_stride_head);
      }
      if constexpr (kCopyV) {
        copy_full_tile<T::kVChunks>(k_dst + T::kKBytes, p.v, kv_row, kv_head, v_pages,
                                    p.v_stride_page, p.v_stride_slot, p.v_stride_head);
      }
      if constexpr (T::kPaged) {
        if (unread) report_tile_pages(p, g, start, page_ids);
      }
      return;
    }
  }
  const int tid = load_thread();
  if constexpr (kCopyK) {
    copy_rows<T::kKvTile, T::kQKChunks>(k_dst, p.k, tid, [&](int row) -> long long {
      const int pos = start + row;
      return pos < g.kv_hi ? kv_element(p, g, pos, row, page_ids, p.k_stride_page,
                                        p.k_stride_slot, p.k_stride_head)
                           : -1;
    });
  }
  if constexpr (kCopyV) {
    copy_rows<T::kKvTile, T::kVChunks>(k_dst + T::kKBytes, p.v, tid, [&](int row) -> long long {
      const int pos = start + row;
      return pos < g.kv_hi ? kv_element(p, g, pos, row, page_ids, p.v_stride_page,
                                        p.v_stride_slot, p.v_stride_head)
                           : -1;
    });
  }
}

// The item's query rows; their tokens and heads come from the row tables (row_q_pos,
// row_qo_head) written before the last barrier, not from a division per copy.
__device__ __forceinline__ void issue_q(const PrefillParams& p, const ItemGeometry& g,
                                        const int* row_q_pos, const int* row_qo_head,
                                        unsigned char* smem) {
  copy_rows<T::kQueryTile, T::kQKChunks>(
      shared_address(smem), p.q, load_thread(), [&](int row) -> long long {
        if (row >= g.rows) return -1;
        const long long token = g.qo_begin + (row_q_pos[row] - g.q_offset);
        return token * p.q_stride_token +
               static_cast<long long>(row_qo_head[row]) * p.q_stride_head;
      });
}

}  // namespace flare::prefill
