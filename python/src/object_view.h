// The arguments of the hot run() paths. Tensors read straight from the caller's objects: a
// torch.Tensor through torch's DLPack C exchange table where it has one (torch >= 2.10: no
// interpreter, no capsule), else through five attribute reads (data_ptr, shape, stride, dtype,
// get_device; about a tenth of the cost of __dlpack__); other objects (numpy arrays, other
// DLPack producers, flare.Tensor) through TensorArg. The caller's current CUDA stream, the
// per-call options and check().
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>
#include <string>

#include "flare/api/index_errors.h"
#include "flare/api/run_options.h"
#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"
#include "flare/jit/cuda_driver.h"

namespace flare::python {

namespace nb = nanobind;

// The view of `object` (kept alive by the caller: it is an argument of the running call).
// Throws TypeError / kInvalidArgument naming `name` when it is not a tensor flare can read.
TensorView object_view(nb::handle object, const char* name);
// None -> nullopt.
std::optional<TensorView> optional_object_view(nb::handle object, const char* name);

// K and V pages from FlashInfer's paged_kv_cache argument: a (k, v) tuple or list, or one
// [pages, 2, ...] tensor whose dimension 1 holds K then V. `layout` is the wrapper's. NVFP4
// caches' block scales (kv_cache_sf, None otherwise) come the same way.
PagedKVPages paged_kv_pages(nb::handle paged_kv_cache, KVLayout layout, nb::handle indices,
                            const char* indices_name, nb::handle kv_cache_sf = nb::none());

// PyTorch's current stream on CUDA device `device` (the DLPack table's current_work_stream,
// else torch._C._cuda_getCurrentRawStream), the stream every flare kernel of a torch call runs
// on.
uintptr_t torch_current_stream(int device);
// torch's current stream on the CUDA device of `t`; null (unused) for a CPU tensor.
inline cuda::Stream torch_stream_for(const TensorView& t) {
  return t.device.is_cuda() ? reinterpret_cast<cuda::Stream>(torch_current_stream(t.device.index))
                            : nullptr;
}

// The wrappers' lse_base keyword as the extension takes it (true: FlashInfer's base 2).
inline LseBase lse_base_of(bool lse_base2) {
  return lse_base2 ? LseBase::kBase2 : LseBase::kNatural;
}

// run()'s per-call options from the wrappers' keywords.
inline RunOptions run_options(float q_scale, float k_scale, float v_scale, bool lse_base2,
                              bool enable_pdl) {
  RunOptions options;
  options.q_scale = q_scale;
  options.k_scale = k_scale;
  options.v_scale = v_scale;
  options.lse_base = lse_base_of(lse_base2);
  options.enable_pdl = enable_pdl;
  return options;
}

// The wrappers' check() on a BatchDecode or BatchPrefill: synchronizes the device without the
// GIL and raises for the kernels' out-of-range page ids, naming `operation` and `indices`.
template <class Engine>
void check_page_ids(const Engine& engine, const std::string& operation,
                    const std::string& indices) {
  nb::gil_scoped_release release;
  engine.check({operation.c_str(), indices.c_str()});
}

}  // namespace flare::python
