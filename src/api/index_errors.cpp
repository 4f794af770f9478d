// IndexErrorRecordBuffer: allocation, the synchronizing read-and-clear, and the message that
// names the caller's argument.
#include "flare/api/index_errors.h"

#include <cstring>
#include <sstream>

#include "flare/core/error.h"

namespace flare {

static_assert(sizeof(IndexErrorRecord) == 32, "kernels/index_check.cuh record: 32 bytes");

IndexErrorRecordBuffer::IndexErrorRecordBuffer(int device) : device_(device) {
  const cuda::DeviceScope scope(device);
  buffer_ = cuda::DeviceBuffer(sizeof(IndexErrorRecord));
  const IndexErrorRecord zero{};
  cuda::memcpy_htod(buffer_.data(), &zero, sizeof(zero));
}

IndexError IndexErrorRecordBuffer::read_and_clear() const {
  FLARE_CHECK(buffer_.data() != nullptr, ErrorCode::kInternal,
              "IndexErrorRecordBuffer: read before allocation");
  const cuda::DeviceScope scope(device_);
  cuda::device_synchronize();
  IndexErrorRecord record{};
  cuda::memcpy_dtoh(&record, buffer_.data(), sizeof(record));
  IndexError error;
  if (record.flag == 0) return error;
  const IndexErrorRecord zero{};
  cuda::memcpy_htod(buffer_.data(), &zero, sizeof(zero));
  error.kind = static_cast<IndexErrorKind>(record.kind);
  error.request = record.request;
  error.entry = record.entry;
  error.value = record.value;
  error.count = record.count;
  return error;
}

void IndexErrorRecordBuffer::check(const IndexNames& names, int64_t num_pages) const {
  const IndexError error = read_and_clear();
  if (error.kind != kIndexErrorNone) raise_index_error(error, names, num_pages);
}

void raise_index_error(const IndexError& error, const IndexNames& names, int64_t num_pages) {
  fail(ErrorCode::kIndexOutOfRange, describe_index_error(error, names, num_pages), "; seen ",
       error.count, error.count == 1 ? " time" : " times",
       " since the last check: nothing outside the tensors was read or written, and the outputs "
       "of the requests involved are not meaningful");
}

std::string describe_index_error(const IndexError& error, const IndexNames& names,
                                 int64_t num_pages_hint) {
  std::ostringstream m;
  m << names.operation << ": ";
  switch (error.kind) {
    case kIndexErrorPageId:
      if (error.entry < 0) {  // the kernel knew the request only, and the ids changed since
        m << "request " << error.request << " read a page id of " << names.indices
          << " outside the KV cache";
      } else {
        m << names.indices << "[" << error.entry << "] = " << error.value << " (request "
          << error.request << ") is not a page of the KV cache";
      }
      if (num_pages_hint >= 0) m << " (it has " << num_pages_hint << " pages)";
      break;
    case kIndexErrorEntry:
      m << "request " << error.request << " reads " << names.indices << "[" << error.entry
        << "], past the end of " << names.indices;
      break;
    case kIndexErrorPosition:
      m << names.positions << "[" << error.entry << "] = " << error.value
        << " is outside the pages of its request " << error.request << " (" << names.indptr << ")";
      break;
    case kIndexErrorRequest:
      m << names.batch << "[" << error.entry << "] = " << error.value
        << " is not a request of the batch (" << names.indptr << " has fewer)";
      break;
    case kIndexErrorPageRange:
      m << names.indptr << "[" << error.request << "] = " << error.value << " and " << names.indptr
        << "[" << error.request + 1 << "] give a page range outside " << names.indices;
      break;
    case kIndexErrorSlot:
      m << names.slots << "[" << error.entry << "] = " << error.value
        << " is past the KV cache's slots (pages x page size)";
      break;
    case kIndexErrorScale: {
      const auto bits = static_cast<uint32_t>(error.value);
      float scale;
      std::memcpy(&scale, &bits, sizeof(scale));
      m << (error.entry == 0 ? "k_scale" : "v_scale") << " = " << scale
        << " is not a positive finite global decode scale (nothing was written)";
      break;
    }
    default:
      m << "unknown index error kind " << static_cast<int>(error.kind);
      break;
  }
  return m.str();
}

}  // namespace flare
