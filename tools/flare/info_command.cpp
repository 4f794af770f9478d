// `flare info`: what this installation sees — version, CUDA devices (or why there are none),
// the JIT kernel cache directory and the CPU threads the reference backend uses.
#include <cstdio>
#include <thread>

#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_driver.h"
#include "tools/flare/args.h"
#include "tools/flare/commands.h"

namespace flare::cli {
namespace {

constexpr const char* kHelp =
    "usage: flare info\n\n"
    "Prints the flare version, the CUDA devices found (name, SM count, compute capability,\n"
    "memory) or the reason CUDA is unavailable, the JIT kernel cache directory\n"
    "($FLARE_CACHE_DIR, default ~/.cache/flare) and the number of CPU threads.\n";

void print_devices() {
  if (!cuda::available()) {
    std::printf("cuda devices:  none (%s)\n", cuda::unavailable_reason().c_str());
    return;
  }
  const int count = cuda::device_count();
  std::printf("cuda devices:  %d\n", count);
  for (int index = 0; index < count; ++index) {
    const cuda::DeviceProperties props = cuda::device_properties(index);
    std::printf("  cuda:%d  %s  sm_%d%d  %d SMs  %.1f GiB  L2 %.0f MiB\n", index,
                props.name.c_str(), props.cc_major, props.cc_minor, props.num_sms,
                static_cast<double>(props.global_bytes) / (1 << 30),
                static_cast<double>(props.l2_bytes) / (1 << 20));
  }
}

}  // namespace

int run_info(int argc, char** argv) {
  const Args args("info", argc, argv, {});
  if (args.help()) {
    std::fputs(kHelp, stdout);
    return 0;
  }
  std::printf("flare %s\n", FLARE_VERSION);
  print_devices();
  std::printf("jit cache:     %s\n", jit::cache_directory().c_str());
  std::printf("cpu threads:   %u\n", std::thread::hardware_concurrency());
  return 0;
}

}  // namespace flare::cli
