// Progress line on stderr (see progress.h).
#include "tools/flare/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace flare::cli {
namespace {
constexpr int kBarWidth = 30;
constexpr const char* kClearLine = "\r\033[K";  // back to column 0, erase to the end
}  // namespace

Progress::Progress(std::string command)
    : prefix_("flare " + std::move(command) + ": "), active_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() { finish(); }

void Progress::finish() {
  if (active_ && !line_.empty()) std::fputs(kClearLine, stderr);
  line_.clear();
}

void Progress::step(const std::string& phase) { draw(prefix_ + phase); }

void Progress::bar(const std::string& phase, int done, int total) {
  total = std::max(total, 1);
  done = std::clamp(done, 0, total);
  const int filled = done * kBarWidth / total;
  draw(prefix_ + phase + " [" + std::string(filled, '#') + std::string(kBarWidth - filled, ' ') +
       "] " + std::to_string(done) + "/" + std::to_string(total));
}

void Progress::note(const std::string& text) {
  if (active_ && !line_.empty()) std::fputs(kClearLine, stderr);
  std::fprintf(stderr, "flare: note: %s\n", text.c_str());
  if (active_ && !line_.empty()) std::fputs(line_.c_str(), stderr);
  std::fflush(stderr);
}

void Progress::draw(const std::string& line) {
  if (!active_) return;
  line_ = line;
  std::fprintf(stderr, "%s%s", kClearLine, line_.c_str());
  std::fflush(stderr);
}

}  // namespace flare::cli
