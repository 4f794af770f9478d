// flare::Error and the names of its codes.
#include "flare/core/error.h"

namespace flare {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kWorkspaceTooSmall: return "workspace too small";
    case ErrorCode::kIndexOutOfRange: return "index out of range";
    case ErrorCode::kNoCudaDevice: return "no CUDA device";
    case ErrorCode::kCudaError: return "CUDA error";
    case ErrorCode::kCompileError: return "compile error";
    case ErrorCode::kIoError: return "I/O error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

}  // namespace flare
