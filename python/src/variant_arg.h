// User-defined variants from the Python wrappers (flare.AttentionVariant): the declaration an
// engine is created with, and the scalar values of each run().
#pragma once

#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "flare/api/run_options.h"
#include "flare/core/dtype.h"
#include "flare/core/error.h"
#include "flare/variant/user_variant.h"
#include "object_view.h"

namespace flare::python {

namespace nb = nanobind;

// An object with name, source, scalars (a sequence of names), tensors (a sequence of (name,
// dtype name, shape with -1 for any extent) triples), use_softmax and requires_causal, or None.
inline std::optional<UserVariant> user_variant_arg(nb::handle variant) {
  if (variant.is_none()) return std::nullopt;
  UserVariant v;
  v.name = nb::cast<std::string>(variant.attr("name"));
  v.source = nb::cast<std::string>(variant.attr("source"));
  for (nb::handle scalar : variant.attr("scalars")) {
    v.scalars.push_back(nb::cast<std::string>(scalar));
  }
  for (nb::handle tensor : variant.attr("tensors")) {
    UserVariantTensor decl{
        nb::cast<std::string>(tensor[0]), parse_dtype(nb::cast<std::string>(tensor[1])), {}};
    for (nb::handle extent : tensor[2]) decl.shape.push_back(nb::cast<int64_t>(extent));
    v.tensors.push_back(std::move(decl));
  }
  v.use_softmax = nb::cast<bool>(variant.attr("use_softmax"));
  v.requires_causal = nb::cast<bool>(variant.attr("requires_causal"));
  return v;
}

// run()'s options from the wrappers' keywords and a variant's arguments: scalars (None, or a
// tuple of floats in the variant's declared order) and tensors (None, or a tuple of tensors),
// held here for the options' spans (the engine checks counts, dtypes, devices and shapes).
// Lives on the stack of one run() call; not copyable, the spans point into it.
class RunArguments {
 public:
  RunArguments(float q_scale, float k_scale, float v_scale, bool lse_base2, bool enable_pdl,
               nb::handle scalars, nb::handle tensors)
      : options_(run_options(q_scale, k_scale, v_scale, lse_base2, enable_pdl)) {
    if (!scalars.is_none()) {
      const size_t count = checked_count(scalars, kMaxUserScalars, "scalars");
      for (size_t i = 0; i < count; ++i) scalars_[i] = nb::cast<float>(scalars[i]);
      options_.variant_scalars = {scalars_.data(), count};
    }
    if (!tensors.is_none()) {
      const size_t count = checked_count(tensors, kMaxUserTensors, "tensors");
      for (size_t i = 0; i < count; ++i) tensors_[i] = object_view(tensors[i], "variant tensor");
      options_.variant_tensors = {tensors_.data(), count};
    }
  }
  RunArguments(const RunArguments&) = delete;
  RunArguments& operator=(const RunArguments&) = delete;

  const RunOptions& options() const { return options_; }
  // The attention sinks (RunOptions::sink): None, or a float32 [H_qo] CUDA tensor.
  void set_sink(nb::handle sink) { options_.sink = optional_object_view(sink, "sink"); }

 private:
  static size_t checked_count(nb::handle values, int most, const char* kind) {
    const size_t count = nb::len(values);
    FLARE_CHECK(count <= static_cast<size_t>(most), ErrorCode::kInvalidArgument, "run(): ", count,
                " variant ", kind, "; a variant declares at most ", most);
    return count;
  }

  RunOptions options_;
  std::array<float, kMaxUserScalars> scalars_{};
  std::array<TensorView, kMaxUserTensors> tensors_{};
};

}  // namespace flare::python
