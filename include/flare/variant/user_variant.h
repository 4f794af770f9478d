// A user-defined attention variant (papers 001 §3.2.3): CUDA C++ source defining
// `struct Variant : flare::VariantBase`, compiled just in time into the decode kernels (both
// loops) and the FA2 prefill kernels (paged and ragged) in place of the built-in
// StandardVariant. The hooks, their arguments and their defaults are kernels/variant.cuh's;
// python/README.md shows examples.
//
// Example: logits soft-capping written as a user variant, with the cap a run() parameter.
//   UserVariant v;
//   v.name = "soft_cap";
//   v.scalars = {"cap"};
//   v.source = R"(
//     struct Variant : flare::VariantBase {
//       __device__ static float query_scale(const flare::VariantParams& p) {
//         return p.sm_scale / Scalars::cap(p);
//       }
//       __device__ float logits_transform(const flare::VariantParams& p, float s, int) const {
//         return Scalars::cap(p) * flare::kLog2e * flare::tanh_via_exp2(s);
//       }
//     };)";
//   config.variant = v;                       // BatchDecodeConfig / BatchPrefillConfig
//   const float cap = 30.0f;
//   options.variant_scalars = {&cap, 1};      // RunOptions, in v.scalars' order
//
// Each named scalar is a float the source reads as `Scalars::<name>(p)`; their values come with
// every run() (RunOptions::variant_scalars), so changing one needs no new plan or kernel (a run
// captured into a CUDA graph keeps the values, and the tensor addresses, of its capture).
// Each named tensor is a device tensor of a declared dtype the source reads through the pointer
// `Tensors::<name>(p)` (const float*, const int*, const long long*, const unsigned char*, or
// const unsigned short* holding float16 / bfloat16 bits) and its extents as
// `Tensors::<name>_extent(p, d)` (d < 4; 1 past the tensor's rank); run() passes them
// (RunOptions::variant_tensors) and checks their dtype, device, contiguity and declared shape.
// Their shapes are the variant's contract: flare cannot see which elements the source reads, so a
// variant must index only inside the tensors it is given. The AttentionParams of a config with a
// user variant keep sm_scale (VariantParams::sm_scale) and the mask (causal, custom: the kernel's
// own); the built-in terms (soft-cap, window, ALiBi, RoPE, use_softmax = false) must stay off: the
// variant replaces them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flare/core/dtype.h"

namespace flare {

// Symbolic extents of a variant tensor's declared shape, resolved by run() from its engine: a
// tensor indexed by the row's request or head declares them, and run() then guarantees that
// every index the kernels hand to the variant (RowContext) lies inside it.
inline constexpr int64_t kAnyExtent = -1;
inline constexpr int64_t kBatchExtent = -2;      // the plan's batch (CUDA graphs: max_batch)
inline constexpr int64_t kQoHeadsExtent = -3;    // num_qo_heads
inline constexpr int64_t kKvHeadsExtent = -4;    // num_kv_heads
// Any extent of at least 1, for a lookup table the source indexes with a 32-bit int (the row's
// entry plus a clamped column, as flare::variants::distance_bias()): run() also refuses the
// tensor when it holds 2^31 or more elements.
inline constexpr int64_t kTableExtent = -5;

struct UserVariantTensor {
  std::string name;           // a C identifier
  DType dtype = DType::kF32;  // kF32 | kF16 | kBF16 | kI32 | kI64 | kU8
  // The extents run() requires: a number, a symbolic extent above, or kAnyExtent; empty: any
  // shape. Every variant tensor must be contiguous (the source indexes a raw pointer).
  std::vector<int64_t> shape;
};

struct UserVariant {
  std::string name;                        // a C identifier: kernel labels and logs
  std::string source;                      // defines struct Variant (kernels/variant.cuh hooks)
  std::vector<std::string> scalars;        // float parameters' names, at most kMaxUserScalars
  std::vector<UserVariantTensor> tensors;  // device tensors, at most kMaxUserTensors
  // Whether the source's Variant::use_softmax is true (the host must know: a variant without
  // softmax has no lse, so run() refuses an lse output, and its split rows' partial sums add up
  // in the prefill merge). The compiled source checks that the two agree (a static_assert,
  // raised at plan() with NVRTC's log).
  bool use_softmax = true;
  // Whether the source's mask relies on the kernel's causal mask for the keys after the query
  // (e.g. a kMaskIsWindow mask that bounds only the start, as document_mask() does): a prefill
  // config without MaskMode::kCausal is then refused. Decode's query is its request's last
  // position, so decode always qualifies.
  bool requires_causal = false;
};

inline constexpr int kMaxUserScalars = 8;  // kernels/decode_params.cuh kMaxVariantScalars
inline constexpr int kMaxUserTensors = 4;  // kernels/decode_params.cuh kMaxVariantTensors

// Throws kInvalidArgument naming `what` and the field: a name that is not a C identifier, an
// empty source, a scalar or tensor name that is not a C identifier or appears twice (scalars
// and tensors share one namespace), more than kMaxUserScalars scalars or kMaxUserTensors
// tensors, a tensor dtype outside the list above, a declared extent below -1.
void validate_user_variant(const UserVariant& variant, const char* what);

// The variant source a kernel compiles: kernels/variant.cuh, the `Scalars` and `Tensors`
// accessors, then the user's source under `#line 1 "<name>"`, so NVRTC's errors cite the user's own
// lines, then the check of use_softmax against the source's.
std::string user_variant_source(const UserVariant& variant);

// The position of `scalar` in variant.scalars; throws kInvalidArgument naming `what`, the
// variant and its scalars when it has none of that name.
int user_variant_scalar_index(const UserVariant& variant, const std::string& scalar,
                              const char* what);

}  // namespace flare
