// Timing of the flare tool's GPU backends (gpu_decode, gpu_prefill): a run of calls measured
// between two events on the stream they queue work on.
#pragma once

#include <functional>

#include "flare/jit/cuda_driver.h"

namespace flare::cli {

// Milliseconds between events recorded on `stream` before and after `calls` calls of `call`
// (which queue their work on `stream`); waits for the second event.
double time_calls_ms(cuda::Stream stream, int calls, const std::function<void()>& call);

}  // namespace flare::cli
