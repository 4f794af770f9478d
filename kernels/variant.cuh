// Attention variants (papers 001 §3.2.3): the functor struct a kernel family calls at fixed
// points, its defaults (VariantBase), and flare's built-in StandardVariant (soft-cap, sliding
// window, ALiBi by flag).
//
// A variant source defines `struct Variant` (deriving from flare::VariantBase, which gives every
// hook a default) before the family header is included. Every kernel family (decode on CUDA
// cores and tensor cores, FA2 prefill paged and ragged) calls, all __device__:
//   static constexpr bool use_softmax;               false: no normalisation (sigmoid attention):
//                                                    logits_transform then returns the key's
//                                                    weight w, o = sum_j w_j v_j over the visible
//                                                    keys, and there is no lse (see below)
//   static float query_scale(const VariantParams&)  factor applied to q.k before
//                                                    logits_transform (default sm_scale * log2e)
//   static int visible_begin(const VariantParams&, int request, int q_pos)
//                                                    first KV position the query of `request`
//                                                    at q_pos may see (a speed hint; default 0:
//                                                    kernels may skip keys before it, so
//                                                    logits_mask must exclude them too); never
//                                                    decreasing in q_pos (a tile's first row
//                                                    bounds every row's)
//   static int visible_end(const VariantParams&, int request, int q_pos)
//                                                    one past the last KV position that query
//                                                    may see (a speed hint; default: no bound,
//                                                    the kernels' own causal limit applies;
//                                                    logits_mask must exclude the keys past
//                                                    it); never decreasing in q_pos (a tile's
//                                                    last row bounds every row's). The prefill
//                                                    families skip the tiles past it; decode
//                                                    (one row at kv_len - 1) reads every key.
//                                                    A kMaskIsWindow variant keeps the default
//                                                    (its mask is checked at the start only)
//   void init(const VariantParams&, const RowContext&)  per query row of a work item: the
//                                                    request, heads and position (keep what the
//                                                    other hooks need)
//   float logits_transform(const VariantParams&, float s, int kv_pos) const
//                                                    s = q.k * query_scale -> the logit in log2
//                                                    units (the kernels' softmax is exp2)
//   bool logits_mask(int kv_pos) const              false excludes the key
//   static constexpr bool kLinearLogits;             optional: true when logits_transform returns
//                                                    s (default: whether it is VariantBase's)
//   static constexpr bool kMaskIsWindow;             true when logits_mask excludes exactly the
//                                                    keys before visible_begin: the FA2
//                                                    prefill then checks keys only on the tiles
//                                                    that straddle that boundary
//   static constexpr bool kMaskIsVisibleEnd;         optional: true when logits_mask excludes
//                                                    exactly the keys at or past visible_end
//                                                    (prefix-LM): the prefill families then check
//                                                    keys only on the tiles that straddle the
//                                                    visible_end of a tile's first row
//   static constexpr bool kRotary;                   true: q and k rotate before q.k (RoPE,
//                                                    kernels/rotary.cuh): dims i and i + D/2
//                                                    turn by pos * rotary_frequency, q at its
//                                                    q_pos, k at its KV position
//   static float rotary_frequency(const VariantParams&, int i, int head_dim)
//                                                    radians per position of pair i < D/2
//   static float2 rotary_turns(const VariantParams&, int i, int head_dim)
//                                                    optional, instead: turns (2 pi radians)
//                                                    per position as x + y, for precision
//   static constexpr bool kLogitsAffineInKvPos;      optional, with float logits_kv_slope()
//                                                    const: logits affine in kv_pos per row
//                                                    (ALiBi; has_affine_logits below)
//   static constexpr bool kLogitsBounded;            optional, with static float logits_bound(
//                                                    const VariantParams&): every logit
//                                                    logits_transform returns lies in
//                                                    [-bound, bound] (soft-cap's cap * log2 e;
//                                                    has_logits_bound below)
//   static constexpr bool kLogitsAffineOnSomeKeys;   optional, with bool logits_affine_on(
//                                                    const VariantParams&, int kv_first, int
//                                                    kv_last, float& base, float& slope)
//                                                    const: the same on the key ranges where it
//                                                    returns true (T5's far buckets; below)
//   static constexpr bool kLogitsAffineSlopeIsZero;  optional, with kLogitsAffineOnSomeKeys: the
//                                                    slope it returns is always 0 (a constant
//                                                    per row: has_offset_logits_on_some_keys)
// Hooks no family calls (general query/key/output transforms) are rejected at compile time
// rather than ignored (VariantHookCheck below).
//
// use_softmax = false in every family: the row state keeps m = 0 (row_max_start) and o
// accumulates w * v (P is w; the MMA loops round it to the 16-bit P operand as they round
// probabilities). A row's final write skips the division by d; a split row's partial slot holds
// its unnormalized o with lse 0, so every merge weight is exp2(0 - 0) = 1 and the merges add the
// slots: the in-CTA combines and the decode merge as they are, the prefill merge kernel with
// MergeParams::sum_partials. The hosts refuse an lse output for such a variant.
#pragma once

#include "decode_params.cuh"
#include "decode_utils.cuh"

#ifndef FLARE_VARIANT_SOFT_CAP
#define FLARE_VARIANT_SOFT_CAP 0
#endif
#ifndef FLARE_VARIANT_BOUNDED_LOGITS
#define FLARE_VARIANT_BOUNDED_LOGITS 0
#endif
#ifndef FLARE_VARIANT_WINDOW
#define FLARE_VARIANT_WINDOW 0
#endif
#ifndef FLARE_VARIANT_ALIBI
#define FLARE_VARIANT_ALIBI 0
#endif
#ifndef FLARE_VARIANT_SIGMOID
#define FLARE_VARIANT_SIGMOID 0
#endif
#ifndef FLARE_VARIANT_ROPE
#define FLARE_VARIANT_ROPE 0
#endif

namespace flare {

// What a row's init() learns about its query row.
struct RowContext {
  int request;  // batch index of the row's request
  int qo_head;  // query head
  int kv_head;  // the KV head it reads
  int q_pos;    // the query token's position (bottom-right aligned: kv_len - q_len + i)
  int kv_len;   // the request's KV tokens
  int q_len;    // its query tokens (decode: 1)
};

// Every hook's default: plain softmax attention with sm_scale. No data members: the kernels
// keep one Variant per query row in registers, so a variant's state is only what it declares.
struct VariantBase {
  static constexpr bool use_softmax = true;
  static constexpr bool kMaskIsWindow = false;
  static constexpr bool kRotary = false;
  __device__ static float query_scale(const VariantParams& p) { return p.sm_scale * kLog2e; }
  __device__ static float rotary_frequency(const VariantParams&, int, int) { return 0.0f; }
  __device__ static int visible_begin(const VariantParams&, int, int) { return 0; }
  __device__ static int visible_end(const VariantParams&, int, int) { return 0x7fffffff; }
  __device__ void init(const VariantParams&, const RowContext&) {}
  __device__ float logits_transform(const VariantParams&, float s, int) const { return s; }
  __device__ bool logits_mask(int) const { return true; }
  // Read only where kLogitsAffineInKvPos is declared true (has_affine_logits below).
  __device__ float logits_kv_slope() const { return 0.0f; }
  // Read only where kLogitsBounded is declared true (has_logits_bound below).
  __device__ static float logits_bound(const VariantParams&) { return 3.0e38f; }
  // Read only where kLogitsAffineOnSomeKeys is (has_affine_logits_on_some_keys below).
  __device__ bool logits_affine_on(const VariantParams&, int, int, float&, float&) const {
    return false;
  }
};

namespace variant_detail {
template <class A, class B>
struct same_type {
  static constexpr bool value = false;
};
template <class A>
struct same_type<A, A> {
  static constexpr bool value = true;
};
template <class...>
using void_type = void;
#define FLARE_VARIANT_HAS_MEMBER(trait, member)      \
  template <class V, class = void>                   \
  struct trait {                                     \
    static constexpr bool value = false;             \
  };                                                 \
  template <class V>                                 \
  struct trait<V, void_type<decltype(&V::member)>> { \
    static constexpr bool value = true;              \
  }
FLARE_VARIANT_HAS_MEMBER(has_query_transform, query_transform);
FLARE_VARIANT_HAS_MEMBER(has_key_transform, key_transform);
FLARE_VARIANT_HAS_MEMBER(has_output_transform, output_transform);
FLARE_VARIANT_HAS_MEMBER(has_rotary_turns, rotary_turns);
#undef FLARE_VARIANT_HAS_MEMBER
}  // namespace variant_detail

// Whether V declares its own logits_transform / logits_mask (a member pointer names the class
// that declares the member: VariantBase's when V inherits the default).
template <class V>
constexpr bool overrides_logits_transform =
    !variant_detail::same_type<decltype(&V::logits_transform),
                               decltype(&VariantBase::logits_transform)>::value;
template <class V>
constexpr bool overrides_logits_mask =
    !variant_detail::same_type<decltype(&V::logits_mask),
                               decltype(&VariantBase::logits_mask)>::value;
// An optional `static constexpr bool member` of V: its value where V declares it, else false.
namespace variant_detail {
#define FLARE_VARIANT_OPTIONAL_FLAG(trait, member)  \
  template <class V, class = void>                  \
  struct trait {                                    \
    static constexpr bool value = false;            \
  };                                                \
  template <class V>                                \
  struct trait<V, void_type<decltype(V::member)>> { \
    static constexpr bool value = V::member;        \
  }
// Whether V's mask is exactly the keys before visible_end.
FLARE_VARIANT_OPTIONAL_FLAG(mask_is_visible_end, kMaskIsVisibleEnd);
// Whether V's logits lie within +-logits_bound (has_logits_bound below).
FLARE_VARIANT_OPTIONAL_FLAG(logits_bounded, kLogitsBounded);
// Whether V's logits are affine in the KV position (has_affine_logits below).
FLARE_VARIANT_OPTIONAL_FLAG(affine_logits, kLogitsAffineInKvPos);
// Whether they are on the key ranges logits_affine_on accepts (has_affine_logits_on_some_keys).
FLARE_VARIANT_OPTIONAL_FLAG(affine_logits_on_some_keys, kLogitsAffineOnSomeKeys);
// Whether the slope logits_affine_on returns is always 0.
FLARE_VARIANT_OPTIONAL_FLAG(affine_slope_is_zero, kLogitsAffineSlopeIsZero);
// Whether V's logits are q.k plus a function of the query-key distance (has_logits_by_distance).
FLARE_VARIANT_OPTIONAL_FLAG(logits_by_distance, kLogitsByDistance);
#undef FLARE_VARIANT_OPTIONAL_FLAG
}  // namespace variant_detail
// Whether a kernel must check V's mask on every key (not only around visible_begin or
// visible_end).
template <class V>
constexpr bool masks_every_key =
    overrides_logits_mask<V> && !V::kMaskIsWindow && !variant_detail::mask_is_visible_end<V>::value;

// Whether V's logit is q.k times query_scale (a family may then fold the scale elsewhere):
// V::kLinearLogits where V declares it, else whether V keeps VariantBase's logits_transform.
namespace variant_detail {
template <class V, class = void>
struct linear_logits {
  static constexpr bool value = !overrides_logits_transform<V>;
};
template <class V>
struct linear_logits<V, void_type<decltype(V::kLinearLogits)>> {
  static constexpr bool value = V::kLinearLogits;
};
}  // namespace variant_detail
template <class V>
constexpr bool has_linear_logits = variant_detail::linear_logits<V>::value;

// Optional, for logits affine in the KV position (ALiBi): a variant whose
// logits_transform(p, s, kv_pos) is s + slope * kv_pos + c, slope and c fixed per query row, may
// declare `static constexpr bool kLogitsAffineInKvPos = true;` and
// `__device__ float logits_kv_slope() const` returning that slope. The prefill softmax then calls
// logits_transform(p, 0, kv_pos) once per row and tile, at the thread's first column, and takes
// each logit as two FMAs from it (the slope times the column's compile-time offset), instead of
// logits_transform per logit: ALiBi there was an int-to-float conversion or its integer trick and
// three more operations a logit, in kernels bound by issue (docs/perf.md, ALiBi). Decode calls
// logits_transform per logit as before (memory-bound).
template <class V>
constexpr bool has_affine_logits = variant_detail::affine_logits<V>::value;

// Optional, for logits affine in the KV position on some keys of a row only: a variant may declare
// `static constexpr bool kLogitsAffineOnSomeKeys = true;` with `__device__ bool
// logits_affine_on(const VariantParams& p, int kv_first, int kv_last, float& base, float&
// slope) const`, true only when for every kv_pos in [kv_first, kv_last] logits_transform(p, s,
// kv_pos) is s + base + slope * (kv_pos - kv_first), with base and slope set. The Hopper
// family's softmax asks once per row and tile for the thread's columns and, where true, takes the
// two-FMA path of has_affine_logits; elsewhere logits_transform per logit. The CUDA-core decode
// loop asks once per row and tile for its group's keys (then no logits_transform: a bias table's
// far keys cost no load). T5's relative position bias is one constant per row past max_distance
// (its last bucket): all but the few tiles near the diagonal of a long row (docs/perf.md,
// thirty-fourth session). The mma.sync prefill and the tensor-core decode loop call
// logits_transform per logit.
template <class V>
constexpr bool has_affine_logits_on_some_keys =
    variant_detail::affine_logits_on_some_keys<V>::value;

// Optional with it: a variant whose logits_affine_on always sets slope 0 (the logit is s + base
// there, one constant per row: T5's last bucket) may declare `static constexpr bool
// kLogitsAffineSlopeIsZero = true;`. The Hopper softmax then takes the row max of q.k itself on
// those tiles and folds base into the exp2 argument's offset: one FMA a logit, as for plain
// causal attention, instead of three (docs/perf.md, forty-fourth session).
template <class V>
constexpr bool has_offset_logits_on_some_keys =
    has_affine_logits_on_some_keys<V>&& variant_detail::affine_slope_is_zero<V>::value;

// Optional, for logits that are the scaled q.k plus a bias by the query-key distance (T5's table
// per distance, flare::variants::distance_bias): a variant may declare `static constexpr bool
// kLogitsByDistance = true;` with `__device__ int distance_key() const`, promising that
// logits_transform(p, s, kv_pos) == s + logits_transform(p, 0, kv_pos) (up to rounding), and
// that two rows whose distance_key() are equal, with query positions q and q + k, take at kv_pos +
// k and kv_pos the same logits_transform(p, 0, .). The prefill softmax then takes a row's logit
// as fmaf(s, scale, logits_transform(p, 0, kv_pos)) on the tiles it calls logits_transform on
// (near the diagonal, for T5) and, where a thread's two rows of an m16 tile are 8 tokens apart
// under one key (one head's consecutive tokens: MHA), gives the lower row the bias the upper
// one took 8 columns before: 34 calls for a thread's 64 logits instead of 64.
template <class V>
constexpr bool has_logits_by_distance = variant_detail::logits_by_distance<V>::value;

// Optional, for bounded logits (soft-cap): a variant whose logits_transform never leaves
// [-bound, bound] (log2 units) for a bound of at most 79 (the host's kSoftCapFixedOffsetMaxBound,
// flare/variant/builtin_variants.h) may declare
// `static constexpr bool kLogitsBounded = true;` and `__device__ static float logits_bound(const
// VariantParams& p)` returning that bound (a promise: a larger bound underflows the
// probabilities of rows whose every logit lies near -bound). Where the probabilities are
// bfloat16, the Hopper prefill's softmax then subtracts a fixed offset (bound -
// kFixedOffsetHeadroom) instead of each row's running max: every probability lies in
// [2^(headroom - 2 bound), 2^headroom], normal in float32 and bfloat16, so no max is reduced and
// O is never rescaled (a running max is only a choice of offset: softmax is the same for any).
// That was 2 of a soft-capped logit's 7 operations and a reduction across the quad before any
// exp2 of the tile (docs/perf.md, thirty-eighth session). Decode keeps its running max
// (memory-bound), as does the mma.sync family (with the fixed offset no faster on an H200:
// soft-cap 30 within 1% at every shape, docs/perf.md thirty-ninth session).
template <class V>
constexpr bool has_logits_bound = variant_detail::logits_bounded<V>::value;
// The probabilities' largest power of two above 1, and the largest bound it serves: the smallest
// possible row maximum, 2^(kFixedOffsetHeadroom - 2 * bound), stays >= 2^-126 (normal: the
// exp2 flushes subnormals to zero) and the row sum of up to 2^31 keys times any finite value of
// V under 2^64 stays under float32's 2^128. Soft-cap 30 is a bound of 43.3, Gemma 2's 50 of 72.1.
constexpr float kFixedOffsetHeadroom = 32.0f;

// Hooks no family honours: a compile error (which plan() raises with NVRTC's log) rather than a
// silent skip. Each family header instantiates it for its Variant. The q and k transforms
// every family runs are the rotary ones (kRotary): a general per-element transform would have
// to run on every K element once per query row in the MMA loops.
template <class V>
struct VariantHookCheck {
  static_assert(!variant_detail::has_query_transform<V>::value,
                "flare variant: query_transform is not supported (kRotary / rotary_frequency are)");
  static_assert(!variant_detail::has_key_transform<V>::value,
                "flare variant: key_transform is not supported (kRotary / rotary_frequency are)");
  static_assert(!variant_detail::has_output_transform<V>::value,
                "flare variant: output_transform is not supported");
  // VariantBase's logits_bound is a placeholder (no bound): declaring kLogitsBounded without
  // one would subtract an offset of ~3e38.
  static_assert(!has_logits_bound<V> || &V::logits_bound != &VariantBase::logits_bound,
                "flare variant: kLogitsBounded needs its own static logits_bound(const "
                "VariantParams&)");
  static constexpr bool ok = true;
};

// The running max a row starts from: -inf for softmax; 0, fixed, without it (see above).
template <class V>
__device__ __forceinline__ float row_max_start() {
  return V::use_softmax ? negative_infinity() : 0.0f;
}

// tanh through exp2: absolute error ~1e-7 everywhere (the logit is cap * tanh, so absolute
// error is what reaches the softmax), saturates to +-1 without NaN for |x| -> inf. Two
// special-function operations (ex2, rcp) per logit.
__device__ __forceinline__ float tanh_via_exp2(float x) {
  const float e = fast_exp2(2.0f * kLog2e * x);
  return 1.0f - 2.0f * fast_rcp(1.0f + e);
}
// tanh on the special-function unit (tanh.approx.f32, sm_75 and later): one operation, error
// ~2^-11 relative (a logit near the cap of 30 moves by up to ~0.015), the tanh of FlashInfer's
// and FlashAttention-3's soft-cap. With the softmax's exp2 a soft-capped logit takes two
// special-function operations instead of three: that unit, a quarter of the FMA rate, bounds
// the soft-cap kernels (docs/perf.md, variants on the Hopper family).
__device__ __forceinline__ float fast_tanh(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750
  return tanh_via_exp2(x);
#else
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#endif
}

// AttentionParams semantics (include/flare/variant/attention_params.h), in log2 units:
//   s = q.k * sm_scale;  s += slope * (j - q_pos);  s = cap * tanh(s / cap);  mask window;
//   sigmoid (use_softmax = false): the key's weight is sigmoid(s + sigmoid_bias).
//   RoPE (Llama): pair i turns by pos / rope_scale * rope_theta^(-2i/D) radians (rope_turns).
// With soft-cap, q carries sm_scale / cap and ALiBi slope / cap, so tanh takes its argument
// directly; otherwise q carries sm_scale * log2e and ALiBi slope * log2e.
struct StandardVariant : VariantBase {
  static constexpr bool kMaskIsWindow = true;
  static constexpr bool kSoftCap = FLARE_VARIANT_SOFT_CAP != 0;
  static constexpr bool kWindow = FLARE_VARIANT_WINDOW != 0;
  static constexpr bool kAlibi = FLARE_VARIANT_ALIBI != 0;
  static constexpr bool kSigmoid = FLARE_VARIANT_SIGMOID != 0;
  static constexpr bool kRotary = FLARE_VARIANT_ROPE != 0;
  // logits_transform is the identity
  static constexpr bool kLinearLogits = !kSoftCap && !kAlibi && !kSigmoid;
  // ALiBi alone: s + alibi_step * (kv_pos - q_pos) (has_affine_logits above).
  static constexpr bool kLogitsAffineInKvPos = kAlibi && !kSoftCap && !kSigmoid;
  static constexpr bool use_softmax = !kSigmoid;
  // cap * tanh: within +-cap (log2 units: times log2 e); the host defines the flag where
  // cap * log2 e <= kSoftCapFixedOffsetMaxBound, with softmax and without ALiBi
  // (builtin_variants.cpp).
  static constexpr bool kLogitsBounded = FLARE_VARIANT_BOUNDED_LOGITS != 0;
  static_assert(!kLogitsBounded || (kSoftCap && !kSigmoid), "bounded logits are soft-capped");

  float alibi_step;   // added per KV position, in query_scale units
  int alibi_origin;   // 0x4B400000 - q_pos: see logits_transform
  int first_visible;  // window: smallest visible KV position

  __device__ static float query_scale(const VariantParams& p) {
    return kSoftCap ? p.sm_scale / p.logits_soft_cap : p.sm_scale * kLog2e;
  }
  // The host's table (src/api/device_variant.cpp): pos * turns exact to ~1e-7 turns at any
  // position, where a float frequency would be off by pos * 6e-8 radians.
  // A read-only load (ld.global.nc): free to move above the rotation's shared-memory stores.
  __device__ static float2 rotary_turns(const VariantParams& p, int pair, int) {
    return __ldg(reinterpret_cast<const float2*>(p.rope_turns + 2 * pair));
  }
  __device__ static int visible_begin(const VariantParams& p, int, int query_pos) {
    if (!kWindow || p.window_left < 0) return 0;
    const int first = query_pos - p.window_left;
    return first > 0 ? first : 0;
  }
  __device__ void init(const VariantParams& p, const RowContext& row) {
    first_visible = visible_begin(p, row.request, row.q_pos);
    alibi_step = 0.0f;
    alibi_origin = 0;
    if (kAlibi) {
      const float slope = p.alibi_slopes[row.qo_head];
      alibi_step = kSoftCap ? slope / p.logits_soft_cap : slope * kLog2e;
      alibi_origin = 0x4B400000 - row.q_pos;
    }
  }
  __device__ float logits_transform(const VariantParams& p, float s, int kv_pos) const {
    // kv_pos - q_pos without an int-to-float conversion per logit: that conversion runs on the
    // special-function pipe beside the softmax's exp2 and halved the ALiBi kernels' rate (SASS:
    // one I2F per EX2; docs/perf.md). The bits 0x4B400000 + d are the float 1.5 * 2^23 + d for
    // -2^22 <= d < 2^22, which every visible key's d = kv_pos - q_pos is (requests of at most
    // kAlibiMaxKvLen = 2^22 query and KV tokens, checked at plan()); one integer add, one float
    // add. Keys past the request (a tile's padding) get some finite value and are masked.
    // (Per column, 2^23 + kv_pos shared by a thread's rows was CSE'd into 32 live registers and
    // spilled.)
    if (kAlibi) {
      const float distance = __int_as_float(alibi_origin + kv_pos) - 12582912.0f;
      s += alibi_step * distance;
    }
    if (kSoftCap) s = p.logits_soft_cap * kLog2e * fast_tanh(s);
    // s is the natural logit times log2 e: sigmoid(x) = 1 / (1 + 2^(-x log2 e)).
    if (kSigmoid) s = fast_rcp(1.0f + fast_exp2(-fmaf(p.sigmoid_bias, kLog2e, s)));
    return s;
  }
  __device__ static float logits_bound(const VariantParams& p) {
    return p.logits_soft_cap * kLog2e;
  }
  __device__ float logits_kv_slope() const { return alibi_step; }
  __device__ bool logits_mask(int kv_pos) const { return !kWindow || kv_pos >= first_visible; }
};

}  // namespace flare
