// flare::sparse (issue 23) for python/flare/sparse.py: SpMM (CPU reference and the GPU kernel) and
// SDDMM on a CSR matrix given as arrays (directly, or through its COO, ELL or hyb(c, k) form), and
// the ELL and hyb(c, k) formats as plain Python values.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "flare/core/error.h"
#include "flare/sparse/bsr_gpu.h"
#include "flare/sparse/coo.h"
#include "flare/sparse/csr.h"
#include "flare/sparse/ell.h"
#include "flare/sparse/generate.h"
#include "flare/sparse/hyb.h"
#include "flare/sparse/hyb_gpu.h"
#include "flare/sparse/sddmm_gpu.h"
#include "flare/sparse/spmm_gpu.h"
#include "flare/sparse/spmm_tune.h"
#include "object_view.h"
#include "tensor_arg.h"

namespace flare::python {
namespace {

sparse::Csr csr_of(int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
                   const std::optional<TensorArg>& values) {
  sparse::Csr a;
  a.rows = rows;
  a.cols = cols;
  a.indptr = indptr.view();
  a.indices = indices.view();
  a.values = view_of(values);
  return a;
}

// A CSR over CUDA torch tensors (viewed in place: the GPU operators check them); values when
// given.
sparse::Csr device_csr_of(int64_t rows, int64_t cols, nb::handle indptr, nb::handle indices,
                          nb::handle values = nb::none()) {
  sparse::Csr a;
  a.rows = rows;
  a.cols = cols;
  a.indptr = object_view(indptr, "indptr");
  a.indices = object_view(indices, "indices");
  if (!values.is_none()) a.values = object_view(values, "values");
  return a;
}

// The dense operand `x` (named `name` in `what`'s errors), which must be a CUDA tensor here.
TensorView cuda_operand(nb::handle x, const char* name, const char* what) {
  const TensorView view = object_view(x, name);
  FLARE_CHECK(view.device.is_cuda(), ErrorCode::kInvalidArgument, what, ": ", name,
              " must be a CUDA tensor here, got ", view.device.str());
  return view;
}

template <class T>
nb::list list_of(const std::vector<T>& values) {
  nb::list out;
  for (const T& v : values) out.append(v);
  return out;
}

// {"width", "rows", "columns", "values", "source"} of one ELL block.
nb::dict ell_dict(const sparse::EllBucket& b) {
  nb::dict bucket;
  bucket["width"] = b.width;
  bucket["rows"] = list_of(b.rows);
  bucket["columns"] = list_of(b.columns);
  bucket["values"] = list_of(b.values);
  bucket["source"] = list_of(b.source);
  return bucket;
}

// {"rows", "cols", "nnz", "padding_ratio", "partitions": [{"col_begin", "col_end", "buckets":
// [{"width", "rows", "columns", "values", "source"}], "remainder": {...}}]}
nb::dict hyb_dict(const sparse::Hyb& h) {
  nb::list partitions;
  for (const sparse::HybPartition& part : h.partitions) {
    nb::list buckets;
    for (const sparse::EllBucket& b : part.buckets) buckets.append(ell_dict(b));
    nb::dict remainder;
    remainder["rows"] = list_of(part.remainder.rows);
    remainder["indptr"] = list_of(part.remainder.indptr);
    remainder["columns"] = list_of(part.remainder.columns);
    remainder["values"] = list_of(part.remainder.values);
    remainder["source"] = list_of(part.remainder.source);
    nb::dict p;
    p["col_begin"] = part.col_begin;
    p["col_end"] = part.col_end;
    p["buckets"] = buckets;
    p["remainder"] = remainder;
    partitions.append(p);
  }
  nb::dict out;
  out["rows"] = h.rows;
  out["cols"] = h.cols;
  out["nnz"] = h.nnz;
  out["padding_ratio"] = h.padding_ratio();
  out["partitions"] = partitions;
  return out;
}

// A decomposition on the device: `layout` and its arrays (CUDA torch tensors) by name.
sparse::HybGpu device_hyb_of(const sparse::HybGpuLayout& layout, const nb::dict& arrays) {
  const auto array = [&arrays](const char* name) {
    FLARE_CHECK(arrays.contains(name), ErrorCode::kInvalidArgument,
                "flare.sparse: the hyb arrays lack '", name, "'");
    return object_view(arrays[name], name);
  };
  return {&layout,
          array("ell_rows"),
          array("ell_columns"),
          array("ell_values"),
          array("rest_rows"),
          array("rest_indptr"),
          array("rest_columns"),
          array("rest_values")};
}

// A tuner's result for Python: {"feature_tile", <second>, "from_cache", "search_ms",
// "timings_us": [(feature_tile, <second>, us)]}, <second> naming the schedule's second number
// (chunk_items for CSR, slots_per_warp for hyb).
template <class Tuning>
nb::dict tuning_dict(const Tuning& tuning, const char* second) {
  nb::list timings;
  for (const auto& [schedule, us] : tuning.timings) {
    const auto [tile, number] = schedule;
    timings.append(nb::make_tuple(tile, number, us));
  }
  const auto [tile, number] = tuning.schedule;
  nb::dict out;
  out["feature_tile"] = tile;
  out[second] = number;
  out["from_cache"] = tuning.from_cache;
  out["search_ms"] = tuning.search_ms;
  out["timings_us"] = timings;
  return out;
}

// A BSR decomposition on the device: `layout` and its arrays (CUDA torch tensors) by name.
sparse::BsrGpu device_bsr_of(const sparse::BsrGpuLayout& layout, const nb::dict& arrays) {
  const auto array = [&arrays](const char* name) {
    FLARE_CHECK(arrays.contains(name), ErrorCode::kInvalidArgument,
                "flare.sparse: the bsr arrays lack '", name, "'");
    return object_view(arrays[name], name);
  };
  return {&layout,
          array("indptr"),
          array("block_col"),
          array("values"),
          array("rest_rows"),
          array("rest_indptr"),
          array("rest_columns"),
          array("rest_values")};
}

// A vector's bytes (native order): numpy views them without a list.
template <class T>
nb::bytes bytes_of(const std::vector<T>& v) {
  return nb::bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// The CSR remainder's arrays of a decomposition's device layout (HybGpuLayout, BsrGpuLayout)
// added to `out` as bytes.
template <class Layout>
nb::dict with_remainder_bytes(nb::dict out, const Layout& l) {
  out["rest_rows"] = bytes_of(l.rest_rows);
  out["rest_indptr"] = bytes_of(l.rest_indptr);
  out["rest_columns"] = bytes_of(l.rest_columns);
  out["rest_source"] = bytes_of(l.rest_source);
  return out;
}

}  // namespace

void bind_sparse(nb::module_& m) {
  m.def(
      "sparse_graph",
      [](const std::string& kind, int64_t nodes, int64_t edges, uint64_t seed) {
        FLARE_CHECK(kind == "rmat" || kind == "uniform", ErrorCode::kInvalidArgument,
                    "flare.sparse.graph: kind must be 'rmat' or 'uniform', got '", kind, "'");
        const sparse::CsrGraph g = kind == "rmat" ? sparse::rmat_graph(nodes, edges, seed)
                                                  : sparse::uniform_graph(nodes, edges, seed);
        // The arrays as bytes (int32, native order): numpy views them without a list.
        return nb::make_tuple(bytes_of(g.indptr), bytes_of(g.indices));
      },
      nb::arg("kind"), nb::arg("nodes"), nb::arg("edges"), nb::arg("seed"),
      "(indptr, indices) int32 bytes of a seeded synthetic graph (flare/sparse/generate.h).");
  m.def(
      "sparse_spmm_cuda",
      [](int64_t rows, int64_t cols, nb::handle indptr, nb::handle indices, nb::handle values,
         nb::handle x, nb::handle y, nb::handle workspace, int64_t feature_tile,
         int64_t chunk_items) {
        const sparse::Csr a = device_csr_of(rows, cols, indptr, indices, values);
        const TensorView x_view = cuda_operand(x, "X", "flare.sparse.spmm");
        const sparse::SpmmSchedule schedule =
            feature_tile > 0
                ? sparse::SpmmSchedule{feature_tile, chunk_items}
                : sparse::default_spmm_schedule(x_view.ndim == 2 ? x_view.shape[1] : 1);
        sparse::spmm(a, x_view, object_view(y, "y"), object_view(workspace, "workspace"),
                     torch_stream_for(x_view), schedule);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("x"), nb::arg("y"), nb::arg("workspace"), nb::arg("feature_tile") = 0,
      nb::arg("chunk_items") = 0,
      "y <- A x on the GPU (CUDA torch tensors, torch's stream; workspace of "
      "sparse_spmm_workspace_bytes bytes), with a schedule (feature_tile 0: the default).");
  m.def(
      "sparse_spmm_schedules",
      [](int64_t d) {
        nb::list out;
        for (const sparse::SpmmSchedule& schedule : sparse::spmm_schedules(d))
          out.append(nb::make_tuple(schedule.feature_tile, schedule.chunk_items));
        return out;
      },
      nb::arg("d"), "The SpMM schedules the tuner times for d, the default first: (tile, chunk).");
  m.def(
      "sparse_spmm_tune",
      [](int64_t rows, int64_t cols, nb::handle indptr, nb::handle indices, nb::handle values,
         nb::handle x, nb::handle y, nb::handle workspace, bool use_cache) {
        const sparse::Csr a = device_csr_of(rows, cols, indptr, indices, values);
        const TensorView x_view = cuda_operand(x, "X", "flare.sparse.SpmmPlan");
        sparse::SpmmTuneOptions options;
        options.use_cache = use_cache;
        const sparse::SpmmTuning tuning =
            sparse::tune_spmm(a, x_view, object_view(y, "y"), object_view(workspace, "workspace"),
                              torch_stream_for(x_view), options);
        return tuning_dict(tuning, "chunk_items");
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("x"), nb::arg("y"), nb::arg("workspace"), nb::arg("use_cache") = true,
      "Times the SpMM schedules on the device (flare/sparse/spmm_tune.h), y <- A x by the "
      "chosen one; returns it with the search's figures. Synchronizes.");
  m.def(
      "sparse_spmm_workspace_bytes",
      [](int64_t rows, int64_t nnz, int64_t d) {
        return sparse::spmm_workspace_bytes(rows, nnz, d);
      },
      nb::arg("rows"), nb::arg("nnz"), nb::arg("d"),
      "Device bytes of the GPU SpMM's workspace (flare/sparse/spmm_gpu.h).");
  m.def(
      "sparse_sddmm_cuda",
      [](int64_t rows, int64_t cols, nb::handle indptr, nb::handle indices, nb::handle q,
         nb::handle k, nb::handle out) {
        const sparse::Csr a = device_csr_of(rows, cols, indptr, indices);
        const TensorView q_view = cuda_operand(q, "Q", "flare.sparse.sddmm");
        sparse::sddmm(a, q_view, object_view(k, "K"), object_view(out, "out"),
                      torch_stream_for(q_view));
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("q"),
      nb::arg("k"), nb::arg("out"),
      "out <- (Q K^T) at A's nonzeros on the GPU (CUDA torch tensors, torch's stream).");
  m.def(
      "sparse_spmm",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, const TensorArg& x, const TensorArg& y) {
        sparse::spmm_reference(csr_of(rows, cols, indptr, indices, values), x.view(), y.view());
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("x"), nb::arg("y"), "y <- A x (CPU reference, float64 accumulation).");
  m.def(
      "sparse_spmm_hyb",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, int column_parts, int max_log2_width, const TensorArg& x,
         const TensorArg& y) {
        const sparse::Hyb h = sparse::hyb_from_csr(csr_of(rows, cols, indptr, indices, values),
                                                   column_parts, max_log2_width);
        sparse::spmm_reference(h, x.view(), y.view());
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("column_parts"), nb::arg("max_log2_width"), nb::arg("x"), nb::arg("y"),
      "y <- A x through the hyb(c, k) decomposition (CPU reference).");
  m.def(
      "sparse_spmm_format",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, const std::string& format, const TensorArg& x,
         const TensorArg& y) {
        const sparse::Csr a = csr_of(rows, cols, indptr, indices, values);
        if (format == "coo") {
          sparse::spmm_reference(sparse::coo_from_csr(a), x.view(), y.view());
        } else if (format == "ell") {
          sparse::spmm_reference(sparse::ell_from_csr(a), x.view(), y.view());
        } else {
          fail(ErrorCode::kInvalidArgument, "sparse_spmm_format: format must be coo or ell, got ",
               format);
        }
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("format"), nb::arg("x"), nb::arg("y"),
      "y <- A x through A's COO or ELL form (CPU reference).");
  m.def(
      "sparse_ell",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, int width) {
        const sparse::Ell ell =
            sparse::ell_from_csr(csr_of(rows, cols, indptr, indices, values), width);
        nb::dict out = ell_dict(ell.slots);
        out["nnz"] = ell.nnz;
        out["padding_ratio"] = ell.padding_ratio();
        return out;
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("width"), "A's ELL form.");
  m.def(
      "sparse_sddmm",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& q, const TensorArg& k, const TensorArg& out) {
        sparse::sddmm_reference(csr_of(rows, cols, indptr, indices, std::nullopt), q.view(),
                                k.view(), out.view());
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("q"),
      nb::arg("k"), nb::arg("out"), "out[e] <- q_i . k_j at A's nonzeros (CPU reference).");
  m.def(
      "sparse_hyb",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, int column_parts, int max_log2_width) {
        return hyb_dict(sparse::hyb_from_csr(csr_of(rows, cols, indptr, indices, values),
                                             column_parts, max_log2_width));
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("column_parts"), nb::arg("max_log2_width"), "The hyb(c, k) decomposition.");

  nb::class_<sparse::HybGpuLayout>(m, "HybGpuLayout",
                                   "flare::sparse::HybGpuLayout (internal: hyb(c, k) for the GPU).")
      .def_prop_ro("padding_ratio", &sparse::HybGpuLayout::padding_ratio)
      .def_prop_ro("partitions", [](const sparse::HybGpuLayout& l) { return l.partitions.size(); })
      .def(
          "arrays",
          [](const sparse::HybGpuLayout& l) {
            nb::dict out;  // int32 bytes; the sources int64 (-1 for padding)
            out["ell_rows"] = bytes_of(l.ell_rows);
            out["ell_columns"] = bytes_of(l.ell_columns);
            out["ell_source"] = bytes_of(l.ell_source);
            return with_remainder_bytes(out, l);
          },
          "The device arrays' contents as native-order bytes.")
      .def("workspace_bytes", &sparse::hyb_spmm_workspace_bytes, nb::arg("d"));
  m.def(
      "sparse_hyb_gpu_layout",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         int column_parts, int max_log2_width) {
        return sparse::hyb_gpu_layout(csr_of(rows, cols, indptr, indices, std::nullopt),
                                      column_parts, max_log2_width);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"),
      nb::arg("column_parts"), nb::arg("max_log2_width"),
      "The device layout of hyb(c, k) (flare/sparse/hyb_gpu.h), built on the host from A's "
      "CSR arrays (validated).");
  m.def(
      "sparse_spmm_hyb_cuda",
      [](const sparse::HybGpuLayout& layout, const nb::dict& arrays, nb::handle x, nb::handle y,
         nb::handle workspace, int64_t feature_tile, int64_t slots_per_warp) {
        const TensorView x_view = cuda_operand(x, "X", "flare.sparse.spmm");
        const sparse::HybSchedule schedule =
            feature_tile > 0 ? sparse::HybSchedule{feature_tile, slots_per_warp}
                             : sparse::default_hyb_schedule(x_view.ndim == 2 ? x_view.shape[1] : 1);
        sparse::spmm(device_hyb_of(layout, arrays), x_view, object_view(y, "y"),
                     object_view(workspace, "workspace"), torch_stream_for(x_view), schedule);
      },
      nb::arg("layout"), nb::arg("arrays"), nb::arg("x"), nb::arg("y"), nb::arg("workspace"),
      nb::arg("feature_tile") = 0, nb::arg("slots_per_warp") = 0,
      "y <- A x over hyb(c, k) on the GPU: `arrays` maps ell_rows, ell_columns, ell_values, "
      "rest_rows, rest_indptr, rest_columns, rest_values to CUDA torch tensors (torch's stream); "
      "a schedule (feature_tile 0: the default).");
  m.def(
      "sparse_spmm_hyb_tune",
      [](const sparse::HybGpuLayout& layout, const nb::dict& arrays, nb::handle x, nb::handle y,
         nb::handle workspace, bool use_cache) {
        const TensorView x_view = cuda_operand(x, "X", "flare.sparse.SpmmPlan");
        sparse::SpmmTuneOptions options;
        options.use_cache = use_cache;
        const sparse::HybTuning tuning = sparse::tune_spmm(
            device_hyb_of(layout, arrays), x_view, object_view(y, "y"),
            object_view(workspace, "workspace"), torch_stream_for(x_view), options);
        return tuning_dict(tuning, "slots_per_warp");
      },
      nb::arg("layout"), nb::arg("arrays"), nb::arg("x"), nb::arg("y"), nb::arg("workspace"),
      nb::arg("use_cache") = true,
      "Times the hyb schedules on the device (flare/sparse/spmm_tune.h), y <- A x by the chosen "
      "one; returns it with the search's figures. Synchronizes.");
  nb::class_<sparse::BsrGpuLayout>(
      m, "BsrGpuLayout", "flare::sparse::BsrGpuLayout (internal: BSR 16x16 + CSR for the GPU).")
      .def_prop_ro("padding_ratio", &sparse::BsrGpuLayout::padding_ratio)
      .def_prop_ro("blocks", &sparse::BsrGpuLayout::blocks)
      .def(
          "arrays",
          [](const sparse::BsrGpuLayout& l) {
            nb::dict out;  // int32 bytes; the sources int64 (-1 for padding)
            out["indptr"] = bytes_of(l.indptr);
            out["block_col"] = bytes_of(l.block_col);
            out["source"] = bytes_of(l.source);
            return with_remainder_bytes(out, l);
          },
          "The device arrays' contents as native-order bytes.")
      .def("workspace_bytes", &sparse::bsr_spmm_workspace_bytes, nb::arg("d"));
  m.def(
      "sparse_bsr_gpu_layout",
      [](int64_t rows, int64_t cols, const TensorArg& indptr, const TensorArg& indices,
         const TensorArg& values, double min_fill) {
        return sparse::bsr_gpu_layout(csr_of(rows, cols, indptr, indices, values), min_fill);
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"), nb::arg("values"),
      nb::arg("min_fill"),
      "The device layout of BSR 16x16 + CSR remainder (flare/sparse/bsr_gpu.h), on the host.");
  m.def(
      "sparse_spmm_bsr_cuda",
      [](const sparse::BsrGpuLayout& layout, const nb::dict& arrays, nb::handle x, nb::handle y,
         nb::handle workspace) {
        const TensorView x_view = cuda_operand(x, "X", "flare.sparse.spmm");
        sparse::spmm(device_bsr_of(layout, arrays), x_view, object_view(y, "y"),
                     object_view(workspace, "workspace"), torch_stream_for(x_view));
      },
      nb::arg("layout"), nb::arg("arrays"), nb::arg("x"), nb::arg("y"), nb::arg("workspace"),
      "y <- A x over BSR + CSR remainder with tensor cores (CUDA torch tensors, torch's stream).");
  m.def(
      "sparse_csr_structure_hash",
      [](int64_t rows, int64_t cols, nb::handle indptr, nb::handle indices) {
        return sparse::csr_structure_hash(device_csr_of(rows, cols, indptr, indices));
      },
      nb::arg("rows"), nb::arg("cols"), nb::arg("indptr"), nb::arg("indices"),
      "A's structure hash (flare/sparse/spmm_tune.h; device arrays are copied: synchronizes).");
  m.def(
      "sparse_spmm_format_key",
      [](uint64_t structure_hash, nb::handle x) {
        const TensorView view = cuda_operand(x, "X", "flare.sparse.SpmmPlan");
        return sparse::spmm_tuning_key(structure_hash, view.ndim == 2 ? view.shape[1] : 0,
                                       view.dtype, cuda::device_properties(view.device.index).name);
      },
      nb::arg("structure_hash"), nb::arg("x"),
      "The cache key of a format choice for A (its structure hash) and X's d, dtype and GPU.");
  m.def(
      "sparse_read_spmm_format",
      [](const std::string& key) { return sparse::read_spmm_format(key); }, nb::arg("key"),
      "The cached format choice of `key`, or None.");
  m.def("sparse_write_spmm_format", &sparse::write_spmm_format, nb::arg("key"), nb::arg("format"),
        "Caches a format choice (atomically; a failed write is logged).");
  m.def(
      "sparse_hyb_default_schedule",
      [](int64_t d) {
        const sparse::HybSchedule s = sparse::default_hyb_schedule(d);
        return nb::make_tuple(s.feature_tile, s.slots_per_warp);
      },
      nb::arg("d"), "hyb's default schedule at feature size d: (feature_tile, slots_per_warp).");
}

}  // namespace flare::python
