// Tensor arguments of the hot run() paths read straight from the caller's objects: a
// torch.Tensor through five attribute reads (data_ptr, shape, stride, dtype, get_device), no
// DLPack capsule (about a tenth of the cost of __dlpack__); other objects (numpy arrays, other
// DLPack producers, flare.Tensor) through TensorArg. And the caller's current CUDA stream.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>
#include <optional>

#include "flare/core/tensor.h"
#include "flare/format/paged_kv.h"

namespace flare::python {

namespace nb = nanobind;

// The view of `object` (kept alive by the caller: it is an argument of the running call).
// Throws TypeError / kInvalidArgument naming `name` when it is not a tensor flare can read.
TensorView object_view(nb::handle object, const char* name);
// None -> nullopt.
std::optional<TensorView> optional_object_view(nb::handle object, const char* name);

// K and V pages from FlashInfer's paged_kv_cache argument: a (k, v) tuple or list, or one
// [pages, 2, ...] tensor whose dimension 1 holds K then V. `layout` is the wrapper's.
PagedKVPages paged_kv_pages(nb::handle paged_kv_cache, KVLayout layout, nb::handle indices,
                            const char* indices_name);

// PyTorch's current stream on CUDA device `device` (torch._C._cuda_getCurrentRawStream), the
// stream every flare kernel of a torch call runs on.
uintptr_t torch_current_stream(int device);

}  // namespace flare::python
