// The merge operator on attention states: device dispatch, the checks of the CUDA path, and the
// launch of kernels/merge_state.cuh (vector width chosen from pointer and stride alignment).
#include "flare/api/merge_state.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>

#include "flare/core/error.h"
#include "flare/jit/module.h"
#include "flare/reference/merge.h"
#include "kernels/merge_state.cuh"
#include "src/api/device_checks.h"

namespace flare {

static_assert(kMergeF32 == static_cast<int>(DType::kF32) &&
                  kMergeF16 == static_cast<int>(DType::kF16) &&
                  kMergeBF16 == static_cast<int>(DType::kBF16),
              "kernel dtype codes are the host's DType values");

namespace {

using api_detail::without_unit_strides;

constexpr auto kInvalid = ErrorCode::kInvalidArgument;
constexpr int kVectorBytes = 16;
// Enough blocks to fill any GPU several times over; the grid-stride loop covers the rest.
constexpr int64_t kMaxBlocks = 8192;

const char* const kRowsLayout = "[seq, num_heads, head_dim]";
const char* const kStackedLayout = "[seq, num_states, num_heads, head_dim]";

// A v tensor and its LSE tensor, with the names errors use.
struct StateArg {
  const TensorView& v;
  const char* v_name;
  const TensorView& s;
  const char* s_name;
};

void check_device(const TensorView& t, const char* name, const Device& device,
                  const char* device_owner) {
  FLARE_CHECK(t.device == device, kInvalid, name, " must be on ", device.str(), " (the device of ",
              device_owner, "), got ", t.device.str());
}

// Rank, dtypes and device of v and s, and s's shape against v's: s is v without its last dim.
void check_state(const StateArg& state, int v_ndim, const char* v_layout, const Device& device,
                 const char* device_owner) {
  const TensorView& v = state.v;
  const TensorView& s = state.s;
  FLARE_CHECK(v.ndim == v_ndim, kInvalid, state.v_name, " must have rank ", v_ndim, " ", v_layout,
              ", got rank ", v.ndim);
  FLARE_CHECK(v.dtype == DType::kF32 || v.dtype == DType::kF16 || v.dtype == DType::kBF16, kInvalid,
              state.v_name, " dtype must be float32, float16 or bfloat16, got ",
              dtype_name(v.dtype));
  FLARE_CHECK(s.dtype == DType::kF32, kInvalid, state.s_name, " dtype must be float32, got ",
              dtype_name(s.dtype));
  bool prefix = s.ndim == v.ndim - 1;
  for (int dim = 0; prefix && dim < s.ndim; ++dim) prefix = s.shape[dim] == v.shape[dim];
  FLARE_CHECK(prefix, kInvalid, state.s_name, " must have the shape of ", state.v_name,
              " without its last dimension (", state.v_name, " is ", v.shape_str(), "), got ",
              s.shape_str());
  check_device(v, state.v_name, device, device_owner);
  check_device(s, state.s_name, device, device_owner);
}

// Shape and dtype of another [seq, H, D] state against the first one's v.
void check_like(const StateArg& state, const StateArg& first, const Device& device) {
  check_state(state, 3, kRowsLayout, device, first.v_name);
  bool same = true;
  for (int dim = 0; dim < 3; ++dim) same = same && state.v.shape[dim] == first.v.shape[dim];
  FLARE_CHECK(same, kInvalid, state.v_name, " must have the shape of ", first.v_name, " ",
              first.v.shape_str(), ", got ", state.v.shape_str());
  FLARE_CHECK(state.v.dtype == first.v.dtype, kInvalid, state.v_name, " dtype must be ",
              first.v_name, "'s ", dtype_name(first.v.dtype), " on the GPU, got ",
              dtype_name(state.v.dtype));
}

// 16 when every v tensor's rows are unit-stride, their byte size a multiple of 16 and every
// pointer and byte stride 16-aligned; one element otherwise.
int vector_bytes(std::initializer_list<TensorView> vs) {
  const auto element = static_cast<int64_t>(dtype_bytes(vs.begin()->dtype));
  for (const TensorView& given : vs) {
    const TensorView v = without_unit_strides(given);
    const int last = v.ndim - 1;
    const bool aligned =
        v.strides[last] == (v.shape[last] > 1 ? 1 : 0) &&
        (v.shape[last] * element) % kVectorBytes == 0 &&
        reinterpret_cast<uintptr_t>(v.data) % kVectorBytes == 0 &&
        std::all_of(v.strides.begin(), v.strides.begin() + last,
                    [&](int64_t stride) { return (stride * element) % kVectorBytes == 0; });
    if (!aligned) return static_cast<int>(element);
  }
  return kVectorBytes;
}

// The kernel's view of v (rows [seq, H, D], or [seq, num_states, H, D] when stacked) and s.
MergeStateTensor state_tensor(const TensorView& v_in, const TensorView& s_in, int vector_bytes) {
  const TensorView v = without_unit_strides(v_in);
  const TensorView s = without_unit_strides(s_in);
  const auto element = static_cast<int64_t>(dtype_bytes(v.dtype));
  const bool stacked = v.ndim == 4;
  MergeStateTensor t{};
  t.v = static_cast<char*>(v.data);
  t.s = s.ptr<float>();
  t.v_seq_stride = v.strides[0] * element;
  t.v_state_stride = stacked ? v.strides[1] * element : 0;
  t.v_head_stride = v.strides[stacked ? 2 : 1] * element;
  t.v_vector_stride = vector_bytes == kVectorBytes ? kVectorBytes : v.strides[v.ndim - 1] * element;
  t.s_seq_stride = s.strides[0];
  t.s_state_stride = stacked ? s.strides[1] : 0;
  t.s_head_stride = s.strides[stacked ? 2 : 1];
  return t;
}

// vectors_per_lane: how many of a row's vectors each lane takes at least (the kernels'
// kMergePairVectorsPerLane, kMergeStatesVectorsPerLane), which sets lanes_per_row.
MergeRows merge_rows(int64_t seq, int64_t heads, int64_t head_dim, DType dtype, int vector_bytes,
                     LseBase base, int vectors_per_lane) {
  const int64_t vectors = head_dim * static_cast<int64_t>(dtype_bytes(dtype)) / vector_bytes;
  FLARE_CHECK(seq * heads <= INT32_MAX && vectors <= INT32_MAX, ErrorCode::kUnsupported,
              "merge on the GPU needs fewer than 2^31 rows (seq * num_heads) and elements per "
              "row, got seq=",
              seq, " num_heads=", heads, " head_dim=", head_dim);
  MergeRows rows{};
  rows.num_rows = static_cast<int32_t>(seq * heads);
  rows.num_heads = static_cast<int32_t>(heads);
  rows.vectors_per_row = static_cast<int32_t>(vectors);
  const int64_t lanes = (vectors + vectors_per_lane - 1) / vectors_per_lane;
  rows.lanes_per_row = static_cast<int32_t>(
      std::bit_ceil(std::clamp<uint64_t>(static_cast<uint64_t>(lanes), 1, 32)));
  rows.lse_base2 = base == LseBase::kBase2 ? 1 : 0;
  return rows;
}

// The merge kernel of (dtype, vector width, entry) on `device`, resolved through the JIT once
// and then found by those four values: the JIT's own lookup builds the spec's strings and a
// string key every call (the merge runs once per cascade level and wrapper call).
cuda::Function merge_function(DType dtype, int vector_bytes, const char* entry, int device) {
  using Key = std::tuple<int, int, std::string_view, int>;
  static std::mutex mutex;
  static std::map<Key, cuda::Function> resolved;  // entries are the launchers' string literals
  const Key key{static_cast<int>(dtype), vector_bytes, entry, device};
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto found = resolved.find(key);
    if (found != resolved.end()) return found->second;
  }
  const cuda::Function function =
      jit::get_kernel(merge_state_kernel_spec(dtype, vector_bytes), entry, device);
  const std::lock_guard<std::mutex> lock(mutex);
  resolved.emplace(key, function);
  return function;
}

// Launches `entry` over rows' warps (32 / lanes_per_row rows a warp) on `stream`; nothing when
// there are no rows.
void launch(DType dtype, int vector_bytes, const char* entry, const MergeRows& rows,
            const Device& device, cuda::Stream stream, void* params) {
  if (rows.num_rows == 0) return;
  const cuda::DeviceScope scope(device.index);
  const cuda::Function function = merge_function(dtype, vector_bytes, entry, device.index);
  const int64_t rows_per_warp = 32 / rows.lanes_per_row;
  const int64_t warps = (rows.num_rows + rows_per_warp - 1) / rows_per_warp;
  constexpr int64_t kWarpsPerBlock = kMergeStateThreads / 32;
  const auto blocks =
      static_cast<unsigned>(std::min(kMaxBlocks, (warps + kWarpsPerBlock - 1) / kWarpsPerBlock));
  void* args[] = {params};
  cuda::launch(function, blocks, 1, 1, kMergeStateThreads, 1, 1, 0, stream, args);
}

}  // namespace

void merge_state(const TensorView& v_a, const TensorView& s_a, const TensorView& v_b,
                 const TensorView& s_b, const TensorView& v_out, const TensorView& s_out,
                 cuda::Stream stream, LseBase base) {
  if (!v_a.device.is_cuda()) {
    merge_state(v_a, s_a, v_b, s_b, v_out, s_out, base);
    return;
  }
  const StateArg a{v_a, "v_a", s_a, "s_a"};
  check_state(a, 3, kRowsLayout, v_a.device, "v_a");
  check_like({v_b, "v_b", s_b, "s_b"}, a, v_a.device);
  check_like({v_out, "v_out", s_out, "s_out"}, a, v_a.device);

  const int vec = vector_bytes({v_a, v_b, v_out});
  MergeStatePairParams params{};
  params.a = state_tensor(v_a, s_a, vec);
  params.b = state_tensor(v_b, s_b, vec);
  params.out = state_tensor(v_out, s_out, vec);
  params.rows = merge_rows(v_a.shape[0], v_a.shape[1], v_a.shape[2], v_a.dtype, vec, base,
                           kMergePairVectorsPerLane);
  launch(v_a.dtype, vec, "flare_merge_state_pair", params.rows, v_a.device, stream, &params);
}

void merge_state_in_place(const TensorView& v, const TensorView& s, const TensorView& v_other,
                          const TensorView& s_other, const std::optional<TensorView>& mask,
                          cuda::Stream stream, LseBase base) {
  if (!v.device.is_cuda()) {
    merge_state_in_place(v, s, v_other, s_other, mask, base);
    return;
  }
  const StateArg state{v, "v", s, "s"};
  check_state(state, 3, kRowsLayout, v.device, "v");
  check_like({v_other, "v_other", s_other, "s_other"}, state, v.device);
  if (mask) {
    FLARE_CHECK(mask->ndim == 1 && mask->shape[0] == v.shape[0], kInvalid,
                "mask must have shape [seq] = [", v.shape[0], "], got ", mask->shape_str());
    FLARE_CHECK(mask->dtype == DType::kU8, kInvalid, "mask dtype must be uint8, got ",
                dtype_name(mask->dtype));
    check_device(*mask, "mask", v.device, "v");
  }

  const int vec = vector_bytes({v, v_other});
  MergeStatePairParams params{};
  params.a = state_tensor(v, s, vec);
  params.b = state_tensor(v_other, s_other, vec);
  params.out = params.a;
  if (mask) {
    params.mask = mask->ptr<const unsigned char>();
    params.mask_stride = mask->shape[0] > 1 ? mask->strides[0] : 0;
  }
  params.rows =
      merge_rows(v.shape[0], v.shape[1], v.shape[2], v.dtype, vec, base, kMergePairVectorsPerLane);
  launch(v.dtype, vec, "flare_merge_state_pair", params.rows, v.device, stream, &params);
}

void merge_states(const TensorView& v, const TensorView& s, const TensorView& v_out,
                  const TensorView& s_out, cuda::Stream stream, LseBase base) {
  if (!v.device.is_cuda()) {
    merge_states(v, s, v_out, s_out, base);
    return;
  }
  const StateArg states{v, "v", s, "s"};
  check_state(states, 4, kStackedLayout, v.device, "v");
  const StateArg out{v_out, "v_out", s_out, "s_out"};
  check_state(out, 3, kRowsLayout, v.device, "v");
  const bool shapes_agree =
      v_out.shape[0] == v.shape[0] && v_out.shape[1] == v.shape[2] && v_out.shape[2] == v.shape[3];
  FLARE_CHECK(shapes_agree, kInvalid, "v_out must have shape [seq, num_heads, head_dim] = [",
              v.shape[0], ", ", v.shape[2], ", ", v.shape[3], "] (from v ", v.shape_str(),
              "), got ", v_out.shape_str());
  FLARE_CHECK(v_out.dtype == v.dtype, kInvalid, "v_out dtype must be v's ", dtype_name(v.dtype),
              " on the GPU, got ", dtype_name(v_out.dtype));
  FLARE_CHECK(v.shape[1] <= INT32_MAX, ErrorCode::kUnsupported,
              "merge_states on the GPU needs num_states below 2^31, got ", v.shape[1]);

  const int vec = vector_bytes({v, v_out});
  MergeStatesParams params{};
  params.states = state_tensor(v, s, vec);
  params.out = state_tensor(v_out, s_out, vec);
  params.num_states = static_cast<int32_t>(v.shape[1]);
  if (params.num_states == 2) {
    // Two states are a pair: the pair kernel (two vectors of a row a lane, all of a row's
    // loads in flight together) over the stacked tensor's two halves; 2.1x faster than the
    // states loop at seq 4096 (forty-fourth session). The same ⊕, rounded products instead of
    // fused ones.
    MergeStatePairParams pair{};
    pair.a = params.states;
    pair.b = params.states;
    pair.b.v += params.states.v_state_stride;
    pair.b.s += params.states.s_state_stride;
    pair.out = params.out;
    pair.rows = merge_rows(v.shape[0], v.shape[2], v.shape[3], v.dtype, vec, base,
                           kMergePairVectorsPerLane);
    launch(v.dtype, vec, "flare_merge_state_pair", pair.rows, v.device, stream, &pair);
    return;
  }
  params.rows = merge_rows(v.shape[0], v.shape[2], v.shape[3], v.dtype, vec, base,
                           kMergeStatesVectorsPerLane);
  launch(v.dtype, vec, "flare_merge_states", params.rows, v.device, stream, &params);
}

void merge_states_ragged(const TensorView& v, const TensorView& s, const TensorView& indptr,
                         const TensorView& v_out, const TensorView& s_out, cuda::Stream stream,
                         LseBase base) {
  if (!v.device.is_cuda()) {
    merge_states_ragged(v, s, indptr, v_out, s_out, base);
    return;
  }
  const char* const states_layout = "[total_states, num_heads, head_dim]";
  check_state({v, "v", s, "s"}, 3, states_layout, v.device, "v");
  check_state({v_out, "v_out", s_out, "s_out"}, 3, kRowsLayout, v.device, "v");
  const int64_t seq = v_out.shape[0];
  FLARE_CHECK(v_out.shape[1] == v.shape[1] && v_out.shape[2] == v.shape[2], kInvalid,
              "v_out must have shape [seq, num_heads, head_dim] = [", seq, ", ", v.shape[1], ", ",
              v.shape[2], "] (heads and head_dim from v ", v.shape_str(), "), got ",
              v_out.shape_str());
  FLARE_CHECK(v_out.dtype == v.dtype, kInvalid, "v_out dtype must be v's ", dtype_name(v.dtype),
              " on the GPU, got ", dtype_name(v_out.dtype));
  FLARE_CHECK(indptr.ndim == 1 && indptr.shape[0] == seq + 1, kInvalid,
              "indptr must have shape [seq + 1] = [", seq + 1, "] (seq from v_out), got ",
              indptr.shape_str());
  FLARE_CHECK(indptr.dtype == DType::kI32, kInvalid, "indptr dtype must be int32, got ",
              dtype_name(indptr.dtype));
  check_device(indptr, "indptr", v.device, "v");
  FLARE_CHECK(indptr.shape[0] == 1 || indptr.strides[0] == 1, kInvalid,
              "indptr must be contiguous on the GPU, got stride ", indptr.strides[0]);
  FLARE_CHECK(v.shape[0] <= INT32_MAX, ErrorCode::kUnsupported,
              "merge_states_ragged on the GPU needs total_states below 2^31, got ", v.shape[0]);

  const int vec = vector_bytes({v, v_out});
  MergeStatesParams params{};
  // The states run along v's first dimension: its stride is the state stride, no seq stride.
  params.states = state_tensor(v, s, vec);
  params.states.v_state_stride = params.states.v_seq_stride;
  params.states.v_seq_stride = 0;
  params.states.s_state_stride = params.states.s_seq_stride;
  params.states.s_seq_stride = 0;
  params.out = state_tensor(v_out, s_out, vec);
  params.num_states = static_cast<int32_t>(v.shape[0]);
  params.state_indptr = indptr.ptr<const int32_t>();
  params.rows =
      merge_rows(seq, v.shape[1], v.shape[2], v.dtype, vec, base, kMergeStatesVectorsPerLane);
  launch(v.dtype, vec, "flare_merge_states", params.rows, v.device, stream, &params);
}

jit::KernelSpec merge_state_kernel_spec(DType dtype, int vector_bytes) {
  FLARE_CHECK(dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16, kInvalid,
              "merge kernels take float32, float16 or bfloat16 v, got ", dtype_name(dtype));
  const auto element = static_cast<int>(dtype_bytes(dtype));
  FLARE_CHECK(vector_bytes == kVectorBytes || vector_bytes == element, kInvalid,
              "merge kernel vector width for ", dtype_name(dtype), " must be 16 or ", element,
              " bytes, got ", vector_bytes);
  jit::KernelSpec spec;
  spec.family_header = "merge_state.cuh";
  spec.entry = "flare_merge_state_pair;flare_merge_states";
  spec.defines = {{"FLARE_MERGE_DTYPE", std::to_string(static_cast<int>(dtype))},
                  {"FLARE_MERGE_VEC_BYTES", std::to_string(vector_bytes)}};
  spec.label = "merge_state " + std::string(dtype_name(dtype)) +
               " vec=" + std::to_string(vector_bytes) + "B";
  return spec;
}

std::vector<jit::KernelSpec> shipped_merge_state_kernel_specs() {
  std::vector<jit::KernelSpec> specs;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    specs.push_back(merge_state_kernel_spec(dtype, kVectorBytes));
    specs.push_back(merge_state_kernel_spec(dtype, static_cast<int>(dtype_bytes(dtype))));
  }
  return specs;
}

}  // namespace flare
