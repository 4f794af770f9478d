// The CUDA backend of `flare bench`. The GPU attention API has not landed yet: this answers
// with the errors the command documents until it does.
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "tools/flare/bench_runner.h"

namespace flare::cli {

BenchRunner make_cuda_runner(const Workload& work, int device) {
  FLARE_CHECK(cuda::available(), ErrorCode::kNoCudaDevice, "--device cuda:", device,
              ": no usable CUDA device (", cuda::unavailable_reason(), ")");
  fail(ErrorCode::kUnsupported, "the CUDA backend is not available yet for ",
       name_of(work.spec.mode));
}

}  // namespace flare::cli
