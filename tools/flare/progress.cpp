// Progress bar on stderr (see progress.h).
#include "tools/flare/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace flare::cli {
namespace {
constexpr int kBarWidth = 30;
}  // namespace

ProgressBar::ProgressBar(std::string label, int total, bool enabled)
    : label_(std::move(label)),
      total_(std::max(total, 1)),
      active_(enabled && isatty(STDERR_FILENO)) {
  update(0);
}

ProgressBar::~ProgressBar() {
  if (active_) std::fprintf(stderr, "\r\033[K");  // back to column 0, clear the line
}

void ProgressBar::update(int done) {
  if (!active_) return;
  done = std::clamp(done, 0, total_);
  const int filled = done * kBarWidth / total_;
  const std::string bar = std::string(filled, '#') + std::string(kBarWidth - filled, ' ');
  std::fprintf(stderr, "\r%s [%s] %d/%d", label_.c_str(), bar.c_str(), done, total_);
  std::fflush(stderr);
}

}  // namespace flare::cli
