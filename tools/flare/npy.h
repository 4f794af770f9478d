// The .npy file format (NumPy format versions 1.0, 2.0 and 3.0): how `flare attention` reads
// its input tensors and writes o/lse, so results are reproducible from plain NumPy arrays.
#pragma once

#include <string>

#include "flare/core/tensor.h"

namespace flare::cli {

// dtypes: '<f4' float32, '<f2' float16, '<i4' int32, '<i8' int64, '|u1' uint8 and '|b1' bool
// (read as uint8 0/1). Only little-endian, C-ordered (fortran_order False) arrays of up to
// kMaxDims dimensions; a 0-d array reads as shape [].
struct NpyArray {
  HostTensor tensor;
  std::string descr;  // the file's dtype string, e.g. "<f4" or "|b1"
};

// Throws flare::Error naming `path`: kIoError when the file cannot be read or is not a valid
// .npy file (bad magic, version, header, truncated or oversized data), kUnsupported for valid
// files flare does not read (other dtypes, big-endian, Fortran order, too many dimensions).
NpyArray read_npy(const std::string& path);

struct NpyWriteOptions {
  int major_version = 1;  // 1 (what NumPy writes for these arrays), 2 or 3
  bool as_bool = false;   // write a uint8 tensor as '|b1' (values must be 0 or 1)
};

// Writes a contiguous CPU tensor of dtype f32, f16, i32, i64 or u8 (kUnsupported for bf16 and
// fp8, which NumPy lacks). The file appears under `path` only once completely written.
// Throws kIoError naming `path` when it cannot be written.
void write_npy(const std::string& path, const TensorView& tensor,
               const NpyWriteOptions& options = {});

}  // namespace flare::cli
