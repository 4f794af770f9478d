// Progress of a long `flare` command on stderr: one line naming the current phase (a step of
// unknown length, or a bar of done/total), redrawn in place and erased when the command is done;
// silent unless stderr is a terminal, so logs and pipes never see carriage returns.
#pragma once

#include <string>

namespace flare::cli {

class Progress {
 public:
  explicit Progress(std::string command);  // "bench": lines read "flare bench: <phase>"
  ~Progress();                             // finish()
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void step(const std::string& phase);                      // "warm-up..."
  void bar(const std::string& phase, int done, int total);  // "timing [####    ] 3/8"
  // Prints "flare: note: <text>" on a line of its own, above the progress line.
  void note(const std::string& text);
  void finish();  // erases the line, before the command prints its result

 private:
  void draw(const std::string& line);

  std::string prefix_;
  std::string line_;  // what is drawn now, redrawn after a note
  bool active_;
};

}  // namespace flare::cli
