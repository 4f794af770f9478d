// The CPU backend for the Python wrappers: plan() on host lengths, then execute_plan_cpu on
// CPU tensors (numpy arrays, CPU torch tensors) with paged or ragged KV.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <span>
#include <thread>

#include "bindings.h"
#include "flare/core/error.h"
#include "flare/format/paged_kv.h"
#include "flare/plan/plan.h"
#include "flare/reference/execute_plan.h"
#include "params_arg.h"
#include "tensor_arg.h"

namespace flare::python {

namespace {

// A plan for the CPU backend: one "CTA" per hardware thread.
struct CpuPlan {
  Plan plan;
};

CpuPlan plan_cpu(const TensorArg& qo_len, const TensorArg& kv_len, int num_qo_heads,
                 int num_kv_heads, int head_dim_qk, int head_dim_vo, int page_size, bool causal,
                 int window_left, int fixed_split_size, bool disable_split_kv) {
  PlanProblem problem;
  problem.qo_len = host_int32_span(qo_len.view(), "qo_len");
  problem.kv_len = host_int32_span(kv_len.view(), "kv_len");
  problem.num_qo_heads = num_qo_heads;
  problem.num_kv_heads = num_kv_heads;
  problem.head_dim_qk = head_dim_qk;
  problem.head_dim_vo = head_dim_vo;
  problem.page_size = page_size;
  problem.causal = causal;
  problem.window_left = window_left;
  PlanOptions options;
  options.fixed_split_size = fixed_split_size;
  options.disable_split_kv = disable_split_kv;
  DeviceSpec cpu;
  cpu.num_sms = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu.ctas_per_sm = 1;
  return CpuPlan{plan(problem, cpu, options)};
}

void execute(const CpuPlan& plan, const AttentionProblem& problem, const TensorArg& o,
             const std::optional<TensorArg>& lse) {
  const AttentionOutput out{o.view(), view_of(lse)};
  nb::gil_scoped_release release;
  execute_plan_cpu(plan.plan, problem, out);
}

void run_cpu_paged(const CpuPlan& plan, const TensorArg& q, const TensorArg& qo_indptr,
                   const TensorArg& k_pages, const TensorArg& v_pages,
                   const std::string& kv_layout, const TensorArg& kv_indptr,
                   const TensorArg& kv_indices, const TensorArg& kv_last_page_len,
                   const ParamsArg& params, const TensorArg& o,
                   const std::optional<TensorArg>& lse) {
  const PagedKV kv = PagedKV::from_separate(k_pages.view(), v_pages.view(),
                                            parse_kv_layout(kv_layout.c_str()), kv_indptr.view(),
                                            kv_indices.view(), kv_last_page_len.view());
  execute(plan, AttentionProblem{q.view(), qo_indptr.view(), kv, params.resolved()}, o, lse);
}

void run_cpu_ragged(const CpuPlan& plan, const TensorArg& q, const TensorArg& qo_indptr,
                    const TensorArg& k, const TensorArg& v, const TensorArg& kv_indptr,
                    const ParamsArg& params, const TensorArg& o,
                    const std::optional<TensorArg>& lse) {
  const RaggedKV kv{k.view(), v.view(), kv_indptr.view()};
  execute(plan, AttentionProblem{q.view(), qo_indptr.view(), kv, params.resolved()}, o, lse);
}

}  // namespace

void bind_cpu_attention(nb::module_& m) {
  nb::class_<CpuPlan>(m, "CpuPlan", "A plan of the CPU backend (internal).")
      .def_prop_ro("num_work_items",
                   [](const CpuPlan& p) { return p.plan.work_items.size(); })
      .def_prop_ro("num_ctas", [](const CpuPlan& p) { return p.plan.num_ctas; });
  m.def("plan_cpu", &plan_cpu, nb::arg("qo_len"), nb::arg("kv_len"), nb::arg("num_qo_heads"),
        nb::arg("num_kv_heads"), nb::arg("head_dim_qk"), nb::arg("head_dim_vo"),
        nb::arg("page_size"), nb::arg("causal"), nb::arg("window_left"),
        nb::arg("fixed_split_size"), nb::arg("disable_split_kv"),
        "Plans attention on host lengths for the CPU backend.");
  m.def("run_cpu_paged", &run_cpu_paged, nb::arg("plan"), nb::arg("q"), nb::arg("qo_indptr"),
        nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("kv_layout"), nb::arg("kv_indptr"),
        nb::arg("kv_indices"), nb::arg("kv_last_page_len"), nb::arg("params"), nb::arg("o"),
        nb::arg("lse").none(),
        "Attention against a paged KV cache on the CPU (o and lse are written).");
  m.def("run_cpu_ragged", &run_cpu_ragged, nb::arg("plan"), nb::arg("q"), nb::arg("qo_indptr"),
        nb::arg("k"), nb::arg("v"), nb::arg("kv_indptr"), nb::arg("params"), nb::arg("o"),
        nb::arg("lse").none(),
        "Attention against ragged K/V on the CPU (o and lse are written).");
}

}  // namespace flare::python
