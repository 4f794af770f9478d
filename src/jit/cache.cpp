// The on-disk cubin cache: content-hash keys, entry files with a checksummed header, atomic
// writes (temp file + rename) so concurrent processes are safe, and rebuilds of corrupt entries.
//
// Entry file <key>.cubin (integers little-endian):
//   [0, 8)    magic "FLRCUBIN"
//   [8, 12)   format version (1)        [12, 16)  reserved (0)
//   [16, 24)  cubin bytes               [24, 32)  log bytes
//   [32, 64)  SHA-256 of bytes [0, 32), the cubin and the log
//   [64, ...) the cubin, then NVRTC's log (kept so a cache hit reports the same resource usage)
#include <pwd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#include "flare/core/error.h"
#include "flare/jit/compiler.h"
#include "flare/jit/embedded_sources.h"
#include "flare/jit/log.h"
#include "src/jit/compile_steps.h"
#include "src/jit/nvrtc_api.h"
#include "src/jit/sha256.h"

#ifndef FLARE_VERSION
#error "FLARE_VERSION must be defined by the build (it is part of every cache key)"
#endif

namespace flare::jit {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMagic = "FLRCUBIN";
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kChecksummedHeaderBytes = 32;

// Digest of every embedded kernels/*.cuh (name and text): any header a unit can include.
// Computed once; the sources are fixed for the life of the library.
const std::string& embedded_sources_digest() {
  static const std::string digest = [] {
    Sha256 hash;
    for (const EmbeddedSource& source : embedded_sources()) {
      hash.update_field(source.name);
      hash.update_field(source.text);
    }
    return to_hex(hash.finish());
  }();
  return digest;
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
}
// Little-endian unsigned integer of `bytes` bytes at `offset` (the caller checked the bounds).
uint64_t get_le(std::string_view in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i)
    value |= uint64_t{static_cast<uint8_t>(in[offset + i])} << (8 * i);
  return value;
}

Sha256::Digest entry_checksum(std::string_view header, std::string_view cubin,
                              std::string_view log) {
  Sha256 hash;
  hash.update(header.substr(0, kChecksummedHeaderBytes));
  hash.update(cubin);
  hash.update(log);
  return hash.finish();
}

std::string encode_entry(const CompiledKernel& kernel) {
  std::string file(kMagic);
  put_le(file, kFormatVersion, 4);
  put_le(file, 0, 4);
  put_le(file, kernel.cubin.size(), 8);
  put_le(file, kernel.log.size(), 8);
  const Sha256::Digest checksum = entry_checksum(file, kernel.cubin, kernel.log);
  file.append(reinterpret_cast<const char*>(checksum.data()), checksum.size());
  file += kernel.cubin;
  file += kernel.log;
  return file;
}

// Decodes an entry file into cubin and log; returns why it is invalid, or "" when valid.
std::string decode_entry(std::string_view file, CompiledKernel& kernel) {
  if (file.size() < kHeaderBytes)
    return "truncated header (" + std::to_string(file.size()) + " bytes)";
  if (file.substr(0, kMagic.size()) != kMagic) return "bad magic";
  if (get_le(file, 8, 4) != kFormatVersion)
    return "format version " + std::to_string(get_le(file, 8, 4));
  const uint64_t cubin_bytes = get_le(file, 16, 8);
  const uint64_t log_bytes = get_le(file, 24, 8);
  const uint64_t payload = file.size() - kHeaderBytes;
  if (cubin_bytes > payload || log_bytes != payload - cubin_bytes) {
    return "lengths " + std::to_string(cubin_bytes) + " + " + std::to_string(log_bytes) +
           " do not match the " + std::to_string(payload) + " payload bytes";
  }
  const std::string_view cubin = file.substr(kHeaderBytes, cubin_bytes);
  const std::string_view log = file.substr(kHeaderBytes + cubin_bytes);
  const Sha256::Digest expected = entry_checksum(file, cubin, log);
  if (file.substr(kChecksummedHeaderBytes, expected.size()) !=
      std::string_view(reinterpret_cast<const char*>(expected.data()), expected.size())) {
    return "checksum mismatch";
  }
  kernel.cubin = std::string(cubin);
  kernel.log = std::string(log);
  return "";
}

// One lock per key within this process: threads asking for the same kernel wait for the first
// compile instead of repeating it. (Other processes may compile it too; rename keeps that safe.)
std::shared_ptr<std::mutex> key_lock(const std::string& key) {
  static std::mutex table_mutex;
  static std::map<std::string, std::shared_ptr<std::mutex>> locks;
  std::lock_guard<std::mutex> lock(table_mutex);
  std::shared_ptr<std::mutex>& entry = locks[key];
  if (!entry) entry = std::make_shared<std::mutex>();
  return entry;
}

}  // namespace

// Reads the whole file; false when it does not exist or cannot be opened.
bool read_cache_file(const std::string& path, std::string& contents) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  contents = buffer.str();
  return true;
}

// Writes to a unique temp file in the cache directory, then renames it over the entry: readers
// in other processes see either no entry or a complete one. Failures only cost the caching.
void write_cache_file(const std::string& path_name, const std::string& contents) {
  const fs::path path = path_name;
  static std::atomic<uint64_t> counter{0};
  const fs::path temp = path.parent_path() /
                        (path.filename().string() + ".tmp." + std::to_string(getpid()) + "." +
                         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id())) +
                         "." + std::to_string(counter++));
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    out.close();
    if (!out) {
      std::error_code ignored;
      fs::remove(temp, ignored);
      log_info("cannot write cache entry " + temp.string() + "; continuing without caching it");
      return;
    }
  }
  std::error_code error;
  fs::rename(temp, path, error);
  if (error) {
    std::error_code ignored;
    fs::remove(temp, ignored);
    log_info("cannot rename cache entry into " + path.string() + ": " + error.message() +
             "; continuing without caching it");
  }
}

std::string cache_key(const KernelSpec& spec, const std::string& arch) {
  Sha256 hash;
  hash.update_field("flare jit cache key v1");
  hash.update_field(FLARE_VERSION);
  hash.update_field(nvrtc::version_string());
  hash.update_field(embedded_sources_digest());
  hash.update_field(spec.translation_unit());
  hash.update_field(spec.entry);
  hash.update_field(arch);
  for (const std::string& option : nvrtc_options(arch)) hash.update_field(option);
  return to_hex(hash.finish());
}

std::string cache_directory() {
  const char* configured = std::getenv("FLARE_CACHE_DIR");
  if (configured != nullptr && configured[0] != '\0') return configured;
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] == '\0') {
    const passwd* user = getpwuid(getuid());
    home = user != nullptr ? user->pw_dir : nullptr;
  }
  FLARE_CHECK(home != nullptr && home[0] != '\0', ErrorCode::kIoError,
              "cannot locate the JIT cache: set FLARE_CACHE_DIR (HOME is unset)");
  return (fs::path(home) / ".cache" / "flare").string();
}

CompiledKernel compile_cached(const KernelSpec& spec, const std::string& arch) {
  check_arch(arch);
  const std::string key = cache_key(spec, arch);
  const fs::path directory = cache_directory();
  const fs::path path = directory / (key + ".cubin");
  const std::shared_ptr<std::mutex> lock_for_key = key_lock(key);
  std::lock_guard<std::mutex> lock(*lock_for_key);

  std::string contents;
  if (read_cache_file(path.string(), contents)) {
    CompiledKernel cached;
    const std::string problem = decode_entry(contents, cached);
    if (problem.empty()) {
      cached.usage = resource_usage(cached.log, cached.cubin, entry_names(spec),
                                    spec.label.empty() ? spec.entry : spec.label);
      cached.from_cache = true;
      return cached;
    }
    log_info("JIT cache entry " + path.string() + " is corrupt (" + problem + "); recompiling");
  }

  CompiledKernel compiled = compile(spec, arch);
  std::error_code error;
  fs::create_directories(directory, error);
  if (error) {
    log_info("cannot create JIT cache directory " + directory.string() + ": " + error.message() +
             "; continuing without caching");
    return compiled;
  }
  write_cache_file(path.string(), encode_entry(compiled));
  return compiled;
}

}  // namespace flare::jit
