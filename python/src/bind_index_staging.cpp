// IndexStaging: the CUDA-graph wrappers' plan() refills FlashInfer's fixed index buffers
// (paged_kv_indptr_buffer and the others) from the caller's arrays in one extension call. Host
// arrays go through page-locked memory of its own (two buffers used in turn, as the engine's
// plan region: src/api/plan_staging.h), so the copies are asynchronous and plan() does not
// wait for the GPU work already queued; device arrays are copied on the device. The same in
// torch ops (a slice, a pinned copy and a copy_ per array) cost the graph-mode decode plan()
// ~80-110 us of host time (docs/perf.md, forty-eighth session).
#include <nanobind/nanobind.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "object_view.h"

namespace flare::python {

namespace {

// One array bound for a buffer, checked before anything is written.
struct Refill {
  std::byte* target = nullptr;
  TensorView source;
  int64_t count = 0;
};

class IndexStaging {
 public:
  // entries: (buffer, buffer_name, source, source_name, count[, offset]) tuples; count -1
  // copies all of source (any rank, row-major), else its first `count` entries, to the
  // buffer's entries from `offset` (0 when absent: several sources may fill one buffer). The
  // buffers are int32 CUDA tensors (contiguous); the sources int32 arrays on the host (any 1-D
  // strides) or on the buffer's device (contiguous). A source already in place is skipped.
  // `synchronous`: the host waits for the copies (FlashInfer's non_blocking=False).
  void fill(uintptr_t stream, nb::tuple entries, bool synchronous) {
    std::vector<Refill> refills;
    refills.reserve(entries.size());
    size_t host_entries = 0;
    int device = -1;
    for (nb::handle entry : entries) {
      FLARE_CHECK(nb::isinstance<nb::tuple>(entry) && (nb::len(entry) == 5 || nb::len(entry) == 6),
                  ErrorCode::kInvalidArgument,
                  "IndexStaging.fill: each entry is a (buffer, buffer_name, source, source_name, "
                  "count[, offset]) tuple");
      const nb::tuple e = nb::borrow<nb::tuple>(entry);
      const std::string buffer_name = nb::cast<std::string>(e[1]);
      const std::string source_name = nb::cast<std::string>(e[3]);
      const TensorView buffer = object_view(e[0], buffer_name.c_str());
      FLARE_CHECK(buffer.device.is_cuda() && buffer.dtype == DType::kI32 && buffer.is_contiguous(),
                  ErrorCode::kInvalidArgument, buffer_name,
                  " must be a contiguous int32 CUDA tensor");
      FLARE_CHECK(device < 0 || buffer.device.index == device, ErrorCode::kInvalidArgument,
                  buffer_name, " is on cuda:", buffer.device.index,
                  ", the other buffers on cuda:", device);
      device = buffer.device.index;
      const int64_t offset = e.size() > 5 ? nb::cast<int64_t>(e[5]) : 0;
      FLARE_CHECK(offset >= 0 && offset <= buffer.numel(), ErrorCode::kInvalidArgument, source_name,
                  ": offset ", offset, " outside ", buffer_name, "'s ", buffer.numel(), " entries");
      Refill refill{static_cast<std::byte*>(buffer.data) + offset * sizeof(int32_t),
                    object_view(e[2], source_name.c_str()), nb::cast<int64_t>(e[4])};
      const TensorView& source = refill.source;
      FLARE_CHECK(source.dtype == DType::kI32, ErrorCode::kInvalidArgument, source_name,
                  " must hold int32 here, got ", dtype_name(source.dtype));
      const int64_t available = source.numel();
      FLARE_CHECK(refill.count <= available, ErrorCode::kInvalidArgument, source_name, " has ",
                  available, " entries, fewer than the ", refill.count, " the plan reads");
      if (refill.count < 0) refill.count = available;
      if (refill.count == 0) continue;  // nothing to copy (an empty source may have no storage)
      FLARE_CHECK(refill.count <= buffer.numel() - offset, ErrorCode::kInvalidArgument, source_name,
                  " has ", refill.count, " entries, more than ", buffer_name, "'s ",
                  buffer.numel() - offset, offset > 0 ? " from its offset" : "");
      if (source.device.is_cuda()) {
        FLARE_CHECK(source.device.index == device, ErrorCode::kInvalidArgument, source_name,
                    " is on cuda:", source.device.index, ", ", buffer_name, " on cuda:", device);
        FLARE_CHECK(source.is_contiguous(), ErrorCode::kInvalidArgument, source_name,
                    " must be contiguous");
        if (source.data == refill.target) continue;  // already in place
      } else {
        FLARE_CHECK(source.is_contiguous() || source.ndim == 1, ErrorCode::kInvalidArgument,
                    source_name, " must be contiguous or 1-D");
        host_entries += static_cast<size_t>(refill.count);
      }
      refills.push_back(refill);
    }
    if (refills.empty()) return;
    const cuda::DeviceScope scope(device);
    const auto cuda_stream = reinterpret_cast<cuda::Stream>(stream);
    std::byte* staged =
        host_entries > 0 ? acquire(device, host_entries * sizeof(int32_t)) : nullptr;
    for (const Refill& refill : refills) {
      const size_t bytes = static_cast<size_t>(refill.count) * sizeof(int32_t);
      if (refill.source.device.is_cuda()) {
        cuda::memcpy_dtod_async(refill.target, refill.source.data, bytes, cuda_stream);
        continue;
      }
      stage(refill.source, refill.count, reinterpret_cast<int32_t*>(staged));
      cuda::memcpy_htod_async(refill.target, staged, bytes, cuda_stream);
      staged += bytes;
    }
    if (host_entries > 0) buffers_[current_].copied->record(cuda_stream);
    if (synchronous) cuda::stream_synchronize(cuda_stream);
  }

 private:
  struct Buffer {
    cuda::PinnedBuffer memory;
    std::optional<cuda::Event> copied;
  };

  // The next pinned buffer, at least `bytes` long, once the copies out of it (two fills ago)
  // are done. Events belong to the first fill's device: a wrapper's buffers never move.
  std::byte* acquire(int device, size_t bytes) {
    FLARE_CHECK(device_ < 0 || device == device_, ErrorCode::kInvalidArgument,
                "the graph buffers moved from cuda:", device_, " to cuda:", device);
    device_ = device;
    current_ ^= 1;
    Buffer& buffer = buffers_[current_];
    if (buffer.copied) buffer.copied->synchronize();
    if (buffer.memory.bytes() < bytes)
      buffer.memory = cuda::PinnedBuffer(std::max<size_t>(bytes, 4096));
    if (!buffer.copied) buffer.copied.emplace();
    return buffer.memory.data();
  }

  // `count` int32 entries of host array `source` (contiguous, or 1-D with any stride), packed.
  static void stage(const TensorView& source, int64_t count, int32_t* packed) {
    const auto* values = static_cast<const int32_t*>(source.data);
    if (source.is_contiguous()) {
      std::memcpy(packed, values, static_cast<size_t>(count) * sizeof(int32_t));
      return;
    }
    const int64_t stride = source.strides[0];
    for (int64_t i = 0; i < count; ++i) packed[i] = values[i * stride];
  }

  Buffer buffers_[2];
  int current_ = 1;  // the first acquire() takes buffer 0
  int device_ = -1;
};

}  // namespace

void bind_index_staging(nb::module_& m) {
  nb::class_<IndexStaging>(m, "IndexStaging",
                           "Refills CUDA-graph index buffers from host or device int32 arrays "
                           "(internal: the use_cuda_graph wrappers' plan()).")
      .def(nb::init<>())
      .def("fill", &IndexStaging::fill, nb::arg("stream"), nb::arg("entries"),
           nb::arg("synchronous"));
}

}  // namespace flare::python
