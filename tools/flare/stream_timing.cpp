// Timing of the flare tool's GPU backends: events around a run of calls on one stream.
#include "tools/flare/stream_timing.h"

#include "flare/jit/cuda_sync.h"

namespace flare::cli {

double time_calls_ms(cuda::Stream stream, int calls, const std::function<void()>& call) {
  cuda::Event start(true), stop(true);
  start.record(stream);
  for (int i = 0; i < calls; ++i) call();
  stop.record(stream);
  stop.synchronize();
  return stop.elapsed_ms_since(start);
}

}  // namespace flare::cli
