// Source generation, NVRTC compilation and resource reports (papers 001 §3.2.3; DESIGN
// decision 1). Needs no GPU: CI compiles every shipped configuration for sm_80 and sm_90a.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace flare::jit {

// What to compile: a kernel family header from kernels/, a Variant functor's source, and the
// compile-time parameters. The generated translation unit is
//   #define <name> <value>            (for every define, in order)
//   <variant_source>                  (defines `struct Variant`)
//   #include "<family_header>"        (defines extern "C" __global__ <entry>)
struct KernelSpec {
  std::string family_header;  // e.g. "decode.cuh"
  std::string entry;          // extern "C" kernel name(s), ';'-separated when several
  std::string variant_source;
  std::vector<std::pair<std::string, std::string>> defines;
  std::string label;  // human-readable, for logs ("decode bf16/bf16 D=128 g=4 page=16")

  std::string translation_unit() const;
};

// Per entry. Registers, local memory and max_threads come from the cubin's ELF attributes (what
// the driver reads; always there), spill counts and static shared memory from ptxas's verbose
// report in NVRTC's log, which a compile can lack: the kernel is still used (a warning is
// logged), and spill_bytes says the count is unknown.
struct ResourceUsage {
  static constexpr int kUnknownSpills = -1;  // spill_bytes when ptxas's report lacks the entry

  std::string entry;
  int registers = 0;
  int local_bytes = 0;  // stack frame / local memory incl. callees: must be 0 for shipped kernels
  int spill_bytes = 0;  // spill stores + loads: must be 0 (spills also make local_bytes > 0)
  int static_shared_bytes = 0;  // ptxas's "bytes smem"; 0 when its report lacks the entry
  int max_threads = 0;  // __launch_bounds__ threads per block; 0 when the kernel declares none
};

struct CompiledKernel {
  std::string cubin;                 // binary, loadable with cuModuleLoadData
  std::string log;                   // NVRTC + ptxas log
  std::vector<ResourceUsage> usage;  // one per entry of the spec, in its order
  double compile_seconds = 0;        // 0 when served from the disk cache
  bool from_cache = false;           // compile_cached found a valid entry: nothing was compiled
};

// "sm_80", "sm_86", "sm_89", "sm_90a", ... from a compute capability; 9.0 maps to sm_90a.
std::string arch_for(int cc_major, int cc_minor);

// Content hash (hex) of the sources the unit includes, the spec, the arch and the NVRTC
// version: the cache key.
std::string cache_key(const KernelSpec& spec, const std::string& arch);

// Compiles with NVRTC (dlopen'ed). Throws kCompileError carrying NVRTC's log on failure, and
// kUnsupported when NVRTC cannot be loaded. Logs "compiling <label> for <arch>" and the time.
CompiledKernel compile(const KernelSpec& spec, const std::string& arch);

// The on-disk cache ($FLARE_CACHE_DIR, default ~/.cache/flare): returns the cubin for
// (spec, arch), compiling and writing it atomically on a miss; a corrupt entry is rebuilt.
CompiledKernel compile_cached(const KernelSpec& spec, const std::string& arch);
std::string cache_directory();
// A cache file's contents (false when it cannot be read), and writing one atomically (a unique
// temporary file renamed over it: readers in other processes see no entry or a whole one;
// failures are logged and only cost the caching). Also the SpMM tuner's (flare/sparse/spmm_tune.h).
bool read_cache_file(const std::string& path, std::string& contents);
void write_cache_file(const std::string& path, const std::string& contents);

// Compiles several specs in parallel (threads), filling the cache. Returns per-spec results
// in order; the first failure is rethrown after all finish.
std::vector<CompiledKernel> precompile(const std::vector<KernelSpec>& specs,
                                       const std::string& arch, int num_threads = 0);

}  // namespace flare::jit
