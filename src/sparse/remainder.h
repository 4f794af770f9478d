// The CSR remainder shared by the decompositions (hyb.cpp, bsr.cpp): appending a row of A's
// nonzeros to it, and visiting its nonzeros.
#pragma once

#include <cstdint>

#include "flare/sparse/hyb.h"
#include "src/sparse/dense_access.h"

namespace flare::sparse_detail {

// Appends row `row` holding A's nonzeros `nonzeros` (indices into A, in column order).
template <class Nonzeros>
void append_remainder_row(const sparse::Csr& a, int32_t row, const Nonzeros& nonzeros,
                          sparse::CsrRemainder& rest) {
  rest.rows.push_back(row);
  for (const int64_t e : nonzeros) {
    rest.columns.push_back(index_at(a.indices, e));
    rest.values.push_back(load(*a.values, e));
    rest.source.push_back(e);
  }
  rest.indptr.push_back(static_cast<int64_t>(rest.columns.size()));
}

// add(row, column, value) for every nonzero of the remainder.
template <class Add>
void for_each_remainder_nonzero(const sparse::CsrRemainder& rest, Add add) {
  for (size_t i = 0; i < rest.rows.size(); ++i) {
    for (int64_t e = rest.indptr[i]; e < rest.indptr[i + 1]; ++e) {
      add(rest.rows[i], rest.columns[static_cast<size_t>(e)], rest.values[static_cast<size_t>(e)]);
    }
  }
}

}  // namespace flare::sparse_detail
