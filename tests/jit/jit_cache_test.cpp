// The on-disk cubin cache: keys, miss then hit, rebuild of corrupt entries, concurrent threads
// and processes, directory handling; and precompile's ordering and error propagation.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "flare/jit/compiler.h"
#include "jit/jit_test_support.h"
#include "src/jit/sha256.h"
#include "testing/expect_error.h"
#include "testing/nvrtc.h"

namespace flare::jit {
namespace {

namespace fs = std::filesystem;
using testing::JitTest;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// A valid entry file (format in src/jit/cache.cpp) with the same cubin and another log.
std::string entry_with_log(const std::string& entry, const std::string& log) {
  constexpr size_t kHeaderBytes = 64;
  constexpr size_t kChecksummedBytes = 32;
  uint64_t cubin_bytes = 0;
  std::memcpy(&cubin_bytes, entry.data() + 16, sizeof(cubin_bytes));
  std::string header = entry.substr(0, kChecksummedBytes);
  const uint64_t log_bytes = log.size();
  std::memcpy(header.data() + 24, &log_bytes, sizeof(log_bytes));
  const std::string cubin = entry.substr(kHeaderBytes, cubin_bytes);
  Sha256 hash;
  hash.update(header);
  hash.update(cubin);
  hash.update(log);
  const Sha256::Digest checksum = hash.finish();
  return header + std::string(reinterpret_cast<const char*>(checksum.data()), checksum.size()) +
         cubin + log;
}

std::vector<std::string> directory_entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

class CacheTest : public JitTest {
 protected:
  fs::path entry_path(const KernelSpec& spec, const std::string& arch) const {
    return fs::path(cache_dir()) / (cache_key(spec, arch) + ".cubin");
  }
};

TEST_F(CacheTest, KeyIsHexSha256AndTracksEveryInput) {
  const KernelSpec base = testing::simple_spec();
  const std::string key = cache_key(base, "sm_80");
  EXPECT_EQ(key.size(), 64u);
  EXPECT_EQ(key.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(cache_key(base, "sm_80"), key);

  KernelSpec relabeled = base;
  relabeled.label = "another name";
  EXPECT_EQ(cache_key(relabeled, "sm_80"), key) << "the label is for logs only";

  std::set<std::string> keys = {key, cache_key(base, "sm_90a")};
  keys.insert(cache_key(testing::simple_spec("3.0f"), "sm_80"));
  KernelSpec extra_define = base;
  extra_define.defines.push_back({"EXTRA", "1"});
  keys.insert(cache_key(extra_define, "sm_80"));
  KernelSpec variant = base;
  variant.variant_source += "\n// a comment still changes the source\n";
  keys.insert(cache_key(variant, "sm_80"));
  KernelSpec entry = base;
  entry.entry = "jit_test_other";
  keys.insert(cache_key(entry, "sm_80"));
  EXPECT_EQ(keys.size(), 6u);
}

TEST_F(CacheTest, LineinfoOptionChangesTheKey) {
  const std::string plain = cache_key(testing::simple_spec(), "sm_80");
  setenv("FLARE_JIT_LINEINFO", "1", 1);
  const std::string with_lineinfo = cache_key(testing::simple_spec(), "sm_80");
  unsetenv("FLARE_JIT_LINEINFO");
  EXPECT_NE(plain, with_lineinfo);
}

TEST_F(CacheTest, MissThenHitWithoutCompiling) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const KernelSpec spec = testing::simple_spec();
  EXPECT_FALSE(fs::exists(entry_path(spec, "sm_80")));
  const CompiledKernel miss = compile_cached(spec, "sm_80");
  EXPECT_FALSE(miss.from_cache);
  EXPECT_GT(miss.compile_seconds, 0.0);
  EXPECT_TRUE(fs::exists(entry_path(spec, "sm_80")));

  unsetenv("FLARE_LOG");
  ::testing::internal::CaptureStderr();
  const CompiledKernel hit = compile_cached(spec, "sm_80");
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(hit.from_cache);
  EXPECT_EQ(hit.compile_seconds, 0.0);
  EXPECT_EQ(logged.find("compiling"), std::string::npos) << "a hit must not compile: " << logged;
  EXPECT_EQ(hit.cubin, miss.cubin);
  EXPECT_EQ(hit.log, miss.log);
  ASSERT_EQ(hit.usage.size(), 1u);
  EXPECT_EQ(hit.usage[0].entry, miss.usage[0].entry);
  EXPECT_EQ(hit.usage[0].registers, miss.usage[0].registers);
  EXPECT_EQ(hit.usage[0].local_bytes, miss.usage[0].local_bytes);

  // Another arch is another entry.
  EXPECT_FALSE(compile_cached(spec, "sm_90a").from_cache);
  EXPECT_EQ(directory_entries(cache_dir()).size(), 2u);
}

// A log without ptxas's report (NVRTC did not run ptxas, see nvrtc_options) never fails a kernel
// that compiled: the entry is served, its usage read from the cubin, and a warning logged.
TEST_F(CacheTest, EntryWhoseLogLacksThePtxasReportIsServedWithAWarning) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const KernelSpec spec = testing::two_entry_spec();
  const CompiledKernel original = compile_cached(spec, "sm_90a");
  const fs::path path = entry_path(spec, "sm_90a");
  write_bytes(path, entry_with_log(read_bytes(path), ""));

  unsetenv("FLARE_LOG");
  ::testing::internal::CaptureStderr();
  const CompiledKernel served = compile_cached(spec, "sm_90a");
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(served.from_cache);
  EXPECT_EQ(served.cubin, original.cubin);
  EXPECT_EQ(served.log, "");
  ASSERT_EQ(served.usage.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(served.usage[i].entry, original.usage[i].entry);
    EXPECT_EQ(served.usage[i].registers, original.usage[i].registers);
    EXPECT_EQ(served.usage[i].local_bytes, 0);
    EXPECT_EQ(served.usage[i].spill_bytes, ResourceUsage::kUnknownSpills);
    EXPECT_EQ(served.usage[i].max_threads, original.usage[i].max_threads);
  }
  EXPECT_NE(logged.find("[flare] warning: jit test two entries: ptxas's report in NVRTC's log has "
                        "no entry 'jit_test_bounded', 'jit_test_plain'"),
            std::string::npos)
      << logged;
}

TEST_F(CacheTest, CreatesMissingDirectories) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const fs::path nested = fs::path(cache_dir()) / "a" / "b";
  setenv("FLARE_CACHE_DIR", nested.c_str(), 1);
  EXPECT_EQ(cache_directory(), nested.string());
  EXPECT_FALSE(compile_cached(testing::simple_spec(), "sm_80").from_cache);
  EXPECT_TRUE(compile_cached(testing::simple_spec(), "sm_80").from_cache);
  EXPECT_EQ(directory_entries(nested).size(), 1u);
}

TEST_F(CacheTest, UnusableDirectoryStillReturnsTheCompiledKernel) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const fs::path blocker = fs::path(cache_dir()) / "a_file";
  write_bytes(blocker, "not a directory");
  setenv("FLARE_CACHE_DIR", (blocker / "cache").c_str(), 1);
  const CompiledKernel kernel = compile_cached(testing::simple_spec(), "sm_80");
  EXPECT_FALSE(kernel.from_cache);
  EXPECT_FALSE(kernel.cubin.empty());
}

TEST_F(CacheTest, DefaultDirectoryIsUnderHome) {
  const char* old_home = std::getenv("HOME");
  const std::string saved = old_home ? old_home : "";
  unsetenv("FLARE_CACHE_DIR");
  setenv("HOME", "/tmp/flare_home_for_test", 1);
  EXPECT_EQ(cache_directory(), "/tmp/flare_home_for_test/.cache/flare");
  setenv("FLARE_CACHE_DIR", "", 1);  // empty counts as unset
  EXPECT_EQ(cache_directory(), "/tmp/flare_home_for_test/.cache/flare");
  if (old_home) setenv("HOME", saved.c_str(), 1);
}

// A way to damage a valid cache entry, named for test listings and failures.
struct Corruption {
  const char* name;
  std::string (*apply)(std::string bytes);
};
void PrintTo(const Corruption& corruption, std::ostream* os) { *os << corruption.name; }

// Each corruption of a valid entry must be detected, logged, rebuilt, and then served.
class CorruptEntry : public CacheTest, public ::testing::WithParamInterface<Corruption> {
 protected:
  void SetUp() override {
    CacheTest::SetUp();
    FLARE_SKIP_WITHOUT_NVRTC();
  }
};

TEST_P(CorruptEntry, IsDetectedLoggedAndRebuilt) {
  const KernelSpec spec = testing::simple_spec();
  const CompiledKernel original = compile_cached(spec, "sm_80");
  const fs::path path = entry_path(spec, "sm_80");
  write_bytes(path, GetParam().apply(read_bytes(path)));

  unsetenv("FLARE_LOG");
  ::testing::internal::CaptureStderr();
  const CompiledKernel rebuilt = compile_cached(spec, "sm_80");
  const std::string logged = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(rebuilt.from_cache);
  EXPECT_EQ(rebuilt.cubin, original.cubin);
  EXPECT_NE(logged.find("is corrupt"), std::string::npos) << logged;
  EXPECT_NE(logged.find("compiling"), std::string::npos) << logged;

  const CompiledKernel served = compile_cached(spec, "sm_80");
  EXPECT_TRUE(served.from_cache);
  EXPECT_EQ(served.cubin, original.cubin);
}

INSTANTIATE_TEST_SUITE_P(
    Corruptions, CorruptEntry,
    ::testing::Values(
        Corruption{"flipped_bit_in_the_cubin",
                   [](std::string bytes) {
                     bytes[bytes.size() / 2] ^= 0x10;
                     return bytes;
                   }},
        Corruption{"truncated",
                   [](std::string bytes) { return bytes.substr(0, bytes.size() - 100); }},
        Corruption{"truncated_header", [](std::string bytes) { return bytes.substr(0, 20); }},
        Corruption{"trailing_bytes", [](std::string bytes) { return bytes + "trailing"; }},
        Corruption{"another_files_magic",
                   [](std::string bytes) {
                     bytes[0] = 'X';
                     return bytes;
                   }},
        Corruption{"empty_file", [](std::string) { return std::string(); }}),
    [](const ::testing::TestParamInfo<Corruption>& info) { return std::string(info.param.name); });

TEST_F(CacheTest, ConcurrentThreadsCompileOnceAndAgree) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const KernelSpec spec = testing::local_memory_spec();
  constexpr int kThreads = 6;
  std::vector<CompiledKernel> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { results[t] = compile_cached(spec, "sm_90a"); });
  }
  for (std::thread& thread : threads) thread.join();
  int compiled = 0;
  for (const CompiledKernel& result : results) {
    compiled += result.from_cache ? 0 : 1;
    EXPECT_EQ(result.cubin, results[0].cubin);
  }
  EXPECT_EQ(compiled, 1) << "threads asking for one kernel wait for a single compile";
  EXPECT_EQ(directory_entries(cache_dir()),
            std::vector<std::string>{entry_path(spec, "sm_90a").filename()})
      << "no temp files left behind";
}

TEST_F(CacheTest, ConcurrentProcessesLeaveOneValidEntry) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const KernelSpec spec = testing::simple_spec("4.0f");
  const CompiledKernel expected = compile(spec, "sm_80");  // the reference, not cached
  constexpr int kProcesses = 4;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: no gtest assertions; the exit status reports the result.
      try {
        const CompiledKernel kernel = compile_cached(spec, "sm_80");
        _exit(kernel.cubin == expected.cubin ? 0 : 1);
      } catch (...) {
        _exit(2);
      }
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_EQ(directory_entries(cache_dir()),
            std::vector<std::string>{entry_path(spec, "sm_80").filename()});
  const CompiledKernel served = compile_cached(spec, "sm_80");
  EXPECT_TRUE(served.from_cache);
  EXPECT_EQ(served.cubin, expected.cubin);
}

TEST_F(CacheTest, PrecompileReturnsResultsInOrderAndFillsTheCache) {
  FLARE_SKIP_WITHOUT_NVRTC();
  const std::vector<KernelSpec> specs = {testing::simple_spec("1.0f"), testing::local_memory_spec(),
                                         testing::two_entry_spec(), testing::simple_spec("5.0f")};
  const std::vector<CompiledKernel> results = precompile(specs, "sm_80", 3);
  ASSERT_EQ(results.size(), specs.size());
  EXPECT_EQ(results[0].usage[0].entry, "jit_test_scale");
  EXPECT_EQ(results[1].usage[0].entry, "jit_test_local");
  EXPECT_EQ(results[2].usage.size(), 2u);
  EXPECT_EQ(results[3].usage[0].entry, "jit_test_scale");
  for (size_t i = 0; i < specs.size(); ++i) {
    const CompiledKernel cached = compile_cached(specs[i], "sm_80");
    EXPECT_TRUE(cached.from_cache) << i;
    EXPECT_EQ(cached.cubin, results[i].cubin) << "result " << i << " belongs to spec " << i;
  }
  EXPECT_TRUE(precompile({}, "sm_80").empty());
}

TEST_F(CacheTest, PrecompileRethrowsTheFirstFailureAfterFinishingTheRest) {
  FLARE_SKIP_WITHOUT_NVRTC();
  KernelSpec broken_a = testing::simple_spec();
  broken_a.label = "broken a";
  broken_a.variant_source = "syntax error a";
  KernelSpec broken_b = broken_a;
  broken_b.label = "broken b";
  broken_b.variant_source = "syntax error b";
  const std::vector<KernelSpec> specs = {testing::simple_spec("6.0f"), broken_a,
                                         testing::local_memory_spec(), broken_b};
  EXPECT_FLARE_ERROR(precompile(specs, "sm_80", 2), ErrorCode::kCompileError, "broken a");
  EXPECT_TRUE(compile_cached(specs[0], "sm_80").from_cache);
  EXPECT_TRUE(compile_cached(specs[2], "sm_80").from_cache);
  EXPECT_FLARE_ERROR(precompile(specs, "sm_80", -1), ErrorCode::kInvalidArgument, "num_threads");
}

}  // namespace
}  // namespace flare::jit
