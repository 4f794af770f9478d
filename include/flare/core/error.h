// flare::Error, the library's one exception type: a code plus a message that names the
// argument and the expected versus actual value. FLARE_CHECK builds such messages.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flare {

enum class ErrorCode {
  kInvalidArgument,    // malformed input: shapes, dtypes, indices, options
  kUnsupported,        // well-formed but not implemented (head dim, dtype, variant)
  kWorkspaceTooSmall,  // the plan does not fit the workspace sized at creation
  kIndexOutOfRange,    // index data on the device (page ids) pointed outside a tensor
  kNoCudaDevice,       // no driver, or no device with that index
  kCudaError,          // a CUDA driver call failed
  kCompileError,       // NVRTC rejected a kernel; the message carries its log
  kIoError,            // files: .npy, the JIT cache
  kInternal,           // a broken invariant inside flare (a bug)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

template <class... Parts>
[[noreturn]] void fail(ErrorCode code, Parts&&... parts) {
  std::ostringstream message;
  (message << ... << std::forward<Parts>(parts));
  throw Error(code, message.str());
}

}  // namespace flare

// FLARE_CHECK(cond, code, parts...): throws flare::Error(code, concat(parts...)) when !cond.
#define FLARE_CHECK(cond, code, ...)      \
  do {                                    \
    if (!(cond)) ::flare::fail(code, __VA_ARGS__); \
  } while (0)
