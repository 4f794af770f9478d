// The merge kernels' GPU test cases (merge_state_gpu_test.cpp: pairs and in place;
// merge_states_gpu_test.cpp: stacked states): views inside NaN-filled storage in every layout,
// device mirrors, the float64 expectation with per-element bounds, the CPU operator's as a
// second one, and the pair and stacked cases that run the kernels.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flare/api/merge_state.h"
#include "flare/jit/cuda_driver.h"
#include "flare/jit/cuda_sync.h"
#include "flare/reference/merge.h"
#include "testing/compare.h"
#include "testing/elements.h"
#include "testing/expect_error.h"
#include "testing/print.h"
#include "testing/random.h"

namespace flare::merge_gpu {

using testing::element_at;
using testing::Rng;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kSeq = 97;  // odd sizes: rows do not fill the warps' row groups evenly
constexpr int64_t kHeads = 7;

// How a view sits in its storage. Contiguous and padded rows (16-byte aligned) take the
// kernels' 16-byte path; a one-element offset or a transposed layout takes the element path.
enum class Layout { kContiguous, kPadded, kMisaligned, kTransposed };

inline std::string layout_name(Layout layout) {
  switch (layout) {
    case Layout::kContiguous:
      return "contiguous";
    case Layout::kPadded:
      return "padded";
    case Layout::kMisaligned:
      return "misaligned";
    case Layout::kTransposed:
      return "transposed";
  }
  return "unknown";
}
inline void PrintTo(Layout layout, std::ostream* os) { *os << layout_name(layout); }

// A view inside a NaN-filled storage: reads outside the view bring NaN into the results, and
// writes outside it show up as non-NaN padding.
struct Buffer {
  HostTensor storage;
  TensorView view;
};

// v views ([seq, (states,) H, D]) pad or swap their last two dims; s views pad every dim or
// reverse them all.
inline Buffer make_buffer(DType dtype, const std::vector<int64_t>& shape, Layout layout,
                          bool is_v) {
  const size_t rank = shape.size();
  Buffer b;
  if (layout == Layout::kTransposed) {
    std::vector<size_t> order(rank);  // storage dim i holds view dim order[i]
    for (size_t i = 0; i < rank; ++i) order[i] = is_v ? i : rank - 1 - i;
    if (is_v) std::swap(order[rank - 1], order[rank - 2]);
    std::vector<int64_t> storage_shape(rank);
    for (size_t i = 0; i < rank; ++i) storage_shape[i] = shape[order[i]];
    b.storage = HostTensor(dtype, storage_shape);
    b.storage.fill(kNaN);
    const TensorView full = b.storage.view();
    b.view = full;
    for (size_t i = 0; i < rank; ++i) {
      b.view.shape[order[i]] = full.shape[i];
      b.view.strides[order[i]] = full.strides[i];
    }
    return b;
  }
  std::vector<int64_t> storage_shape = shape;
  std::vector<int64_t> begin(rank, 0);
  if (layout == Layout::kPadded || (layout == Layout::kMisaligned && !is_v)) {
    for (size_t i = 0; i < rank; ++i) {
      storage_shape[i] += 2;
      begin[i] = 1;
    }
    if (is_v) {  // 8 elements: 16-byte aligned rows for float32 and 16-bit types alike
      storage_shape[rank - 1] = shape[rank - 1] + 16;
      begin[rank - 1] = 8;
    }
  } else if (layout == Layout::kMisaligned) {
    storage_shape[rank - 1] += 1;
    begin[rank - 1] = 1;
  }
  b.storage = HostTensor(dtype, storage_shape);
  b.storage.fill(kNaN);
  b.view = testing::sub_view(b.storage, begin, shape);
  return b;
}

inline int64_t storage_bytes(const HostTensor& t) {
  return t.numel() * static_cast<int64_t>(dtype_bytes(t.dtype()));
}

// A buffer with a device copy of its storage (at least 16 bytes, so empty views have an
// address) on `device`.
struct Mirrored {
  Buffer host;
  int device;
  cuda::DeviceBuffer memory;

  explicit Mirrored(Buffer b, int device_index = 0)
      : host(std::move(b)),
        device(device_index),
        memory(static_cast<size_t>(std::max<int64_t>(16, storage_bytes(host.storage)))) {
    upload();
  }
  void upload() const {
    if (storage_bytes(host.storage) > 0) {
      cuda::memcpy_htod(memory.data(), host.storage.data<std::byte>(),
                        static_cast<size_t>(storage_bytes(host.storage)));
    }
  }
  void download() {
    if (storage_bytes(host.storage) > 0) {
      cuda::memcpy_dtoh(host.storage.data<std::byte>(), memory.data(),
                        static_cast<size_t>(storage_bytes(host.storage)));
    }
  }
  TensorView device_view() const {
    return testing::rebase_view(host.view, host.storage.data<std::byte>(), memory.data(),
                                Device::cuda(device));
  }
};

// One input state of a merge as [seq, H, D] v and [seq, H] s views (state i of a stacked tensor
// is its select(1, i)).
struct StateView {
  TensorView v;
  TensorView s;
};

inline int64_t v_offset(const TensorView& v, int64_t seq, int64_t head, int64_t d) {
  return seq * v.strides[0] + head * v.strides[1] + d * v.strides[2];
}
inline int64_t s_offset(const TensorView& s, int64_t seq, int64_t head) {
  return seq * s.strides[0] + head * s.strides[1];
}

// LSE of `state` of row `row` (seq * H + head). Pairs: one or both states empty (-inf), equal
// LSEs, far-apart and large LSEs (e^s overflows float32). More states: some empty, whole
// empty rows, large LSEs.
inline float lse_pattern(Rng& rng, int64_t row, int64_t state, int64_t num_states) {
  const float random = static_cast<float>(rng.uniform(-20.0, 20.0));
  if (num_states == 2) {
    switch (row % 13) {
      case 1:
        return state == 0 ? -kInf : random;
      case 2:
        return state == 1 ? -kInf : random;
      case 3:
        return -kInf;
      case 4:
        return 3.25f;
      case 5:
        return state == 0 ? 700.0f + random : -650.0f + random;
      case 6:
        return state == 0 ? 85.5f : 87.25f;
      default:
        return random;
    }
  }
  if (row % 7 == 3 || (row + state) % 4 == 0) return -kInf;
  return row % 11 == 5 ? 500.0f + 3.0f * static_cast<float>(state) + random : random;
}

// Random v, patterned s; every v row of an empty state is NaN (the merge must never read it
// into a sum).
inline void fill_states(const std::vector<StateView>& states, uint64_t seed) {
  Rng rng(seed);
  const int64_t num_states = static_cast<int64_t>(states.size());
  for (int64_t i = 0; i < num_states; ++i) {
    const StateView& st = states[static_cast<size_t>(i)];
    testing::fill_random(st.v, seed * 31 + static_cast<uint64_t>(i));
    for (int64_t seq = 0; seq < st.s.shape[0]; ++seq) {
      for (int64_t head = 0; head < st.s.shape[1]; ++head) {
        const float lse = lse_pattern(rng, seq * st.s.shape[1] + head, i, num_states);
        testing::set_element_at(st.s, s_offset(st.s, seq, head), lse);
        if (lse != -kInf) continue;
        for (int64_t d = 0; d < st.v.shape[2]; ++d) {
          testing::set_element_at(st.v, v_offset(st.v, seq, head, d), kNaN);
        }
      }
    }
  }
}

// The merged rows in float64 with the error each element may carry: float32 weights, products
// and sums ((n + 5) rounding steps of at most 2^-23 relative to the largest |v| merged, twice
// over), then rounding to the output dtype (2^-11 for f16, 2^-8 for bf16, relative), and
// 1e-7 absolute for f16 subnormals. Rows with at most one non-empty state must come out exact.
struct Expected {
  int64_t heads = 0, dim = 0;
  std::vector<double> v, v_bound;  // [rows * D]
  std::vector<double> s, s_bound;  // [rows]
  std::vector<bool> checked;       // rows to compare (in place: the masked ones)
  // What the CPU operator's pairwise fold may add on top: each intermediate LSE is rounded to
  // float32 (2^-24 |lse| absolute), which scales the next weights by as much, relatively.
  std::vector<double> v_fold, s_fold;
};

inline double output_rounding(DType dtype) {
  return dtype == DType::kF16 ? 0x1p-11 : dtype == DType::kBF16 ? 0x1p-8 : 0.0;
}

// `out`: the output view, for the shape and dtype (there may be no input states).
inline Expected expected_merge(const std::vector<StateView>& states, const TensorView& out) {
  Expected e;
  const int64_t seq = out.shape[0];
  e.heads = out.shape[1];
  e.dim = out.shape[2];
  const int64_t rows = seq * e.heads;
  e.v.resize(static_cast<size_t>(rows * e.dim));
  e.v_bound.resize(e.v.size());
  e.s.resize(static_cast<size_t>(rows));
  e.s_bound.resize(e.s.size());
  e.checked.assign(e.s.size(), true);
  e.v_fold.resize(e.v.size());
  e.s_fold.resize(e.s.size());
  const double n = static_cast<double>(states.size());
  const double accumulation = (n + 5) * 0x1p-22;
  const double rounding = output_rounding(out.dtype);
  std::vector<double> weights(states.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t sq = r / e.heads, head = r % e.heads;
    double lse_max = -kInf;
    int non_empty = 0;
    for (const StateView& st : states) {
      const double lse = element_at(st.s, s_offset(st.s, sq, head));
      if (lse == -kInf) continue;
      lse_max = std::max(lse_max, lse);
      ++non_empty;
    }
    double total = 0;
    for (size_t i = 0; i < states.size(); ++i) {
      const double lse = element_at(states[i].s, s_offset(states[i].s, sq, head));
      weights[i] = lse == -kInf ? 0.0 : std::exp(lse - lse_max);
      total += weights[i];
    }
    const bool exact = non_empty <= 1;
    e.s[static_cast<size_t>(r)] = non_empty == 0 ? -kInf : lse_max + std::log(total);
    e.s_bound[static_cast<size_t>(r)] =
        exact ? 0.0 : 0x1p-22 * std::fabs(e.s[static_cast<size_t>(r)]) + accumulation;
    const double fold = exact ? 0.0 : n * 0x1p-23 * std::max(1.0, std::fabs(lse_max));
    e.s_fold[static_cast<size_t>(r)] = fold;
    for (int64_t d = 0; d < e.dim; ++d) {
      double sum = 0, largest = 0;
      for (size_t i = 0; i < states.size(); ++i) {
        if (weights[i] == 0.0) continue;
        const double x = element_at(states[i].v, v_offset(states[i].v, sq, head, d));
        sum += weights[i] * x;
        largest = std::max(largest, std::fabs(x));
      }
      const size_t at = static_cast<size_t>(r * e.dim + d);
      e.v[at] = non_empty == 0 ? 0.0 : sum / total;
      e.v_bound[at] =
          exact ? 0.0 : rounding * std::fabs(e.v[at]) + 2 * accumulation * largest + 1e-7;
      e.v_fold[at] = fold * largest;
    }
  }
  return e;
}

// The CPU operator's result as the expectation, with twice the float64 bounds (each side may
// be that far from the exact value) plus the CPU fold's slack.
inline Expected expected_from_cpu(const Expected& exact, const TensorView& v_cpu,
                                  const TensorView& s_cpu) {
  Expected e = exact;
  for (size_t r = 0; r < e.s.size(); ++r) {
    const int64_t sq = static_cast<int64_t>(r) / e.heads, head = static_cast<int64_t>(r) % e.heads;
    e.s[r] = element_at(s_cpu, s_offset(s_cpu, sq, head));
    e.s_bound[r] = 2 * e.s_bound[r] + e.s_fold[r];
    for (int64_t d = 0; d < e.dim; ++d) {
      const size_t at = r * static_cast<size_t>(e.dim) + static_cast<size_t>(d);
      e.v[at] = element_at(v_cpu, v_offset(v_cpu, sq, head, d));
      e.v_bound[at] = 2 * e.v_bound[at] + e.v_fold[at];
    }
  }
  return e;
}

// Every checked element within its bound (equal infinities count as equal; NaN never passes).
inline void expect_matches(const TensorView& v_out, const TensorView& s_out, const Expected& e,
                           const std::string& what) {
  int64_t failures = 0;
  std::ostringstream first;
  const auto check = [&](double actual, double expected, double bound, const char* name,
                         int64_t row, int64_t d) {
    if (actual == expected || std::fabs(actual - expected) <= bound) return;
    if (failures++ == 0) {
      first << name << " of row " << row << " (seq " << row / e.heads << ", head " << row % e.heads
            << ")" << (d >= 0 ? ", d " + std::to_string(d) : std::string()) << ": got " << actual
            << ", expected " << expected << " +- " << bound;
    }
  };
  for (size_t r = 0; r < e.s.size(); ++r) {
    if (!e.checked[r]) continue;
    const int64_t row = static_cast<int64_t>(r), sq = row / e.heads, head = row % e.heads;
    check(element_at(s_out, s_offset(s_out, sq, head)), e.s[r], e.s_bound[r], "s", row, -1);
    for (int64_t d = 0; d < e.dim; ++d) {
      const size_t at = r * static_cast<size_t>(e.dim) + static_cast<size_t>(d);
      check(element_at(v_out, v_offset(v_out, sq, head, d)), e.v[at], e.v_bound[at], "v", row, d);
    }
  }
  EXPECT_EQ(failures, 0) << what << ": first failure: " << first.str();
}

// No element of the storage outside the view was written (they were all NaN).
inline void expect_padding_untouched(const Buffer& b, const std::string& what) {
  std::vector<bool> in_view(static_cast<size_t>(b.storage.numel()), false);
  const int64_t view_begin =
      (static_cast<const std::byte*>(b.view.data) - b.storage.data<std::byte>()) /
      static_cast<int64_t>(dtype_bytes(b.view.dtype));
  testing::for_each_element(b.view, [&](int64_t, int64_t offset) {
    in_view[static_cast<size_t>(view_begin + offset)] = true;
  });
  int64_t written = 0;
  for (int64_t i = 0; i < b.storage.numel(); ++i) {
    written += !in_view[static_cast<size_t>(i)] && !std::isnan(b.storage.get(i));
  }
  EXPECT_EQ(written, 0) << what << ": elements outside the output view were written";
}

// The element at `offset` of b's view has the bytes it had in `before`, a copy of b's storage.
inline bool element_unchanged(const Buffer& b, const HostTensor& before, int64_t offset) {
  const auto element = static_cast<int64_t>(dtype_bytes(b.view.dtype));
  const int64_t at =
      (static_cast<const std::byte*>(b.view.data) - b.storage.data<std::byte>()) + offset * element;
  return std::memcmp(b.storage.data<std::byte>() + at, before.data<std::byte>() + at,
                     static_cast<size_t>(element)) == 0;
}

inline bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return storage_bytes(a) == storage_bytes(b) &&
         std::memcmp(a.data<std::byte>(), b.data<std::byte>(),
                     static_cast<size_t>(storage_bytes(a))) == 0;
}

class MergeGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: " << cuda::unavailable_reason();
    cuda::set_device(0);
  }
};

// A pair merge's buffers: inputs a and b, output out, all of one dtype and layout.
struct PairCase {
  Mirrored a_v, a_s, b_v, b_s, out_v, out_s;

  static Buffer v_buffer(DType dtype, int64_t seq, int64_t heads, int64_t dim, Layout layout) {
    return make_buffer(dtype, {seq, heads, dim}, layout, true);
  }
  static Buffer s_buffer(int64_t seq, int64_t heads, Layout layout) {
    return make_buffer(DType::kF32, {seq, heads}, layout, false);
  }
  // Fills a and b before their device copies are made.
  static PairCase make(DType dtype, int64_t seq, int64_t heads, int64_t dim, Layout a_layout,
                       Layout b_layout, Layout out_layout, uint64_t seed, int device = 0) {
    Buffer a_v = v_buffer(dtype, seq, heads, dim, a_layout), a_s = s_buffer(seq, heads, a_layout);
    Buffer b_v = v_buffer(dtype, seq, heads, dim, b_layout), b_s = s_buffer(seq, heads, b_layout);
    fill_states({{a_v.view, a_s.view}, {b_v.view, b_s.view}}, seed);
    return PairCase{Mirrored(std::move(a_v), device),
                    Mirrored(std::move(a_s), device),
                    Mirrored(std::move(b_v), device),
                    Mirrored(std::move(b_s), device),
                    Mirrored(v_buffer(dtype, seq, heads, dim, out_layout), device),
                    Mirrored(s_buffer(seq, heads, out_layout), device)};
  }
  std::vector<StateView> inputs() const {
    return {{a_v.host.view, a_s.host.view}, {b_v.host.view, b_s.host.view}};
  }
  void run(cuda::Stream stream = nullptr) const {
    merge_state(a_v.device_view(), a_s.device_view(), b_v.device_view(), b_s.device_view(),
                out_v.device_view(), out_s.device_view(), stream);
  }
  void run_swapped() const {
    merge_state(b_v.device_view(), b_s.device_view(), a_v.device_view(), a_s.device_view(),
                out_v.device_view(), out_s.device_view(), nullptr);
  }
  void download_outputs() {
    out_v.download();
    out_s.download();
  }
  // The CPU operator on the same inputs, into contiguous tensors.
  std::pair<HostTensor, HostTensor> cpu_result() const {
    const TensorView& v = a_v.host.view;
    HostTensor v_cpu(v.dtype, {v.shape[0], v.shape[1], v.shape[2]});
    HostTensor s_cpu(DType::kF32, {v.shape[0], v.shape[1]});
    merge_state(a_v.host.view, a_s.host.view, b_v.host.view, b_s.host.view, v_cpu.view(),
                s_cpu.view());
    return {std::move(v_cpu), std::move(s_cpu)};
  }
  void expect_correct(const std::string& what) {
    download_outputs();
    const Expected exact = expected_merge(inputs(), out_v.host.view);
    expect_matches(out_v.host.view, out_s.host.view, exact, what + " vs float64");
    const auto [v_cpu, s_cpu] = cpu_result();
    expect_matches(out_v.host.view, out_s.host.view,
                   expected_from_cpu(exact, v_cpu.view(), s_cpu.view()), what + " vs CPU");
    expect_padding_untouched(out_v.host, what + " v_out");
    expect_padding_untouched(out_s.host, what + " s_out");
  }
};

// merge_states' buffers: stacked inputs [seq, n, H, D] / [seq, n, H] and the outputs.
struct StackedCase {
  Mirrored v, s, out_v, out_s;

  static StackedCase make(DType dtype, int64_t seq, int64_t num_states, int64_t heads, int64_t dim,
                          Layout layout, uint64_t seed) {
    Buffer v = make_buffer(dtype, {seq, num_states, heads, dim}, layout, true);
    Buffer s = make_buffer(DType::kF32, {seq, num_states, heads}, layout, false);
    std::vector<StateView> states;
    for (int64_t i = 0; i < num_states; ++i)
      states.push_back({v.view.select(1, i), s.view.select(1, i)});
    fill_states(states, seed);
    return StackedCase{Mirrored(std::move(v)), Mirrored(std::move(s)),
                       Mirrored(make_buffer(dtype, {seq, heads, dim}, layout, true)),
                       Mirrored(make_buffer(DType::kF32, {seq, heads}, layout, false))};
  }
  std::vector<StateView> inputs() const {
    std::vector<StateView> states;
    for (int64_t i = 0; i < v.host.view.shape[1]; ++i) {
      states.push_back({v.host.view.select(1, i), s.host.view.select(1, i)});
    }
    return states;
  }
  void run(cuda::Stream stream = nullptr) const {
    merge_states(v.device_view(), s.device_view(), out_v.device_view(), out_s.device_view(),
                 stream);
  }
  void download_outputs() {
    out_v.download();
    out_s.download();
  }
  Expected expected() const { return expected_merge(inputs(), out_v.host.view); }
};

}  // namespace flare::merge_gpu
