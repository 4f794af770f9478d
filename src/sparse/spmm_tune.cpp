// The SpMM auto-tuner (flare/sparse/spmm_tune.h): structure hash, disk cache, timed search.
#include "flare/sparse/spmm_tune.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "flare/jit/cuda_sync.h"

namespace flare::sparse {
namespace {

constexpr const char* kWhat = "flare::sparse::tune_spmm";
// Bumped when the kernels or the candidates change what a cached choice means.
constexpr const char* kTuningVersion = "spmm-tuning v1";

// A word-at-a-time 64-bit hash (a multiply-xorshift mix per 8 bytes, position-dependent):
// fast enough for arrays of hundreds of megabytes, not cryptographic.
struct StructureHash {
  uint64_t state = 0x9e3779b97f4a7c15ull;
  uint64_t position = 0;

  static uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
  }
  void word(uint64_t w) { state = mix(state ^ mix(w + 0x9e3779b97f4a7c15ull * ++position)); }
  void bytes(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= size; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      word(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, size - i);
    word(tail ^ (uint64_t{size - i} << 56));
  }
};

// The contiguous int32 array `t` (host or device) as host bytes.
std::vector<int32_t> host_int32(const TensorView& t, const char* name) {
  FLARE_CHECK(t.ndim == 1 && t.dtype == DType::kI32 && (t.shape[0] <= 1 || t.strides[0] == 1),
              ErrorCode::kInvalidArgument, "flare::sparse::csr_structure_hash: ", name,
              " must be a contiguous int32 1-D tensor, got ", dtype_name(t.dtype), " ",
              t.shape_str());
  std::vector<int32_t> out(static_cast<size_t>(t.shape[0]));
  if (out.empty()) return out;
  if (t.device.is_cuda()) {
    const cuda::DeviceScope scope(t.device.index);
    cuda::memcpy_dtoh(out.data(), t.data, out.size() * 4);
  } else {
    std::memcpy(out.data(), t.data, out.size() * 4);
  }
  return out;
}

std::filesystem::path tuning_path(const std::string& key) {
  return std::filesystem::path(jit::cache_directory()) / "spmm-tuning" / key;
}

// A cache entry "<version> <payload>" (the version two words): a stream positioned at the
// payload when the file reads and carries `version`.
std::optional<std::istringstream> read_entry(const std::string& name, const std::string& version) {
  std::string contents;
  if (!jit::read_cache_file(tuning_path(name).string(), contents)) return std::nullopt;
  std::istringstream in(contents);
  std::string version_a, version_b;
  if (!(in >> version_a >> version_b) || version_a + " " + version_b != version) {
    return std::nullopt;
  }
  return in;
}

void write_entry(const std::string& name, const std::string& version, const std::string& payload) {
  const std::filesystem::path path = tuning_path(name);
  std::error_code error;
  std::filesystem::create_directories(path.parent_path(), error);
  jit::write_cache_file(path.string(), version + " " + payload + "\n");
}

// A cached choice: "spmm-tuning v1 <first> <second>" (a schedule's two numbers), both positive.
std::optional<std::pair<int64_t, int64_t>> read_choice(const std::string& key) {
  std::optional<std::istringstream> in = read_entry(key, kTuningVersion);
  std::pair<int64_t, int64_t> choice;
  if (!in || !(*in >> choice.first >> choice.second) || choice.first <= 0 || choice.second <= 0) {
    return std::nullopt;
  }
  return choice;
}

void write_choice(const std::string& key, int64_t first, int64_t second) {
  write_entry(key, kTuningVersion, std::to_string(first) + " " + std::to_string(second));
}

// The search both tuners share (after the caller's argument checks): the cached choice when it
// is among the candidates, else every candidate timed (one untimed run, then `repetitions`),
// then y from the chosen one. `run(schedule)` enqueues the SpMM; a schedule is two numbers.
template <class Schedule, class Tuning, class Run>
Tuning search(const TensorView& x, cuda::Stream stream, const SpmmTuneOptions& options,
              const std::vector<Schedule>& candidates, uint64_t structure_hash, const Run& run) {
  const auto start = std::chrono::steady_clock::now();
  FLARE_CHECK(options.repetitions >= 1, ErrorCode::kInvalidArgument, kWhat,
              ": options.repetitions must be >= 1, got ", options.repetitions);
  const cuda::DeviceScope scope(x.device.index);
  FLARE_CHECK(!cuda::is_capturing(stream), ErrorCode::kInvalidArgument, kWhat,
              ": the search times the candidates on the device and cannot run while `stream` is "
              "captured into a CUDA graph: tune before capturing, then pass the schedule to spmm");
  Tuning result;
  const std::string key = spmm_tuning_key(structure_hash, x.shape[1], x.dtype,
                                          cuda::device_properties(x.device.index).name);
  const auto finish = [&] {
    run(result.schedule);  // y from the chosen schedule
    cuda::stream_synchronize(stream);
    result.search_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return result;
  };
  if (options.use_cache) {
    if (const auto cached = read_choice(key)) {
      const Schedule schedule{cached->first, cached->second};
      if (std::find(candidates.begin(), candidates.end(), schedule) != candidates.end()) {
        result.schedule = schedule;
        result.from_cache = true;
        return finish();
      }
    }
  }
  double best_us = 0.0;
  for (const Schedule& schedule : candidates) {
    run(schedule);  // compiles its kernels, warms the caches
    cuda::Event begin(true), end(true);
    begin.record(stream);
    for (int i = 0; i < options.repetitions; ++i) run(schedule);
    end.record(stream);
    end.synchronize();
    const double us = 1e3 * end.elapsed_ms_since(begin) / options.repetitions;
    result.timings.emplace_back(schedule, us);
    if (result.timings.size() == 1 || us < best_us) {  // ties keep the earlier (default first)
      best_us = us;
      result.schedule = schedule;
    }
  }
  if (options.use_cache) {
    const auto [first, second] = result.schedule;
    write_choice(key, first, second);
  }
  return finish();
}

}  // namespace

uint64_t csr_structure_hash(const Csr& a) {
  StructureHash hash;
  hash.word(static_cast<uint64_t>(a.rows));
  hash.word(static_cast<uint64_t>(a.cols));
  const std::vector<int32_t> indptr = host_int32(a.indptr, "A.indptr");
  const std::vector<int32_t> indices = host_int32(a.indices, "A.indices");
  hash.word(indptr.size());
  hash.bytes(indptr.data(), indptr.size() * 4);
  hash.word(indices.size());
  hash.bytes(indices.data(), indices.size() * 4);
  return hash.state;
}

std::string spmm_tuning_key(uint64_t structure_hash, int64_t d, DType dtype,
                            const std::string& device_name) {
  StructureHash name_hash;
  name_hash.bytes(device_name.data(), device_name.size());
  name_hash.bytes(kTuningVersion, std::strlen(kTuningVersion));
  char key[128];
  std::snprintf(key, sizeof(key), "%016llx-d%lld-%s-%016llx",
                static_cast<unsigned long long>(structure_hash), static_cast<long long>(d),
                std::string(dtype_name(dtype)).c_str(),
                static_cast<unsigned long long>(name_hash.state));
  return key;
}

std::optional<SpmmSchedule> read_spmm_tuning(const std::string& key) {
  const auto choice = read_choice(key);
  if (!choice) return std::nullopt;
  return SpmmSchedule{choice->first, choice->second};
}

void write_spmm_tuning(const std::string& key, const SpmmSchedule& schedule) {
  write_choice(key, schedule.feature_tile, schedule.chunk_items);
}

namespace {

constexpr const char* kFormatVersion = "spmm-format v1";

bool format_name_ok(const std::string& name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '_';
  });
}

}  // namespace

std::optional<std::string> read_spmm_format(const std::string& key) {
  std::optional<std::istringstream> in = read_entry("format-" + key, kFormatVersion);
  std::string name;
  if (!in || !(*in >> name) || !format_name_ok(name)) return std::nullopt;
  return name;
}

void write_spmm_format(const std::string& key, const std::string& format) {
  FLARE_CHECK(format_name_ok(format), ErrorCode::kInvalidArgument,
              "flare::sparse::write_spmm_format: the format name must be 1-64 letters, digits, "
              "':' or '_', got '",
              format, "'");
  write_entry("format-" + key, kFormatVersion, format);
}

SpmmTuning tune_spmm(const Csr& a, const TensorView& x, const TensorView& y,
                     const TensorView& workspace, cuda::Stream stream,
                     const SpmmTuneOptions& options) {
  FLARE_CHECK(x.device.is_cuda(), ErrorCode::kInvalidArgument, kWhat,
              ": x must be a CUDA tensor, got x on ", x.device.str());
  const int64_t d = x.ndim == 2 ? x.shape[1] : -1;
  // spmm's argument checks before any hashing or timing.
  check_spmm(a, x, y, workspace, default_spmm_schedule(d));
  return search<SpmmSchedule, SpmmTuning>(
      x, stream, options, spmm_schedules(d), csr_structure_hash(a),
      [&](const SpmmSchedule& schedule) { spmm(a, x, y, workspace, stream, schedule); });
}

uint64_t hyb_structure_hash(const HybGpuLayout& layout) {
  StructureHash hash;
  hash.bytes("hyb", 3);
  for (const int64_t v : {layout.rows, layout.cols, layout.nnz})
    hash.word(static_cast<uint64_t>(v));
  for (const HybGpuLayout::Partition& part : layout.partitions) {
    hash.word(part.buckets.size());
    for (const HybGpuLayout::Bucket& b : part.buckets) {
      for (const int64_t v : {b.row_offset, b.rows, b.slot_offset, int64_t{b.log2_width}})
        hash.word(static_cast<uint64_t>(v));
    }
    const HybGpuLayout::Remainder& r = part.remainder;
    for (const int64_t v : {r.row_offset, r.rows, r.indptr_offset, r.nnz_offset, r.nnz})
      hash.word(static_cast<uint64_t>(v));
  }
  for (const std::vector<int32_t>* array :
       {&layout.ell_rows, &layout.ell_columns, &layout.rest_rows, &layout.rest_indptr,
        &layout.rest_columns}) {
    hash.word(array->size());
    hash.bytes(array->data(), array->size() * 4);
  }
  return hash.state;
}

HybTuning tune_spmm(const HybGpu& a, const TensorView& x, const TensorView& y,
                    const TensorView& workspace, cuda::Stream stream,
                    const SpmmTuneOptions& options) {
  FLARE_CHECK(x.device.is_cuda(), ErrorCode::kInvalidArgument, kWhat,
              ": x must be a CUDA tensor, got x on ", x.device.str());
  const int64_t d = x.ndim == 2 ? x.shape[1] : -1;
  check_spmm(a, x, y, workspace, default_hyb_schedule(d > 0 ? d : 1));
  return search<HybSchedule, HybTuning>(
      x, stream, options, hyb_schedules(d), hyb_structure_hash(*a.layout),
      [&](const HybSchedule& schedule) { spmm(a, x, y, workspace, stream, schedule); });
}

}  // namespace flare::sparse
