// Driver objects for ordering and capture beyond cuda_driver.h: events (host waits on a
// stream position, timing), owned streams, and CUDA-graph capture and replay.
#pragma once

#include <functional>

#include "flare/jit/cuda_driver.h"

namespace flare::cuda {

// A CUDA event of the current context (cuEventCreate). All calls throw kCudaError on failure,
// kNoCudaDevice without a driver.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream stream);
  // True when the work recorded before it has completed (or it was never recorded).
  bool query() const;
  void synchronize() const;  // host waits for the recorded work
  // Milliseconds from `start` to this event; both recorded with timing = true and completed.
  float elapsed_ms_since(const Event& start) const;

 private:
  struct CUevent_st* event_ = nullptr;
};

// A non-blocking stream of the current context (capture needs one: the legacy default stream
// cannot be captured).
class OwnedStream {
 public:
  OwnedStream();
  ~OwnedStream();
  OwnedStream(OwnedStream&& other) noexcept;
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

// The interaction of a capture with calls the driver counts as unsafe (cuMemAlloc, cuMemFree,
// synchronizations; CUstreamCaptureMode): kGlobal, one from any thread of the process
// invalidates the capture (PyTorch's default for torch.cuda.graph); kThreadLocal, one from the
// capturing thread; kRelaxed, none.
enum class CaptureMode : int { kGlobal = 0, kThreadLocal = 1, kRelaxed = 2 };

// An instantiated CUDA graph: the work `body` enqueues on `stream` while captured, replayed by
// launch().
class Graph {
 public:
  Graph(Stream stream, const std::function<void()>& body,
        CaptureMode mode = CaptureMode::kThreadLocal);
  ~Graph();
  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void launch(Stream stream) const;

 private:
  struct CUgraph_st* graph_ = nullptr;
  struct CUgraphExec_st* exec_ = nullptr;
};

}  // namespace flare::cuda
