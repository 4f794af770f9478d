// Device-side checks of index data the host never reads (page ids, their count): the sticky
// error record a kernel fills on the first out-of-range index, shared bit for bit with the host.
#pragma once

#include "fixed_width_ints.cuh"

namespace flare {

// What an out-of-range index was (IndexErrorRecord::kind).
enum IndexErrorKind : int32_t {
  kIndexErrorNone = 0,
  kIndexErrorPageId = 1,     // a page id outside [0, pages of the cache)
  kIndexErrorEntry = 2,      // a page-table entry past the end of the indices tensor
  kIndexErrorPosition = 3,   // append: a position past the request's pages
  kIndexErrorRequest = 4,    // append: a batch index past the batch
  kIndexErrorPageRange = 5,  // append: a request's page range outside the indices tensor
  kIndexErrorSlot = 6,       // slot-mapped append: a slot past the cache (pages x page size)
  kIndexErrorScale = 7,      // NVFP4 append: a global scale not positive and finite (its bits)
};

// Zero while no error happened. The first thread to find an out-of-range index fills the
// fields (flag 0 -> 1); later ones only count. The host reads the record after synchronizing
// and clears it (src/api/index_errors.cpp).
struct alignas(16) IndexErrorRecord {
  unsigned int flag;   // 1 once an error is recorded
  unsigned int count;  // out-of-range reads seen (wraps after 2^32)
  int32_t kind;        // IndexErrorKind
  int32_t request;     // the request (batch index) being computed
  int64_t entry;       // where the index was read: a page-table entry, or the token (append)
  int64_t value;       // the value found there (the page id, position or batch index)
};

#ifdef __CUDACC_RTC__
// Inlined into a branch the hot loops never take: an out-of-line call there costs more than
// its body (the call's register conventions slowed the decode loop by 10-20%, H200).
__device__ __forceinline__ void record_index_error(IndexErrorRecord* record, int kind, int request,
                                                   long long entry, long long value) {
  atomicAdd(&record->count, 1u);
  if (atomicCAS(&record->flag, 0u, 1u) == 0u) {
    record->kind = kind;
    record->request = request;
    record->entry = entry;
    record->value = value;
  }
}
#endif

}  // namespace flare
