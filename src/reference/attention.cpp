// The reference backend's entry points: reference_attend_rows (one work item, any KV range)
// and reference_attention (the whole problem, threads over (request, KV head, row block)).
#include "flare/reference/attention.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "flare/core/error.h"
#include "src/reference/attention_rows.h"
#include "src/reference/element_io.h"

namespace flare {

using reference_detail::gather_kv_rows;
using reference_detail::HeadGeometry;
using reference_detail::KVRows;
using reference_detail::request_geometry;
using reference_detail::RequestGeometry;
using reference_detail::RowAttention;

int64_t kv_length(const KVCache& kv, int64_t request) {
  return std::visit([request](const auto& cache) { return cache.kv_len(request); }, kv);
}
int64_t num_kv_heads(const KVCache& kv) {
  return std::visit([](const auto& cache) { return cache.num_kv_heads(); }, kv);
}
int64_t head_dim_qk(const KVCache& kv) {
  return std::visit([](const auto& cache) { return cache.head_dim_qk(); }, kv);
}
int64_t head_dim_vo(const KVCache& kv) {
  return std::visit([](const auto& cache) { return cache.head_dim_vo(); }, kv);
}

namespace {

// Packed rows per task of reference_attention: small enough that one long prefill request
// spreads over every thread, large enough that a task outweighs its scheduling.
constexpr int64_t kRowsPerTask = 64;

template <class T>
void attend_rows_as(const AttentionProblem& problem, const RequestGeometry& request,
                    int64_t kv_head, int64_t row_begin, int64_t row_end, int64_t kv_begin,
                    int64_t kv_end, float* o, float* lse) {
  RowAttention<T> attention(problem);
  KVRows<T> kv;
  gather_kv_rows(problem, request, kv_head, kv_begin, kv_end, kv);
  if constexpr (std::is_same_v<T, float>) {
    attention.attend(request, kv_head, row_begin, row_end, kv, o, lse);
  } else {
    const int64_t rows = row_end - row_begin;
    const int64_t head_dim_vo = flare::head_dim_vo(problem.kv);
    std::vector<T> o_wide(static_cast<size_t>(rows * head_dim_vo));
    std::vector<T> lse_wide(static_cast<size_t>(rows));
    attention.attend(request, kv_head, row_begin, row_end, kv, o_wide.data(), lse_wide.data());
    std::transform(o_wide.begin(), o_wide.end(), o, [](T x) { return static_cast<float>(x); });
    if (lse != nullptr && problem.params.use_softmax) {
      std::transform(lse_wide.begin(), lse_wide.end(), lse,
                     [](T x) { return static_cast<float>(x); });
    }
  }
}

struct RowBlock {
  int64_t request;
  int64_t kv_head;
  int64_t row_begin;
  int64_t row_end;
};

std::vector<RowBlock> row_blocks(const AttentionProblem& problem, const HeadGeometry& heads) {
  std::vector<RowBlock> blocks;
  const int64_t batch = ragged_batch(problem.qo_indptr);
  for (int64_t request = 0; request < batch; ++request) {
    const int64_t rows = ragged_length(problem.qo_indptr, request) * heads.group;
    for (int64_t kv_head = 0; kv_head < heads.num_kv_heads; ++kv_head) {
      for (int64_t begin = 0; begin < rows; begin += kRowsPerTask) {
        blocks.push_back({request, kv_head, begin, std::min(rows, begin + kRowsPerTask)});
      }
    }
  }
  return blocks;
}

// One thread's share of reference_attention: takes blocks from `next` until none is left.
// K/V rows of a (request, KV head) are converted once and kept while blocks of it follow.
// Every row is computed the same way whichever thread takes it, so the output does not
// depend on the number of threads.
template <class T>
void attend_blocks(const AttentionProblem& problem, const AttentionOutput& out,
                   const std::vector<RowBlock>& blocks, std::atomic<size_t>& next) {
  const HeadGeometry heads = reference_detail::head_geometry(problem);
  RowAttention<T> attention(problem);
  KVRows<T> kv;
  int64_t kv_request = -1;
  int64_t kv_head = -1;
  std::vector<T> o_rows(static_cast<size_t>(kRowsPerTask * heads.head_dim_vo));
  std::vector<T> lse_rows(static_cast<size_t>(kRowsPerTask));
  std::vector<float> o_row(static_cast<size_t>(heads.head_dim_vo));
  const TensorView& o = out.o;
  for (size_t i = next++; i < blocks.size(); i = next++) {
    const RowBlock& block = blocks[i];
    const RequestGeometry request = request_geometry(problem, block.request);
    if (block.request != kv_request || block.kv_head != kv_head) {
      gather_kv_rows(problem, request, block.kv_head, 0, request.kv_len, kv);
      kv_request = block.request;
      kv_head = block.kv_head;
    }
    attention.attend(request, block.kv_head, block.row_begin, block.row_end, kv, o_rows.data(),
                     lse_rows.data());
    for (int64_t row = block.row_begin; row < block.row_end; ++row) {
      const int64_t local = row - block.row_begin;
      const int64_t token = request.q_begin + row / heads.group;
      const int64_t qo_head = block.kv_head * heads.group + row % heads.group;
      const T* values = &o_rows[static_cast<size_t>(local * heads.head_dim_vo)];
      std::transform(values, values + heads.head_dim_vo, o_row.begin(),
                     [](T x) { return static_cast<float>(x); });
      reference_detail::store_elements(o.data, o.dtype,
                                       token * o.strides[0] + qo_head * o.strides[1], o.strides[2],
                                       heads.head_dim_vo, o_row.data());
      if (out.lse) {
        const TensorView& lse = *out.lse;
        lse.ptr<float>()[token * lse.strides[0] + qo_head * lse.strides[1]] =
            static_cast<float>(lse_rows[static_cast<size_t>(local)]);
      }
    }
  }
}

template <class T>
void run_reference(const AttentionProblem& problem, const AttentionOutput& out, int num_threads) {
  const std::vector<RowBlock> blocks =
      row_blocks(problem, reference_detail::head_geometry(problem));
  std::atomic<size_t> next{0};
  const size_t thread_count = std::min(blocks.size(), static_cast<size_t>(num_threads));
  if (thread_count <= 1) {
    attend_blocks<T>(problem, out, blocks, next);
    return;
  }
  std::exception_ptr failure;
  std::mutex failure_mutex;
  std::vector<std::thread> threads;
  threads.reserve(thread_count);
  for (size_t t = 0; t < thread_count; ++t) {
    threads.emplace_back([&] {
      try {
        attend_blocks<T>(problem, out, blocks, next);
      } catch (...) {
        // Stop the others from taking more blocks; the first failure is rethrown.
        next = blocks.size();
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

void reference_attend_rows(const AttentionProblem& problem, int64_t request, int64_t kv_head,
                           int64_t row_begin, int64_t row_end, int64_t kv_begin, int64_t kv_end,
                           float* o, float* lse, Accumulation accumulation) {
  const int64_t batch = ragged_batch(problem.qo_indptr);
  FLARE_CHECK(request >= 0 && request < batch, ErrorCode::kInvalidArgument,
              "reference_attend_rows: request must be in [0, ", batch, "), got ", request);
  const HeadGeometry heads = reference_detail::head_geometry(problem);
  FLARE_CHECK(kv_head >= 0 && kv_head < heads.num_kv_heads, ErrorCode::kInvalidArgument,
              "reference_attend_rows: kv_head must be in [0, ", heads.num_kv_heads, "), got ",
              kv_head);
  const RequestGeometry geometry = request_geometry(problem, request);
  const int64_t rows = geometry.q_len * heads.group;
  FLARE_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows,
              ErrorCode::kInvalidArgument, "reference_attend_rows: rows [", row_begin, ", ",
              row_end, ") must lie within [0, ", rows, "] (q_len ", geometry.q_len, " x group ",
              heads.group, ") of request ", request);
  FLARE_CHECK(0 <= kv_begin && kv_begin <= kv_end && kv_end <= geometry.kv_len,
              ErrorCode::kInvalidArgument, "reference_attend_rows: KV range [", kv_begin, ", ",
              kv_end, ") must lie within [0, ", geometry.kv_len, "] (kv_len of request ", request,
              ")");
  if (accumulation == Accumulation::kF64) {
    attend_rows_as<double>(problem, geometry, kv_head, row_begin, row_end, kv_begin, kv_end, o,
                           lse);
  } else {
    attend_rows_as<float>(problem, geometry, kv_head, row_begin, row_end, kv_begin, kv_end, o, lse);
  }
}

void reference_attention(const AttentionProblem& problem, const AttentionOutput& out,
                         const ReferenceOptions& options) {
  FLARE_CHECK(options.num_threads >= 0, ErrorCode::kInvalidArgument,
              "ReferenceOptions::num_threads must be >= 0 (0 = all cores), got ",
              options.num_threads);
  validate_attention(problem, out);
  const int num_threads = options.num_threads > 0
                              ? options.num_threads
                              : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  if (options.accumulation == Accumulation::kF64) {
    run_reference<double>(problem, out, num_threads);
  } else {
    run_reference<float>(problem, out, num_threads);
  }
}

}  // namespace flare
