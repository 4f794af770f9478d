// The .npy codec of the flare tool: round trips of every dtype through format versions 1.0,
// 2.0 and 3.0, byte-for-byte agreement with NumPy's own output, and a clear error naming the
// file for every kind of malformed or unsupported file.
#include "tools/flare/npy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <ostream>
#include <string>
#include <vector>

#include "flare/core/error.h"
#include "flare/core/tensor.h"
#include "testing/expect_error.h"
#include "tools/cli_test_support.h"

namespace flare {
namespace {

using cli::NpyWriteOptions;
using cli::read_npy;
using cli::write_npy;
using testing::read_file_bytes;
using testing::ScratchDir;
using testing::write_file_bytes;

// A tensor whose bytes are all distinct-ish, so a reader that shuffles or drops bytes fails.
HostTensor patterned(DType dtype, const std::vector<int64_t>& shape) {
  HostTensor tensor(dtype, shape);
  const size_t bytes = static_cast<size_t>(tensor.numel()) * dtype_bytes(dtype);
  auto* data = tensor.data<uint8_t>();
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<uint8_t>(i * 37 + 11);
  return tensor;
}

void expect_same(const HostTensor& actual, const HostTensor& expected) {
  EXPECT_EQ(actual.dtype(), expected.dtype());
  EXPECT_EQ(actual.shape(), expected.shape());
  const size_t bytes = static_cast<size_t>(expected.numel()) * dtype_bytes(expected.dtype());
  ASSERT_EQ(static_cast<size_t>(actual.numel()) * dtype_bytes(actual.dtype()), bytes);
  EXPECT_EQ(std::memcmp(actual.data<void>(), expected.data<void>(), bytes), 0);
}

struct DtypeCase {
  DType dtype;
  const char* descr;
};
void PrintTo(const DtypeCase& c, std::ostream* os) { *os << dtype_name(c.dtype); }

class NpyRoundTrip : public ::testing::TestWithParam<std::tuple<DtypeCase, int>> {};

TEST_P(NpyRoundTrip, PreservesDtypeShapeAndBytes) {
  const auto [dtype_case, version] = GetParam();
  ScratchDir scratch;
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {}, {1}, {7}, {3, 5}, {2, 3, 1, 4}, {2, 1, 3, 1, 2, 3}, {4, 0, 3}}) {
    SCOPED_TRACE(::testing::Message() << "shape rank " << shape.size());
    const HostTensor tensor = patterned(dtype_case.dtype, shape);
    const std::string path = scratch.file("t.npy");
    write_npy(path, tensor.view(), NpyWriteOptions{version, false});
    const std::string bytes = read_file_bytes(path);
    ASSERT_GE(bytes.size(), 10u);
    EXPECT_EQ(bytes[6], static_cast<char>(version));
    const size_t data_bytes = static_cast<size_t>(tensor.numel()) * dtype_bytes(tensor.dtype());
    EXPECT_EQ((bytes.size() - data_bytes) % 64, 0u) << "NumPy aligns the data to 64 bytes";
    const cli::NpyArray array = read_npy(path);
    EXPECT_EQ(array.descr, dtype_case.descr);
    expect_same(array.tensor, tensor);
    EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndVersions, NpyRoundTrip,
                         ::testing::Combine(::testing::Values(DtypeCase{DType::kF32, "<f4"},
                                                              DtypeCase{DType::kF16, "<f2"},
                                                              DtypeCase{DType::kI32, "<i4"},
                                                              DtypeCase{DType::kI64, "<i8"},
                                                              DtypeCase{DType::kU8, "|u1"}),
                                            ::testing::Values(1, 2, 3)),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param).dtype)) + "_v" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(Npy, BoolRoundTripAndValues) {
  ScratchDir scratch;
  HostTensor mask(DType::kU8, {2, 5});
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<uint8_t>()[i] = (i * 7 % 3) == 0;
  for (int version : {1, 2, 3}) {
    const std::string path = scratch.file("mask.npy");
    write_npy(path, mask.view(), NpyWriteOptions{version, true});
    const cli::NpyArray array = read_npy(path);
    EXPECT_EQ(array.descr, "|b1");
    expect_same(array.tensor, mask);
  }
  mask.data<uint8_t>()[3] = 2;
  EXPECT_FLARE_ERROR(write_npy(scratch.file("bad.npy"), mask.view(), NpyWriteOptions{1, true}),
                     ErrorCode::kInvalidArgument, "expected 0 or 1");
  EXPECT_FALSE(std::filesystem::exists(scratch.file("bad.npy")));
}

// The exact bytes np.save(f, np.arange(6, dtype='<f4').reshape(2, 3)) writes.
std::string numpy_arange_2x3() {
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  header += std::string(128 - 10 - header.size() - 1, ' ') + "\n";
  std::string bytes = std::string("\x93NUMPY\x01\x00", 8) + std::string(1, '\x76') + '\0' + header;
  for (int i = 0; i < 6; ++i) {
    const float value = static_cast<float>(i);
    bytes.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }
  return bytes;
}

TEST(Npy, WritesWhatNumpyWrites) {
  ScratchDir scratch;
  HostTensor tensor(DType::kF32, {2, 3});
  for (int i = 0; i < 6; ++i) tensor.data<float>()[i] = static_cast<float>(i);
  write_npy(scratch.file("a.npy"), tensor.view());
  EXPECT_EQ(read_file_bytes(scratch.file("a.npy")), numpy_arange_2x3());
}

TEST(Npy, ReadsNumpyHeaderVariants) {
  ScratchDir scratch;
  const std::string path = scratch.file("v.npy");
  const auto file_with_header = [](int version, const std::string& dict, const std::string& data) {
    const size_t preamble = version == 1 ? 10 : 12;
    std::string header = dict;
    header += std::string(64 - (preamble + header.size() + 1) % 64, ' ') + "\n";
    std::string bytes = std::string("\x93NUMPY", 6) + static_cast<char>(version) + '\0';
    for (size_t i = 0; i < preamble - 8; ++i)
      bytes += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return bytes + header + data;
  };
  const std::string two_ints("\x05\x00\x00\x00\xfe\xff\xff\xff", 8);
  // Keys in another order, double quotes, Python 2 long suffixes, no trailing comma.
  for (const std::string& dict : {
           std::string("{'shape': (2,), 'fortran_order': False, 'descr': '<i4'}"),
           std::string("{\"descr\": \"<i4\", \"fortran_order\": False, \"shape\": (2L,), }"),
           std::string("{'descr':'<i4','fortran_order':False,'shape':(2,)}"),
       }) {
    for (int version : {1, 2, 3}) {
      SCOPED_TRACE(dict);
      write_file_bytes(path, file_with_header(version, dict, two_ints));
      const cli::NpyArray array = read_npy(path);
      ASSERT_EQ(array.tensor.shape(), std::vector<int64_t>{2});
      EXPECT_EQ(array.tensor.data<int32_t>()[0], 5);
      EXPECT_EQ(array.tensor.data<int32_t>()[1], -2);
    }
  }
}

TEST(Npy, MalformedFilesNameTheFile) {
  ScratchDir scratch;
  const std::string path = scratch.file("broken.npy");
  const std::string good = numpy_arange_2x3();
  const auto expect_read_error = [&](const std::string& bytes, ErrorCode code,
                                     const std::string& substring) {
    write_file_bytes(path, bytes);
    EXPECT_FLARE_ERROR(read_npy(path), code, substring);
    EXPECT_FLARE_ERROR(read_npy(path), code, path);
  };
  const auto with_dict = [&](const std::string& dict, const std::string& data) {
    std::string header = dict + std::string(128 - 10 - dict.size() - 1, ' ') + "\n";
    return good.substr(0, 10) + header + data;
  };
  const std::string floats = good.substr(128);  // 24 bytes
  expect_read_error("", ErrorCode::kIoError, "magic");
  expect_read_error("PK\x03\x04 not numpy at all", ErrorCode::kIoError, "magic");
  expect_read_error(good.substr(0, 9), ErrorCode::kIoError, "preamble");
  std::string bad_version = good;
  bad_version[6] = 4;
  expect_read_error(bad_version, ErrorCode::kIoError, "format version 4.0");
  expect_read_error(good.substr(0, 60), ErrorCode::kIoError, "header claims 118 bytes");
  expect_read_error(good.substr(0, good.size() - 1), ErrorCode::kIoError, "(truncated)");
  expect_read_error(good + "x", ErrorCode::kIoError, "the file has 25");
  expect_read_error(with_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", floats),
                    ErrorCode::kUnsupported, "fortran_order=True");
  expect_read_error(
      with_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", floats),
      ErrorCode::kUnsupported, "big-endian");
  expect_read_error(with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", floats),
                    ErrorCode::kUnsupported, "astype(np.float32)");
  expect_read_error(with_dict("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", floats),
                    ErrorCode::kUnsupported, "dtype '<c8' is not supported");
  expect_read_error(
      with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", floats),
      ErrorCode::kUnsupported, "structured");
  expect_read_error(with_dict("{'descr': '<f4', 'shape': (2, 3), }", floats), ErrorCode::kIoError,
                    "needs the keys");
  expect_read_error(
      with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", floats),
      ErrorCode::kIoError, "unexpected header key 'x'");
  expect_read_error(
      with_dict("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2, 3), }", floats),
      ErrorCode::kIoError, "True or False");
  expect_read_error(
      with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", floats),
      ErrorCode::kIoError, "non-negative integer");
  expect_read_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, }", floats),
                    ErrorCode::kIoError, "non-negative integer");
  expect_read_error(
      with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 1, 1, 6), }",
                floats),
      ErrorCode::kUnsupported, "at most 6 dimensions");
  expect_read_error(
      with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }",
                floats),
      ErrorCode::kIoError, "overflows");
  expect_read_error(with_dict("{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3), }", floats),
                    ErrorCode::kIoError, "expected ','");

  std::string bools(24, '\0');
  bools[2] = 7;
  const std::string bad_bool =
      with_dict("{'descr': '|b1', 'fortran_order': False, 'shape': (24,), }", bools);
  expect_read_error(bad_bool, ErrorCode::kIoError, "bool element 2 holds 7");

  EXPECT_FLARE_ERROR(read_npy(scratch.file("missing.npy")), ErrorCode::kIoError,
                     "cannot open " + scratch.file("missing.npy"));
}

TEST(Npy, WriteErrors) {
  ScratchDir scratch;
  const HostTensor bf16(DType::kBF16, {4});
  EXPECT_FLARE_ERROR(write_npy(scratch.file("b.npy"), bf16.view()), ErrorCode::kUnsupported,
                     "bfloat16 has no .npy dtype");
  const HostTensor matrix = patterned(DType::kF32, {4, 6});
  EXPECT_FLARE_ERROR(write_npy(scratch.file("s.npy"), matrix.view().slice(1, 0, 3)),
                     ErrorCode::kInvalidArgument, "contiguous");
  EXPECT_FLARE_ERROR(write_npy(scratch.file("no_such_dir/o.npy"), matrix.view()),
                     ErrorCode::kIoError, "cannot write " + scratch.file("no_such_dir/o.npy"));
  EXPECT_FLARE_ERROR(write_npy(scratch.file("v.npy"), matrix.view(), NpyWriteOptions{4, false}),
                     ErrorCode::kInvalidArgument, "major version must be 1, 2 or 3");
  EXPECT_FALSE(std::filesystem::exists(scratch.file("b.npy")));
  EXPECT_FALSE(std::filesystem::exists(scratch.file("s.npy")));
}

}  // namespace
}  // namespace flare
