// A one-line progress bar on stderr for long `flare bench` runs; silent unless stderr is a
// terminal, so logs and pipes never see carriage returns.
#pragma once

#include <string>

namespace flare::cli {

class ProgressBar {
 public:
  // Draws nothing unless `enabled` and stderr is a TTY.
  ProgressBar(std::string label, int total, bool enabled);
  ~ProgressBar();  // erases the bar
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void update(int done);

 private:
  std::string label_;
  int total_;
  bool active_;
};

}  // namespace flare::cli
