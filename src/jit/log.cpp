// JIT logging: one "[flare] ..." line per message on stderr, silenced by FLARE_LOG=quiet.
#include "flare/jit/log.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace flare::jit {

void log_info(const std::string& message) {
  // Read on every call (cheap next to a compile) so a process can silence logging at any time.
  const char* level = std::getenv("FLARE_LOG");
  if (level != nullptr && std::strcmp(level, "quiet") == 0) return;
  const std::string line = "[flare] " + message + "\n";
  // One write per line under a lock: parallel precompile threads never interleave a line.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

void log_warning(const std::string& message) { log_info("warning: " + message); }

}  // namespace flare::jit
