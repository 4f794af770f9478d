// .npy reading and writing (see npy.h). Format: the magic "\x93NUMPY", a version byte pair,
// the header length (uint16 in 1.0, uint32 in 2.0/3.0), then a Python dict literal
// {'descr': ..., 'fortran_order': ..., 'shape': (...)} padded with spaces and a newline so
// the data starts on a 64-byte boundary, then the raw little-endian data.
#include "tools/flare/npy.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string_view>
#include <vector>

#include "flare/core/error.h"

namespace flare::cli {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr size_t kHeaderAlignment = 64;  // NumPy aligns the data start to 64 bytes

struct DescrInfo {
  std::string_view descr;
  DType dtype;
};
constexpr DescrInfo kDescrs[] = {
    {"<f4", DType::kF32}, {"<f2", DType::kF16}, {"<i4", DType::kI32},
    {"<i8", DType::kI64}, {"|u1", DType::kU8},  {"|b1", DType::kU8},
};

[[noreturn]] void malformed(const std::string& path, const std::string& what) {
  fail(ErrorCode::kIoError, path, ": not a valid .npy file: ", what);
}

// Recursive-descent reader of the header dict; only the literal forms NumPy writes.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran_order, std::vector<int64_t>& shape) {
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (!peek_is('}')) {
      const std::string key = quoted();
      expect(':');
      if (key == "descr") {
        if (peek_is('[')) {
          fail(ErrorCode::kUnsupported, path_, ": structured (record) dtypes are not supported");
        }
        descr = quoted();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran_order = boolean();
        have_order = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        malformed(path_, "unexpected header key '" + key + "'");
      }
      if (!peek_is('}')) expect(',');
    }
    expect('}');
    if (!have_descr || !have_order || !have_shape) {
      malformed(path_, "the header needs the keys 'descr', 'fortran_order' and 'shape', got '" +
                           std::string(text_) + "'");
    }
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t')) ++pos_;
  }
  bool peek_is(char c) {
    skip_space();
    return pos_ < text_.size() && text_[pos_] == c;
  }
  void expect(char c) {
    if (!peek_is(c)) {
      malformed(path_, std::string("expected '") + c + "' at column " + std::to_string(pos_) +
                           " of the header '" + std::string(text_) + "'");
    }
    ++pos_;
  }
  std::string quoted() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      malformed(path_, "expected a quoted string at column " + std::to_string(pos_) +
                           " of the header '" + std::string(text_) + "'");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) malformed(path_, "unterminated string in the header");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      if (text_.substr(pos_).starts_with(word)) {
        pos_ += std::strlen(word);
        return value;
      }
    }
    malformed(path_,
              "fortran_order must be True or False in the header '" + std::string(text_) + "'");
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    while (!peek_is(')')) {
      int64_t dim = 0;
      bool any_digit = false;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        if (dim > (std::numeric_limits<int64_t>::max() - 9) / 10) {
          malformed(path_, "a shape entry overflows int64");
        }
        dim = dim * 10 + (text_[pos_++] - '0');
        any_digit = true;
      }
      if (!any_digit) {
        malformed(path_, "expected a non-negative integer in the shape at column " +
                             std::to_string(pos_) + " of the header '" + std::string(text_) + "'");
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(dim);
      if (!peek_is(')')) expect(',');
    }
    expect(')');
    return dims;
  }

  std::string_view text_;
  const std::string& path_;
  size_t pos_ = 0;
};

DType dtype_of_descr(const std::string& path, const std::string& descr) {
  for (const DescrInfo& info : kDescrs) {
    if (info.descr == descr) return info.dtype;
  }
  if (!descr.empty() && descr[0] == '>') {
    fail(ErrorCode::kUnsupported, path, ": big-endian dtype '", descr,
         "' is not supported; convert with arr.astype(arr.dtype.newbyteorder('<'))");
  }
  fail(ErrorCode::kUnsupported, path, ": dtype '", descr,
       "' is not supported; expected one of <f4 (float32), <f2 (float16), <i4 (int32), "
       "<i8 (int64), |u1 (uint8), |b1 (bool)",
       descr == "<f8" ? " (convert float64 with arr.astype(np.float32))" : "");
}

std::string_view descr_of_dtype(const std::string& path, DType dtype, bool as_bool) {
  if (as_bool) {
    FLARE_CHECK(dtype == DType::kU8, ErrorCode::kInvalidArgument, path,
                ": only a uint8 tensor can be written as bool, got ", dtype_name(dtype));
    return "|b1";
  }
  for (const DescrInfo& info : kDescrs) {
    if (info.dtype == dtype) return info.descr;
  }
  fail(ErrorCode::kUnsupported, path, ": ", dtype_name(dtype),
       " has no .npy dtype; convert it to float32 first");
}

uint32_t read_little_endian(const unsigned char* bytes, int count) {
  uint32_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

}  // namespace

NpyArray read_npy(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(ErrorCode::kIoError, "cannot open ", path, ": ", std::strerror(errno));
  std::error_code size_error;
  const auto file_size = static_cast<uint64_t>(std::filesystem::file_size(path, size_error));
  if (size_error) fail(ErrorCode::kIoError, "cannot stat ", path, ": ", size_error.message());

  unsigned char preamble[12] = {};
  file.read(reinterpret_cast<char*>(preamble), 8);
  if (file.gcount() < 8 || std::string_view(reinterpret_cast<char*>(preamble), 6) != kMagic) {
    malformed(path, "it does not start with the magic string \\x93NUMPY");
  }
  const int major = preamble[6];
  const int minor = preamble[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    malformed(path, "format version " + std::to_string(major) + "." + std::to_string(minor) +
                        " is not 1.0, 2.0 or 3.0");
  }
  const int length_bytes = major == 1 ? 2 : 4;
  file.read(reinterpret_cast<char*>(preamble + 8), length_bytes);
  if (file.gcount() < length_bytes) malformed(path, "the file ends inside the preamble");
  const uint64_t header_length = read_little_endian(preamble + 8, length_bytes);
  const uint64_t data_offset = 8 + static_cast<uint64_t>(length_bytes) + header_length;
  if (data_offset > file_size) {
    malformed(path, "the header claims " + std::to_string(header_length) +
                        " bytes but the file has only " + std::to_string(file_size));
  }
  std::string header(header_length, '\0');
  file.read(header.data(), static_cast<std::streamsize>(header_length));
  // The dict is followed by space padding and one newline.
  const size_t header_end = header.find_last_not_of(" \n\r\t");
  header.resize(header_end == std::string::npos ? 0 : header_end + 1);

  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
  HeaderParser(header, path).parse(descr, fortran_order, shape);
  const DType dtype = dtype_of_descr(path, descr);
  if (fortran_order) {
    fail(ErrorCode::kUnsupported, path,
         ": fortran_order=True is not supported; save a C-ordered array "
         "(np.save(path, np.ascontiguousarray(arr)))");
  }
  FLARE_CHECK(static_cast<int>(shape.size()) <= kMaxDims, ErrorCode::kUnsupported, path,
              ": arrays of at most ", kMaxDims, " dimensions are supported, got ", shape.size());

  uint64_t expected_bytes = dtype_bytes(dtype);
  for (int64_t dim : shape) {
    if (dim != 0 &&
        expected_bytes > std::numeric_limits<uint64_t>::max() / 2 / static_cast<uint64_t>(dim)) {
      malformed(path, "the shape's size overflows");
    }
    expected_bytes *= static_cast<uint64_t>(dim);
  }
  const uint64_t actual_bytes = file_size - data_offset;
  if (actual_bytes != expected_bytes) {
    malformed(path, "shape and dtype " + descr + " need " + std::to_string(expected_bytes) +
                        " data bytes, the file has " + std::to_string(actual_bytes) +
                        (actual_bytes < expected_bytes ? " (truncated)" : ""));
  }

  NpyArray array{HostTensor(dtype, shape), descr};
  file.read(array.tensor.data<char>(), static_cast<std::streamsize>(expected_bytes));
  if (static_cast<uint64_t>(file.gcount()) != expected_bytes) {
    fail(ErrorCode::kIoError, "cannot read ", path, ": ", std::strerror(errno));
  }
  if (descr == "|b1") {
    const uint8_t* values = array.tensor.data<uint8_t>();
    for (int64_t i = 0; i < array.tensor.numel(); ++i) {
      FLARE_CHECK(values[i] <= 1, ErrorCode::kIoError, path, ": bool element ", i, " holds ",
                  static_cast<int>(values[i]), ", expected 0 or 1");
    }
  }
  return array;
}

void write_npy(const std::string& path, const TensorView& tensor, const NpyWriteOptions& options) {
  FLARE_CHECK(tensor.device.is_cpu() && tensor.is_contiguous(), ErrorCode::kInvalidArgument, path,
              ": write_npy needs a contiguous CPU tensor, got one on ", tensor.device.str(),
              " with shape ", tensor.shape_str());
  FLARE_CHECK(options.major_version >= 1 && options.major_version <= 3, ErrorCode::kInvalidArgument,
              path, ": .npy major version must be 1, 2 or 3, got ", options.major_version);
  const std::string_view descr = descr_of_dtype(path, tensor.dtype, options.as_bool);

  std::string dict = "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': (";
  for (int d = 0; d < tensor.ndim; ++d) {
    dict += std::to_string(tensor.shape[d]) + (tensor.ndim == 1      ? ","
                                               : d + 1 < tensor.ndim ? ", "
                                                                     : "");
  }
  dict += "), }";
  // The preamble (magic, version, header length) plus the header end on a 64-byte boundary.
  // Headers of arrays of at most kMaxDims dimensions always fit version 1.0's uint16 length.
  const int major = options.major_version;
  const size_t preamble_bytes = major == 1 ? 10 : 12;
  const size_t unpadded = preamble_bytes + dict.size() + 1;  // + the final newline
  const size_t padded = (unpadded + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  const std::string header = dict + std::string(padded - unpadded, ' ') + "\n";

  std::string preamble(kMagic);
  preamble += static_cast<char>(major);
  preamble += '\0';
  for (size_t i = 0; i < preamble_bytes - 8; ++i) {
    preamble += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  }

  const size_t data_bytes = static_cast<size_t>(tensor.numel()) * dtype_bytes(tensor.dtype);
  if (options.as_bool) {
    const auto* values = static_cast<const uint8_t*>(tensor.data);
    for (size_t i = 0; i < data_bytes; ++i) {
      FLARE_CHECK(values[i] <= 1, ErrorCode::kInvalidArgument, path, ": bool element ", i,
                  " holds ", static_cast<int>(values[i]), ", expected 0 or 1");
    }
  }

  // Written beside the target and renamed, so an interrupted run leaves no partial file.
  const std::string partial = path + ".partial";
  {
    std::ofstream file(partial, std::ios::binary | std::ios::trunc);
    if (!file) fail(ErrorCode::kIoError, "cannot write ", path, ": ", std::strerror(errno));
    file.write(preamble.data(), static_cast<std::streamsize>(preamble.size()));
    file.write(header.data(), static_cast<std::streamsize>(header.size()));
    file.write(static_cast<const char*>(tensor.data), static_cast<std::streamsize>(data_bytes));
    file.flush();
    if (!file) {
      std::remove(partial.c_str());
      fail(ErrorCode::kIoError, "cannot write ", path, ": ", std::strerror(errno));
    }
  }
  std::error_code rename_error;
  std::filesystem::rename(partial, path, rename_error);
  if (rename_error) {
    std::remove(partial.c_str());
    fail(ErrorCode::kIoError, "cannot write ", path, ": ", rename_error.message());
  }
}

}  // namespace flare::cli
