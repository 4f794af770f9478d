// FLARE_BENCH_VARIANT for scripts/bench_prefill.cpp: T5's relative position bias from C++, as
// bench_variants.py times it through Python (32 buckets, max distance 128, the same table
// values: linspace(-2, 2) over heads x 32), by buckets (flare::variants::relative_position_bias)
// or by distance (distance_bias with t5_distance_bias's table). The variant, its run() options
// and its device tensors, made once a process.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "flare/api/run_options.h"
#include "flare/jit/cuda_driver.h"
#include "flare/variant/library.h"

namespace bench_inputs {

class LibraryVariant {
 public:
  // FLARE_BENCH_VARIANT's variant for `heads` query heads (nullopt when unset); exits with a
  // usage error for any other name.
  static const LibraryVariant* from_environment(int heads) {
    static const std::optional<LibraryVariant> variant = make(heads);
    return variant ? &*variant : nullptr;
  }

  const flare::UserVariant& variant() const { return variant_; }
  // RunOptions pointing at this object's scalars and tensors (it lives for the process).
  flare::RunOptions options() const {
    flare::RunOptions o;
    o.variant_scalars = scalars_;
    o.variant_tensors = tensors_;
    return o;
  }

 private:
  static constexpr float kMaxDistance = 128.0f;

  static std::optional<LibraryVariant> make(int heads) {
    const char* name = std::getenv("FLARE_BENCH_VARIANT");
    if (name == nullptr) return std::nullopt;
    const std::string which = name;
    if (which != "relative_position_bias" && which != "distance_bias") {
      std::fprintf(stderr,
                   "FLARE_BENCH_VARIANT must be relative_position_bias or distance_bias, got "
                   "'%s'\n",
                   name);
      std::exit(2);
    }
    constexpr int kBuckets = flare::variants::kRelativePositionBuckets;
    std::vector<float> buckets(static_cast<size_t>(heads) * kBuckets);
    for (size_t i = 0; i < buckets.size(); ++i) {
      buckets[i] = -2.0f + 4.0f * static_cast<float>(i) / static_cast<float>(buckets.size() - 1);
    }
    LibraryVariant v;
    if (which == "relative_position_bias") {
      v.variant_ = flare::variants::relative_position_bias();
      v.scalars_ = {kMaxDistance};
      v.upload(buckets, {heads, kBuckets});
    } else {
      v.variant_ = flare::variants::distance_bias();
      const std::vector<float> table =
          flare::variants::t5_distance_bias(buckets, heads, kMaxDistance);
      v.upload(table, {heads, static_cast<int64_t>(table.size()) / heads});
    }
    return v;
  }

  void upload(const std::vector<float>& values, std::vector<int64_t> shape) {
    buffer_ = flare::cuda::DeviceBuffer(values.size() * sizeof(float));
    flare::cuda::memcpy_htod(buffer_.data(), values.data(), values.size() * sizeof(float));
    tensors_ = {flare::TensorView::contiguous(buffer_.data(), flare::DType::kF32, shape,
                                              flare::Device::cuda(0))};
  }

  flare::UserVariant variant_;
  std::vector<float> scalars_;
  flare::cuda::DeviceBuffer buffer_;
  std::vector<flare::TensorView> tensors_;
};

}  // namespace bench_inputs
