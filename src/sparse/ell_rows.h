// ELL rows shared by the standalone ELL format (ell.cpp) and hyb's buckets (hyb.cpp):
// appending a run of A's nonzeros as one padded row, and visiting every slot.
#pragma once

#include <cstdint>

#include "flare/sparse/hyb.h"
#include "src/sparse/dense_access.h"

namespace flare::sparse_detail {

// Appends row `row` holding A's nonzeros [begin, end) (end - begin <= width) to `ell`, padded
// to its width. Padding reads a column the row already reads (its last; column 0 for an empty
// row, which needs cols > 0), with weight 0 and source -1: a kernel never branches on it.
inline void append_ell_row(const sparse::Csr& a, int32_t row, int64_t begin, int64_t end,
                           sparse::EllBucket& ell) {
  ell.rows.push_back(row);
  const int32_t pad_column = end > begin ? index_at(a.indices, end - 1) : 0;
  for (int64_t s = 0; s < ell.width; ++s) {
    const int64_t e = begin + s;
    if (e < end) {
      ell.columns.push_back(index_at(a.indices, e));
      ell.values.push_back(a.values ? load(*a.values, e) : 0.0);
      ell.source.push_back(e);
    } else {
      ell.columns.push_back(pad_column);
      ell.values.push_back(0.0);
      ell.source.push_back(-1);
    }
  }
}

// add(row, column, value) for every slot of `ell`, padding included (its weight is 0).
template <class Add>
void for_each_ell_slot(const sparse::EllBucket& ell, Add add) {
  for (size_t i = 0; i < ell.rows.size(); ++i) {
    for (int s = 0; s < ell.width; ++s) {
      const size_t slot = i * static_cast<size_t>(ell.width) + static_cast<size_t>(s);
      add(ell.rows[i], ell.columns[slot], ell.values[slot]);
    }
  }
}

}  // namespace flare::sparse_detail
