// Sampled float64 reference check for `flare bench` (see bench_check.h).
#include "tools/flare/bench_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "flare/reference/attention.h"

namespace flare::cli {
namespace {

std::vector<int64_t> sampled_requests(int64_t batch, int max_requests) {
  std::vector<int64_t> requests;
  const int64_t count = std::min<int64_t>(batch, max_requests);
  for (int64_t i = 0; i < count; ++i) {
    requests.push_back(count == 1 ? 0 : i * (batch - 1) / (count - 1));
  }
  requests.erase(std::unique(requests.begin(), requests.end()), requests.end());
  return requests;
}

}  // namespace

SampleCheck check_sampled_requests(const Workload& work, const TensorView& o, int max_requests) {
  const std::vector<int64_t> requests =
      sampled_requests(static_cast<int64_t>(work.kv_lens.size()), max_requests);
  const WorkloadSpec& spec = work.spec;
  const int32_t* qo_indptr = work.qo_indptr.data<int32_t>();
  const int32_t* kv_indptr = work.kv_indptr.data<int32_t>();
  const int32_t* kv_indices = work.kv_indices.data<int32_t>();
  const int32_t* last_page_len = work.kv_last_page_len.data<int32_t>();

  // The sampled requests as a batch of their own over the same page pool.
  std::vector<int32_t> sub_qo_indptr{0}, sub_kv_indptr{0}, sub_indices, sub_last;
  for (int64_t r : requests) {
    sub_qo_indptr.push_back(sub_qo_indptr.back() + qo_indptr[r + 1] - qo_indptr[r]);
    sub_kv_indptr.push_back(sub_kv_indptr.back() + kv_indptr[r + 1] - kv_indptr[r]);
    sub_indices.insert(sub_indices.end(), kv_indices + kv_indptr[r], kv_indices + kv_indptr[r + 1]);
    sub_last.push_back(last_page_len[r]);
  }
  const int64_t row_elements = spec.heads_qo * spec.head_dim;  // one query token, all heads
  const size_t row_bytes = static_cast<size_t>(row_elements) * dtype_bytes(spec.dtype);
  HostTensor sub_q(spec.dtype, {sub_qo_indptr.back(), spec.heads_qo, spec.head_dim});
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t r = requests[i];
    std::memcpy(sub_q.data<std::byte>() + sub_qo_indptr[i] * row_bytes,
                work.q.data<std::byte>() + qo_indptr[r] * row_bytes,
                static_cast<size_t>(qo_indptr[r + 1] - qo_indptr[r]) * row_bytes);
  }
  const HostTensor qo = int32_tensor(sub_qo_indptr), indptr = int32_tensor(sub_kv_indptr),
                   indices = int32_tensor(sub_indices), last = int32_tensor(sub_last);
  const PagedKV kv =
      PagedKV::from_separate(work.k_pages.view(), work.v_pages.view(), KVLayout::kNHD,
                             indptr.view(), indices.view(), last.view());
  HostTensor expected(DType::kF32, {sub_qo_indptr.back(), spec.heads_qo, spec.head_dim});
  reference_attention(AttentionProblem{sub_q.view(), qo.view(), kv, work.params},
                      AttentionOutput{expected.view(), std::nullopt},
                      ReferenceOptions{Accumulation::kF64, 0});

  SampleCheck check;
  check.requests_checked = static_cast<int64_t>(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t r = requests[i];
    const int64_t rows = qo_indptr[r + 1] - qo_indptr[r];
    for (int64_t e = 0; e < rows * row_elements; ++e) {
      const double actual = load_float(o.data, o.dtype, qo_indptr[r] * row_elements + e);
      const double reference = expected.get(sub_qo_indptr[i] * row_elements + e);
      const double error = std::fabs(actual - reference);
      if (std::isnan(error))
        return {std::numeric_limits<double>::quiet_NaN(), check.requests_checked};
      check.max_abs_error = std::max(check.max_abs_error, error);
    }
  }
  return check;
}

}  // namespace flare::cli
