// The SpMM auto-tuner (issue 23): for one matrix structure, feature size, dtype and GPU, time
// every schedule of spmm_schedules(d) on the device and keep the fastest, cached on disk under
// the JIT cache directory (flare/jit/compiler.h's cache_directory(), "spmm-tuning/") keyed by a
// hash of A's structure. The kernels are flare/sparse/spmm_gpu.h's; only their schedule
// (feature tiles, chunk size) is chosen here. The same for a hyb(c, k) decomposition
// (flare/sparse/hyb_gpu.h: feature tiles, slots a warp), keyed by its layout's hash.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flare/sparse/hyb_gpu.h"
#include "flare/sparse/spmm_gpu.h"

namespace flare::sparse {

// A 64-bit hash of A's structure (rows, cols, indptr, indices; not the values), of host or
// device arrays (device arrays are copied to the host first: this synchronizes). Deterministic
// across runs and machines.
uint64_t csr_structure_hash(const Csr& a);

// The cache key of a tuning: the structure hash, d, the dtype and the GPU's name.
std::string spmm_tuning_key(uint64_t structure_hash, int64_t d, DType dtype,
                            const std::string& device_name);

// The cached schedule of `key`, if any (an unreadable or malformed entry reads as none); and
// writing one (atomically: a temporary file renamed; a failure to write is logged, not thrown).
std::optional<SpmmSchedule> read_spmm_tuning(const std::string& key);
void write_spmm_tuning(const std::string& key, const SpmmSchedule& schedule);

// The format a search across formats chose (Python's SpmmPlan(format="auto")), cached like a
// schedule under "format-" + spmm_tuning_key(csr_structure_hash(A), d, dtype, GPU): a name of
// letters, digits, ':' and '_' ("csr", "hyb:1:4"); an unreadable, malformed or other-version
// entry reads as none; a failure to write is logged, not thrown.
std::optional<std::string> read_spmm_format(const std::string& key);
void write_spmm_format(const std::string& key, const std::string& format);

struct SpmmTuneOptions {
  bool use_cache = true;  // read and write the disk cache
  int repetitions = 3;    // timed runs a candidate (after one untimed run)
};

struct SpmmTuning {
  SpmmSchedule schedule;
  bool from_cache = false;
  double search_ms = 0.0;  // host time of the whole call (hash, cache, timings)
  // The candidates' mean GPU times in microseconds, in spmm_schedules(d)'s order (empty when
  // the schedule came from the cache).
  std::vector<std::pair<SpmmSchedule, double>> timings;
};

// Chooses a schedule for Y = A X with these operands (spmm's arguments and checks), timing the
// candidates on `stream` with x, y and workspace (y is overwritten; on return it holds A X from
// the chosen schedule's run). Synchronizes `stream`; kInvalidArgument while `stream` is being
// captured into a CUDA graph (tune before capturing, then pass the schedule to spmm).
SpmmTuning tune_spmm(const Csr& a, const TensorView& x, const TensorView& y,
                     const TensorView& workspace, cuda::Stream stream,
                     const SpmmTuneOptions& options = {});

// A 64-bit hash of a decomposition's structure (its partition table and index arrays: host
// data, no synchronization), distinct from every csr_structure_hash.
uint64_t hyb_structure_hash(const HybGpuLayout& layout);

struct HybTuning {
  HybSchedule schedule;
  bool from_cache = false;
  double search_ms = 0.0;
  std::vector<std::pair<HybSchedule, double>> timings;  // in hyb_schedules(d)'s order
};

// tune_spmm over a decomposition: times hyb_schedules(d) (spmm(HybGpu)'s arguments and checks),
// cached by the layout's hash, d, dtype and GPU; y holds A X on return. Synchronizes; refused
// under capture as above.
HybTuning tune_spmm(const HybGpu& a, const TensorView& x, const TensorView& y,
                    const TensorView& workspace, cuda::Stream stream,
                    const SpmmTuneOptions& options = {});

}  // namespace flare::sparse
