// flare::BatchDecode for the Python decode wrapper: created per configuration (kernels are
// JIT-compiled then), plan() on host arrays, run() on the caller's CUDA stream.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>

#include "bindings.h"
#include "flare/api/batch_decode.h"
#include "params_arg.h"
#include "tensor_arg.h"

namespace flare::python {

namespace {

cuda::Stream as_stream(uintptr_t handle) { return reinterpret_cast<cuda::Stream>(handle); }

void construct(BatchDecode* self, int device, int max_batch, int num_qo_heads, int num_kv_heads,
               int head_dim, int page_size, const std::string& q_dtype,
               const std::string& kv_dtype, const std::string& kv_layout, const ParamsArg& params,
               bool use_cuda_graph, int fixed_split_size, bool disable_split_kv,
               bool use_tensor_cores) {
  BatchDecodeConfig config;
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
  // Compiling the kernels can take seconds: let other Python threads run meanwhile.
  nb::gil_scoped_release release;
  new (self) BatchDecode(config);
}

void plan(BatchDecode& decode, const TensorArg& kv_indptr, const TensorArg& kv_last_page_len,
          uintptr_t stream) {
  decode.plan(kv_indptr.view(), kv_last_page_len.view(), as_stream(stream));
}

void run(BatchDecode& decode, const TensorArg& q, const TensorArg& k_pages,
         const TensorArg& v_pages, const TensorArg& kv_indptr, const TensorArg& kv_indices,
         const TensorArg& kv_last_page_len, const TensorArg& o,
         const std::optional<TensorArg>& lse, uintptr_t stream, float k_scale, float v_scale) {
  const PagedKV kv =
      PagedKV::from_separate(k_pages.view(), v_pages.view(), decode.config().layout,
                             kv_indptr.view(), kv_indices.view(), kv_last_page_len.view());
  decode.run(q.view(), kv, o.view(), view_of(lse), as_stream(stream), k_scale, v_scale);
}

}  // namespace

void bind_batch_decode(nb::module_& m) {
  nb::class_<BatchDecode>(m, "BatchDecode", "flare::BatchDecode (internal: GPU batch decode).")
      .def("__init__", &construct, nb::kw_only(), nb::arg("device"), nb::arg("max_batch"),
           nb::arg("num_qo_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
           nb::arg("page_size"), nb::arg("q_dtype"), nb::arg("kv_dtype"), nb::arg("kv_layout"),
           nb::arg("params"), nb::arg("use_cuda_graph"), nb::arg("fixed_split_size"),
           nb::arg("disable_split_kv"), nb::arg("use_tensor_cores") = false)
      .def("plan", &plan, nb::arg("kv_indptr"), nb::arg("kv_last_page_len"), nb::arg("stream"))
      .def("run", &run, nb::arg("q"), nb::arg("k_pages"), nb::arg("v_pages"),
           nb::arg("kv_indptr"), nb::arg("kv_indices"), nb::arg("kv_last_page_len"), nb::arg("o"),
           nb::arg("lse").none(), nb::arg("stream"), nb::arg("k_scale") = 1.0f,
           nb::arg("v_scale") = 1.0f)
      .def_prop_ro("max_batch", [](const BatchDecode& d) { return d.config().max_batch; })
      .def_prop_ro("num_ctas", &BatchDecode::num_ctas)
      .def_prop_ro("workspace_size", &BatchDecode::workspace_size);
}

}  // namespace flare::python
