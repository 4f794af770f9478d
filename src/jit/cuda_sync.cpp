// Events, owned streams and graph capture: entry points resolved from the libcuda that
// driver_loader.cpp already opened (RTLD_NOLOAD), so the driver table stays as it is.
#include "flare/jit/cuda_sync.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <utility>

#include "flare/core/error.h"
#include "src/jit/driver_api.h"

namespace flare::cuda {
namespace {

using CUresult = int;
using CUevent = struct CUevent_st*;
using CUgraph = struct CUgraph_st*;
using CUgraphExec = struct CUgraphExec_st*;

// Values from cuda.h.
constexpr unsigned kEventDisableTiming = 0x2;
constexpr unsigned kStreamNonBlocking = 0x1;
constexpr CUresult kErrorNotReady = 600;

struct SyncApi {
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy_v2)(CUevent);
  CUresult (*cuEventRecord)(CUevent, Stream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuStreamCreate)(Stream*, unsigned);
  CUresult (*cuStreamDestroy_v2)(Stream);
  CUresult (*cuStreamBeginCapture_v2)(Stream, int);
  CUresult (*cuStreamEndCapture)(Stream, CUgraph*);
  CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec*, CUgraph, unsigned long long);
  CUresult (*cuGraphLaunch)(CUgraphExec, Stream);
  CUresult (*cuGraphExecDestroy)(CUgraphExec);
  CUresult (*cuGraphDestroy)(CUgraph);
};

template <class Fn>
bool resolve(void* library, const char* name, Fn*& function) {
  void* symbol = dlsym(library, name);
  std::memcpy(&function, &symbol, sizeof(symbol));
  return symbol != nullptr;
}

const SyncApi& sync_api() {
  static SyncApi table{};
  static std::once_flag once;
  std::call_once(once, [] {
    driver::api();  // throws kNoCudaDevice without a driver; loads libcuda otherwise
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (library == nullptr) library = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    FLARE_CHECK(library != nullptr, ErrorCode::kNoCudaDevice, "libcuda is not loaded");
    const char* missing = nullptr;
#define FLARE_RESOLVE(name) \
  if (missing == nullptr && !resolve(library, #name, table.name)) missing = #name
    FLARE_RESOLVE(cuEventCreate);
    FLARE_RESOLVE(cuEventDestroy_v2);
    FLARE_RESOLVE(cuEventRecord);
    FLARE_RESOLVE(cuEventQuery);
    FLARE_RESOLVE(cuEventSynchronize);
    FLARE_RESOLVE(cuEventElapsedTime);
    FLARE_RESOLVE(cuStreamCreate);
    FLARE_RESOLVE(cuStreamDestroy_v2);
    FLARE_RESOLVE(cuStreamBeginCapture_v2);
    FLARE_RESOLVE(cuStreamEndCapture);
    FLARE_RESOLVE(cuGraphInstantiateWithFlags);
    FLARE_RESOLVE(cuGraphLaunch);
    FLARE_RESOLVE(cuGraphExecDestroy);
    FLARE_RESOLVE(cuGraphDestroy);
#undef FLARE_RESOLVE
    FLARE_CHECK(missing == nullptr, ErrorCode::kNoCudaDevice, "the CUDA driver lacks ", missing);
  });
  return table;
}

}  // namespace

Event::Event(bool timing) {
  check(sync_api().cuEventCreate(&event_, timing ? 0u : kEventDisableTiming), "cuEventCreate");
}
Event::~Event() {
  if (event_ == nullptr) return;
  const driver::RelaxedCaptureScope relaxed(driver::try_api());  // see driver_api.h
  sync_api().cuEventDestroy_v2(event_);
}
Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
Event& Event::operator=(Event&& other) noexcept {
  std::swap(event_, other.event_);
  return *this;
}
void Event::record(Stream stream) { check(sync_api().cuEventRecord(event_, stream), "cuEventRecord"); }
bool Event::query() const {
  const CUresult result = sync_api().cuEventQuery(event_);
  if (result == kErrorNotReady) return false;
  check(result, "cuEventQuery");
  return true;
}
void Event::synchronize() const { check(sync_api().cuEventSynchronize(event_), "cuEventSynchronize"); }
float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0.0f;
  check(sync_api().cuEventElapsedTime(&ms, start.event_, event_), "cuEventElapsedTime");
  return ms;
}

OwnedStream::OwnedStream() {
  check(sync_api().cuStreamCreate(&stream_, kStreamNonBlocking), "cuStreamCreate");
}
OwnedStream::~OwnedStream() {
  if (stream_ == nullptr) return;
  const driver::RelaxedCaptureScope relaxed(driver::try_api());  // see driver_api.h
  sync_api().cuStreamDestroy_v2(stream_);
}
OwnedStream::OwnedStream(OwnedStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}
OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  std::swap(stream_, other.stream_);
  return *this;
}

Graph::Graph(Stream stream, const std::function<void()>& body, CaptureMode mode) {
  const SyncApi& d = sync_api();
  check(d.cuStreamBeginCapture_v2(stream, static_cast<int>(mode)), "cuStreamBeginCapture");
  try {
    body();
  } catch (...) {
    CUgraph abandoned = nullptr;
    d.cuStreamEndCapture(stream, &abandoned);
    if (abandoned != nullptr) d.cuGraphDestroy(abandoned);
    throw;
  }
  check(d.cuStreamEndCapture(stream, &graph_), "cuStreamEndCapture");
  const CUresult instantiated = d.cuGraphInstantiateWithFlags(&exec_, graph_, 0);
  if (instantiated != 0) {
    d.cuGraphDestroy(graph_);
    graph_ = nullptr;
    check(instantiated, "cuGraphInstantiate");
  }
}
Graph::~Graph() {
  if (exec_ != nullptr) sync_api().cuGraphExecDestroy(exec_);
  if (graph_ != nullptr) sync_api().cuGraphDestroy(graph_);
}
Graph::Graph(Graph&& other) noexcept
    : graph_(std::exchange(other.graph_, nullptr)), exec_(std::exchange(other.exec_, nullptr)) {}
Graph& Graph::operator=(Graph&& other) noexcept {
  std::swap(graph_, other.graph_);
  std::swap(exec_, other.exec_);
  return *this;
}
void Graph::launch(Stream stream) const { check(sync_api().cuGraphLaunch(exec_, stream), "cuGraphLaunch"); }

}  // namespace flare::cuda
