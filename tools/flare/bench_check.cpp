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

// Copies rows [begin, end) of `from` (contiguous, rows along dimension 0) to row `at` on of
// `to` (same dtype and row shape).
void copy_rows(const HostTensor& from, int64_t begin, int64_t end, HostTensor& to, int64_t at) {
  int64_t row_elements = 1;
  for (size_t d = 1; d < from.shape().size(); ++d) row_elements *= from.shape()[d];
  const size_t row_bytes = static_cast<size_t>(row_elements) * dtype_bytes(from.dtype());
  std::memcpy(to.data<std::byte>() + at * row_bytes, from.data<std::byte>() + begin * row_bytes,
              static_cast<size_t>(end - begin) * row_bytes);
}

}  // namespace

SampleCheck check_sampled_requests(const Workload& work, const TensorView& o, int max_requests) {
  const std::vector<int64_t> requests =
      sampled_requests(static_cast<int64_t>(work.kv_lens.size()), max_requests);
  const WorkloadSpec& spec = work.spec;
  const bool ragged = spec.kv == BenchKV::kRagged;
  const int32_t* qo_indptr = work.qo_indptr.data<int32_t>();
  const int32_t* kv_indptr = work.kv_indptr.data<int32_t>();

  // The sampled requests as a batch of their own: their last query tokens (a request with
  // q_len queries and kv_len keys puts query t at position kv_len - q_len + t, so the last m
  // tokens are a request with m queries and the same keys), the same KV.
  std::vector<int32_t> sub_qo_indptr{0}, sub_kv_indptr{0}, sub_indices, sub_last;
  std::vector<int32_t> first_checked;  // per sampled request: its first checked token
  for (const int64_t r : requests) {
    const int32_t checked = static_cast<int32_t>(
        std::min<int64_t>(qo_indptr[r + 1] - qo_indptr[r], kCheckedTokensPerRequest));
    first_checked.push_back(qo_indptr[r + 1] - checked);
    sub_qo_indptr.push_back(sub_qo_indptr.back() + checked);
    sub_kv_indptr.push_back(sub_kv_indptr.back() + kv_indptr[r + 1] - kv_indptr[r]);
    if (!ragged) {
      const int32_t* indices = work.kv_indices.data<int32_t>();
      sub_indices.insert(sub_indices.end(), indices + kv_indptr[r], indices + kv_indptr[r + 1]);
      sub_last.push_back(work.kv_last_page_len.data<int32_t>()[r]);
    }
  }
  HostTensor sub_q(spec.dtype, {sub_qo_indptr.back(), spec.heads_qo, spec.head_dim});
  HostTensor sub_k, sub_v;
  if (ragged) {
    sub_k = HostTensor(spec.kv_dtype, {sub_kv_indptr.back(), spec.heads_kv, spec.head_dim});
    sub_v = HostTensor(spec.kv_dtype, {sub_kv_indptr.back(), spec.heads_kv, spec.head_dim});
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t r = requests[i];
    copy_rows(work.q, first_checked[i], qo_indptr[r + 1], sub_q, sub_qo_indptr[i]);
    if (ragged) {
      copy_rows(work.k, kv_indptr[r], kv_indptr[r + 1], sub_k, sub_kv_indptr[i]);
      copy_rows(work.v, kv_indptr[r], kv_indptr[r + 1], sub_v, sub_kv_indptr[i]);
    }
  }
  const HostTensor qo = int32_tensor(sub_qo_indptr), indptr = int32_tensor(sub_kv_indptr),
                   indices = int32_tensor(sub_indices), last = int32_tensor(sub_last);
  const KVCache kv =
      ragged ? KVCache(RaggedKV{sub_k.view(), sub_v.view(), indptr.view()})
             : KVCache(PagedKV::from_separate(work.k.view(), work.v.view(), KVLayout::kNHD,
                                              indptr.view(), indices.view(), last.view()));
  HostTensor expected(DType::kF32, {sub_qo_indptr.back(), spec.heads_qo, spec.head_dim});
  reference_attention(AttentionProblem{sub_q.view(), qo.view(), kv, work.params},
                      AttentionOutput{expected.view(), std::nullopt},
                      ReferenceOptions{Accumulation::kF64, 0});

  const int64_t row_elements = spec.heads_qo * spec.head_dim;  // one query token, all heads
  SampleCheck check;
  check.requests_checked = static_cast<int64_t>(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t rows = sub_qo_indptr[i + 1] - sub_qo_indptr[i];
    for (int64_t e = 0; e < rows * row_elements; ++e) {
      const double actual = load_float(o.data, o.dtype, first_checked[i] * row_elements + e);
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
