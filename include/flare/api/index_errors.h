// The sticky record of out-of-range index data a kernel found on the device (page ids outside
// the cache, page-table entries past the indices tensor, append positions past a request's
// pages): how BatchDecode, BatchPrefill and append_paged_kv_cuda report bad device-side
// indices without reading them on the host. Kernels never read or write outside their tensors;
// they skip what is out of range and record the first occurrence here.
#pragma once

#include <cstdint>
#include <string>

#include "flare/jit/cuda_driver.h"
#include "kernels/index_check.cuh"

namespace flare {

// The first out-of-range index seen since the record was last checked.
struct IndexError {
  IndexErrorKind kind = kIndexErrorNone;
  int64_t request = -1;  // the request (batch index) whose data held it
  int64_t entry = -1;    // where: the page-table entry, or the appended token (-1: unknown)
  int64_t value = 0;     // what was there
  // Out-of-range reads since the last check: per read of a bad id (decode: per work item that
  // read one).
  uint64_t count = 0;
};

// Names the caller's arguments in check()'s message, e.g. {"BatchDecode", "kv_indices"}.
struct IndexNames {
  const char* operation = "";
  const char* indices = "kv_indices";   // the page ids
  const char* indptr = "kv_indptr";     // pages per request
  const char* positions = "positions";  // append: the token positions
  const char* batch = "batch_indices";  // append: the tokens' requests
  const char* slots = "slot_mapping";   // slot-mapped append: the tokens' cache slots
};

// One record in device memory (32 bytes), zeroed at creation. Owned by each BatchDecode and
// BatchPrefill, and one per device for append_paged_kv_cuda.
class IndexErrorRecordBuffer {
 public:
  IndexErrorRecordBuffer() = default;
  explicit IndexErrorRecordBuffer(int device);  // allocates and zeroes on `device`

  IndexErrorRecord* device_record() const { return static_cast<IndexErrorRecord*>(buffer_.data()); }
  // Synchronizes the device (every stream: the kernels may have run on any), reads the record
  // and clears it. Returns the error (kind kIndexErrorNone when there was none).
  IndexError read_and_clear() const;
  // read_and_clear(), then throws kIndexOutOfRange with a message naming the argument, the
  // request, the entry and the value when an error was recorded (num_pages: the cache's page
  // count to quote, -1 for none).
  void check(const IndexNames& names, int64_t num_pages = -1) const;

 private:
  int device_ = 0;
  cuda::DeviceBuffer buffer_;
};

// Throws kIndexOutOfRange: describe_index_error() and how many times it was seen.
[[noreturn]] void raise_index_error(const IndexError& error, const IndexNames& names,
                                    int64_t num_pages = -1);

// What `error` was, naming the caller's arguments (check() adds how many reads it skipped).
std::string describe_index_error(const IndexError& error, const IndexNames& names,
                                 int64_t num_pages_hint = -1);

}  // namespace flare
