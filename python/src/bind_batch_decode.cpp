// flare::BatchDecode for the Python decode wrapper: created per configuration (kernels are
// JIT-compiled then), plan() on host arrays, run() on the caller's CUDA stream with its
// tensors read straight from the Python objects (object_view.h), check() for the kernels'
// out-of-range page ids.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "flare/api/batch_decode.h"
#include "flare/core/error.h"
#include "flare/jit/cuda_driver.h"
#include "object_view.h"
#include "params_arg.h"
#include "tensor_arg.h"
#include "variant_arg.h"

namespace flare::python {

namespace {

// DecodeConfig(...): a BatchDecodeConfig from the wrapper's keywords, for BatchDecode and
// precompile().
void make_config(BatchDecodeConfig* self, int device, int max_batch, int num_qo_heads,
                 int num_kv_heads, int head_dim, int page_size, const std::string& q_dtype,
                 const std::string& kv_dtype, const std::string& kv_layout, const ParamsArg& params,
                 bool use_cuda_graph, int fixed_split_size, bool disable_split_kv,
                 bool use_tensor_cores, uintptr_t scratch, size_t scratch_bytes,
                 bool validate_indices, nb::handle variant) {
  BatchDecodeConfig& config = *new (self) BatchDecodeConfig();
  config.device = device;
  config.max_batch = max_batch;
  config.num_qo_heads = num_qo_heads;
  config.num_kv_heads = num_kv_heads;
  config.head_dim = head_dim;
  config.page_size = page_size;
  config.q_dtype = parse_dtype(q_dtype);
  config.kv_dtype = parse_dtype(kv_dtype);
  config.layout = parse_kv_layout(kv_layout.c_str());
  config.params = params.resolved();
  config.use_cuda_graph = use_cuda_graph;
  config.fixed_split_size = fixed_split_size;
  config.disable_split_kv = disable_split_kv;
  config.use_tensor_cores = use_tensor_cores;
  config.scratch = reinterpret_cast<void*>(scratch);
  config.scratch_bytes = scratch_bytes;
  config.validate_indices = validate_indices;
  config.variant = user_variant_arg(variant);
}

void construct(BatchDecode* self, const BatchDecodeConfig& config) {
  // Compiling the kernels can take seconds: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  new (self) BatchDecode(config);
}

// Host index arrays as the caller's objects (CPU torch tensors or numpy arrays, read without a
// copy; the engine checks them and names them kv_indptr, kv_last_page_len).
void plan(BatchDecode& decode, nb::handle kv_indptr, nb::handle kv_last_page_len,
          uintptr_t stream) {
  decode.plan(object_view(kv_indptr, "kv_indptr"),
              object_view(kv_last_page_len, "kv_last_page_len"),
              reinterpret_cast<cuda::Stream>(stream));
}

// The wrapper's run(): q, the paged cache (a (k, v) pair or one [pages, 2, ...] tensor), the
// page ids and the outputs as the caller's objects, on torch's current stream.
void run(BatchDecode& decode, nb::handle q, nb::handle paged_kv_cache, nb::handle indices,
         nb::handle out, nb::handle lse, float q_scale, float k_scale, float v_scale,
         bool lse_base2, bool enable_pdl, nb::handle variant_scalars, nb::handle variant_tensors,
         nb::handle kv_cache_sf) {
  const BatchDecodeConfig& c = decode.config();
  const PagedKVPages pages =
      paged_kv_pages(paged_kv_cache, c.layout, indices, "indices", kv_cache_sf);
  const RunArguments args(q_scale, k_scale, v_scale, lse_base2, enable_pdl, variant_scalars,
                          variant_tensors);
  decode.run(object_view(q, "q"), pages, object_view(out, "out"), optional_object_view(lse, "lse"),
             reinterpret_cast<cuda::Stream>(torch_current_stream(c.device)), args.options());
}

// `t` with a dimension of extent 1 inserted before dimension `dim` (its stride is never stepped
// along: that of the dimension it precedes times its extent, 1 at the end).
TensorView with_unit_dim(const TensorView& t, int dim, const char* name, int expected_ndim) {
  FLARE_CHECK(t.ndim == expected_ndim, ErrorCode::kInvalidArgument, "single_decode: ", name,
              " must be ", expected_ndim, "-D, got shape ", t.shape_str());
  TensorView out = t;
  out.ndim = t.ndim + 1;
  for (int d = t.ndim; d > dim; --d) {
    out.shape[static_cast<size_t>(d)] = t.shape[static_cast<size_t>(d - 1)];
    out.strides[static_cast<size_t>(d)] = t.strides[static_cast<size_t>(d - 1)];
  }
  out.shape[static_cast<size_t>(dim)] = 1;
  out.strides[static_cast<size_t>(dim)] =
      dim < t.ndim ? t.strides[static_cast<size_t>(dim)] * t.shape[static_cast<size_t>(dim)] : 1;
  return out;
}

// single_decode_with_kv_cache's run, the batch of one request viewed here without torch calls
// (each view op is ~1-2 us there): q [H_qo, D] as [1, H_qo, D]; k and v [kv_len, H_kv, D] (NHD)
// or [H_kv, kv_len, D] (hnd) as pages of one token ([kv_len, 1, H_kv, D] / [kv_len, H_kv, 1,
// D]); out [H_qo, D] and lse [H_qo] (or None) as a batch of one.
void run_single(BatchDecode& decode, nb::handle q, nb::handle k, nb::handle v, bool hnd,
                nb::handle indices, nb::handle out, nb::handle lse, float q_scale, float k_scale,
                float v_scale, bool lse_base2, bool enable_pdl, nb::handle variant_scalars,
                nb::handle variant_tensors) {
  const BatchDecodeConfig& c = decode.config();
  PagedKVPages pages;
  pages.layout = c.layout;
  pages.indices = object_view(indices, "indices");
  for (auto [handle, name, view] : {std::tuple{k, "k", &pages.k}, std::tuple{v, "v", &pages.v}}) {
    TensorView rows = object_view(handle, name);
    if (hnd && rows.ndim == 3) {  // [H_kv, kv_len, D] -> [kv_len, H_kv, D]
      std::swap(rows.shape[0], rows.shape[1]);
      std::swap(rows.strides[0], rows.strides[1]);
    }
    *view = with_unit_dim(rows, hnd ? 2 : 1, name, 3);
  }
  const RunArguments args(q_scale, k_scale, v_scale, lse_base2, enable_pdl, variant_scalars,
                          variant_tensors);
  std::optional<TensorView> lse_view;
  if (!lse.is_none()) lse_view = with_unit_dim(object_view(lse, "lse"), 0, "lse", 1);
  decode.run(with_unit_dim(object_view(q, "q"), 0, "q", 2), pages,
             with_unit_dim(object_view(out, "out"), 0, "out", 2), lse_view,
             reinterpret_cast<cuda::Stream>(torch_current_stream(c.device)), args.options());
}

// int32 page ids 0 .. count - 1 on `device`, in device memory of their own (freed with the
// returned object): single_decode_with_kv_cache reads k and v as pages of one token and keeps
// these with its plan, instead of a torch.arange a call (a kernel launch, ~5-8 us of host time).
// Not torch's allocator: under torch.compile a warm-up call allocates from a CUDA graph's pool,
// which may hand the memory to another tensor later.
TensorArg identity_page_ids(int device, int64_t count) {
  FLARE_CHECK(count >= 0 && count <= std::numeric_limits<int32_t>::max(),
              ErrorCode::kInvalidArgument, "identity_page_ids: count must be in [0, 2^31), got ",
              count);
  const cuda::DeviceScope scope(device);
  auto buffer = std::make_unique<cuda::DeviceBuffer>(
      static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(int32_t));
  std::vector<int32_t> ids(static_cast<size_t>(count));
  std::iota(ids.begin(), ids.end(), 0);
  if (count > 0) cuda::memcpy_htod(buffer->data(), ids.data(), ids.size() * sizeof(int32_t));
  const void* data = buffer->data();
  nb::capsule owner(buffer.release(),
                    [](void* p) noexcept { delete static_cast<cuda::DeviceBuffer*>(p); });
  const size_t shape[1] = {static_cast<size_t>(count)};
  nb::ndarray<nb::ro> array(data, 1, shape, owner, nullptr, nb::dtype<int32_t>(),
                            nb::device::cuda::value, device);
  return TensorArg(std::move(array), std::nullopt);
}

}  // namespace

void bind_batch_decode(nb::module_& m) {
  m.def("identity_page_ids", &identity_page_ids, nb::arg("device"), nb::arg("count"),
        "int32 page ids 0 .. count - 1 on a CUDA device, in memory of their own (internal: "
        "single_decode_with_kv_cache).");
  nb::class_<BatchDecodeConfig>(m, "DecodeConfig",
                                "flare::BatchDecodeConfig (internal: BatchDecode, precompile).")
      .def("__init__", &make_config, nb::kw_only(), nb::arg("device"), nb::arg("max_batch"),
           nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
           nb::arg("page_size"), nb::arg("q_dtype"), nb::arg("kv_dtype"), nb::arg("kv_layout"),
           nb::arg("params"), nb::arg("use_cuda_graph"), nb::arg("fixed_split_size"),
           nb::arg("disable_split_kv"), nb::arg("use_tensor_cores") = false, nb::arg("scratch") = 0,
           nb::arg("scratch_bytes") = 0, nb::arg("validate_indices") = false,
           nb::arg("variant").none() = nb::none());
  nb::class_<BatchDecode>(m, "BatchDecode", "flare::BatchDecode (internal: GPU batch decode).")
      .def("__init__", &construct, nb::arg("config"))
      .def("plan", &plan, nb::arg("kv_indptr"), nb::arg("kv_last_page_len"), nb::arg("stream"))
      .def("run", &run, nb::arg("q"), nb::arg("paged_kv_cache"), nb::arg("indices"), nb::arg("out"),
           nb::arg("lse").none(), nb::arg("q_scale"), nb::arg("k_scale"), nb::arg("v_scale"),
           nb::arg("lse_base2"), nb::arg("enable_pdl"),
           nb::arg("variant_scalars").none() = nb::none(),
           nb::arg("variant_tensors").none() = nb::none(),
           nb::arg("kv_cache_sf").none() = nb::none())
      .def("run_single", &run_single, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("hnd"),
           nb::arg("indices"), nb::arg("out"), nb::arg("lse").none(), nb::arg("q_scale"),
           nb::arg("k_scale"), nb::arg("v_scale"), nb::arg("lse_base2"), nb::arg("enable_pdl"),
           nb::arg("variant_scalars").none() = nb::none(),
           nb::arg("variant_tensors").none() = nb::none())
      .def("check", &check_page_ids<BatchDecode>, nb::arg("operation"), nb::arg("indices"))
      .def_prop_ro("max_batch", [](const BatchDecode& d) { return d.config().max_batch; })
      .def_prop_ro("num_ctas", &BatchDecode::num_ctas)
      .def_prop_ro("max_partial_slots", &BatchDecode::max_partial_slots)
      .def_prop_ro("workspace_size", &BatchDecode::workspace_size);
}

}  // namespace flare::python
