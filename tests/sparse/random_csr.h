// Random CSR matrices for the sparse tests: empty rows, one very long row (a share of every
// nonzero), sorted unique columns, float32 values; owned host storage and a Csr view of it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

#include "flare/sparse/coo.h"
#include "flare/sparse/csr.h"
#include "testing/random.h"

namespace flare::sparse_testing {

// Host-owned CSR (its view() has values when it holds any, or no nonzeros).
using OwnedCsr = sparse::CsrStorage;

// rows x cols with about `density` of the entries set; every fourth row empty; when
// long_row_share > 0, row rows / 2 holds that share of the nonzeros (capped at cols).
inline OwnedCsr random_csr(int64_t rows, int64_t cols, double density, double long_row_share,
                           uint64_t seed) {
  testing::Rng rng(seed);
  OwnedCsr a;
  a.rows = rows;
  a.cols = cols;
  a.indptr.push_back(0);
  const int64_t expected = static_cast<int64_t>(density * static_cast<double>(rows * cols));
  const int64_t long_count =
      std::min<int64_t>(cols, static_cast<int64_t>(long_row_share * static_cast<double>(expected)));
  for (int64_t r = 0; r < rows; ++r) {
    std::set<int32_t> columns;
    int64_t count =
        r % 4 == 3
            ? 0
            : rng.uniform_int(0, std::max<int64_t>(1, 2 * expected / std::max<int64_t>(rows, 1)));
    if (long_row_share > 0 && r == rows / 2) count = long_count;
    count = std::min(count, cols);
    while (static_cast<int64_t>(columns.size()) < count) {
      columns.insert(static_cast<int32_t>(rng.uniform_int(0, cols - 1)));
    }
    for (const int32_t c : columns) {
      a.indices.push_back(c);
      a.values.push_back(static_cast<float>(rng.normal()));
    }
    a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
  }
  return a;
}

// A float32 [rows, d] host tensor of standard normal values.
inline HostTensor random_dense(int64_t rows, int64_t d, uint64_t seed) {
  testing::Rng rng(seed);
  HostTensor t(DType::kF32, {rows, d});
  for (int64_t i = 0; i < rows * d; ++i) t.data<float>()[i] = static_cast<float>(rng.normal());
  return t;
}

}  // namespace flare::sparse_testing
