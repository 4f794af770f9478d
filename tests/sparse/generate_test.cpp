// The seeded graph generators: valid CSR with exactly the asked edges, the same graph for the
// same seed, R-MAT's power-law degrees (a hub far above the mean), uniform degrees near it.
#include "flare/sparse/generate.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "flare/sparse/coo.h"
#include "flare/sparse/csr.h"
#include "testing/expect_error.h"

namespace flare {
namespace {

// A copy of the graph's pattern (no values); view() it within one expression.
sparse::CsrStorage storage_of(const sparse::CsrGraph& g) {
  return {g.nodes, g.nodes, g.indptr, g.indices, {}};
}

int64_t max_degree(const sparse::CsrGraph& g) {
  int64_t most = 0;
  for (int64_t r = 0; r < g.nodes; ++r)
    most = std::max<int64_t>(most, g.indptr[r + 1] - g.indptr[r]);
  return most;
}

TEST(SparseGenerate, RmatIsValidDeterministicAndSkewed) {
  const sparse::CsrGraph g = sparse::rmat_graph(10000, 80000, 7);
  EXPECT_EQ(g.indices.size(), 80000u);
  EXPECT_NO_THROW(sparse::validate_csr(storage_of(g).view()));
  const sparse::CsrGraph again = sparse::rmat_graph(10000, 80000, 7);
  EXPECT_EQ(again.indices, g.indices);
  EXPECT_EQ(again.indptr, g.indptr);
  EXPECT_NE(sparse::rmat_graph(10000, 80000, 8).indices, g.indices);
  EXPECT_GT(max_degree(g), 20 * 8);  // mean degree 8: a power-law hub
}

TEST(SparseGenerate, UniformDegreesStayNearTheMean) {
  const sparse::CsrGraph g = sparse::uniform_graph(5000, 100000, 3);
  EXPECT_EQ(g.indices.size(), 100000u);
  EXPECT_NO_THROW(sparse::validate_csr(storage_of(g).view()));
  EXPECT_LT(max_degree(g), 3 * 20);  // mean 20
}

TEST(SparseGenerate, ArgumentsAreChecked) {
  EXPECT_FLARE_ERROR(sparse::rmat_graph(0, 0, 1), ErrorCode::kInvalidArgument,
                     "nodes must be in [1, 2^31)");
  EXPECT_FLARE_ERROR(sparse::uniform_graph(10, 51, 1), ErrorCode::kInvalidArgument,
                     "edges must be in [0, nodes^2 / 2], got 51 for 10 nodes");
  EXPECT_FLARE_ERROR(sparse::rmat_graph(10, 5, 1, 0.5, 0.3, 0.3), ErrorCode::kInvalidArgument,
                     "a + b + c < 1");
}

}  // namespace
}  // namespace flare
