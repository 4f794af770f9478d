// Parallel compilation of a list of specs into the disk cache (std::thread workers pulling the
// next index), so an application can pay all JIT costs up front.
#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "flare/core/error.h"
#include "flare/jit/compiler.h"

namespace flare::jit {

std::vector<CompiledKernel> precompile(const std::vector<KernelSpec>& specs,
                                       const std::string& arch, int num_threads) {
  FLARE_CHECK(num_threads >= 0, ErrorCode::kInvalidArgument,
              "precompile: num_threads must be >= 0 (0 = one per hardware thread), got ",
              num_threads);
  std::vector<CompiledKernel> results(specs.size());
  std::vector<std::exception_ptr> errors(specs.size());
  const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers =
      std::min(specs.size(), num_threads > 0 ? static_cast<size_t>(num_threads) : hardware);

  std::atomic<size_t> next{0};
  const auto work = [&] {
    for (size_t i = next++; i < specs.size(); i = next++) {
      try {
        results[i] = compile_cached(specs[i], arch);
      } catch (...) {
        errors[i] = std::current_exception();  // keep going: the other kernels are still wanted
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t) threads.emplace_back(work);
  work();  // the calling thread is a worker too
  for (std::thread& thread : threads) thread.join();

  // "First" means first in the list, so the reported error does not depend on thread timing.
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  return results;
}

}  // namespace flare::jit
