// What `flare bench` measured and how it is shown: a table for people, one JSON object for
// machines. Throughputs derive from the median call time.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/flare/bench_check.h"
#include "tools/flare/workload.h"

namespace flare::cli {

struct BenchResult {
  WorkloadSpec spec;
  std::string device;
  int64_t total_q = 0;
  int64_t total_kv = 0;
  int64_t kv_len_min = 0;
  int64_t kv_len_max = 0;
  int64_t kv_tokens_read = 0;  // Workload::kv_tokens_read
  int64_t visible_pairs = 0;   // Workload::visible_pairs
  double plan_seconds = 0;
  int num_ctas = 0;
  int64_t num_work_items = 0;
  std::vector<double> call_seconds;  // every timed call, in order
  SampleCheck check;

  double median_seconds() const;
  double min_seconds() const;
  double kv_bytes_per_call() const;  // K and V bytes a kernel must read
  double flop_per_call() const;      // 2 * pairs * H_qo * (D_qk + D_vo)
};

void print_table(std::FILE* out, const BenchResult& result);
void print_json(std::FILE* out, const BenchResult& result);

}  // namespace flare::cli
