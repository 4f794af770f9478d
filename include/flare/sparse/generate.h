// Seeded synthetic graphs for the sparse benchmarks (issue 23 "Data"): R-MAT (Chakrabarti et
// al. 2004), whose degrees follow a power law like the dissertation's arxiv and reddit graphs,
// and a near-uniform graph like ogbn-proteins. Deterministic for a seed on every platform (a
// 64-bit splitmix generator, no std:: distributions).
#pragma once

#include <cstdint>
#include <vector>

namespace flare::sparse {

// An owned CSR graph: row = source node, sorted unique columns = destinations, values 1.
struct CsrGraph {
  int64_t nodes = 0;
  std::vector<int32_t> indptr;   // [nodes + 1]
  std::vector<int32_t> indices;  // [edges]
  std::vector<float> values;     // [edges], all 1
};

// R-MAT with `edges` distinct edges (self loops allowed) on `nodes` nodes: each edge descends
// the adjacency matrix's quadrants with probabilities a, b, c, 1 - a - b - c (defaults:
// Graph500's 0.57, 0.19, 0.19); nodes need not be a power of two (edges drawn outside are
// redrawn). Throws kInvalidArgument for nodes < 1, edges > nodes^2 / 2 or bad probabilities.
CsrGraph rmat_graph(int64_t nodes, int64_t edges, uint64_t seed, double a = 0.57, double b = 0.19,
                    double c = 0.19);

// `edges` distinct edges drawn uniformly (every node's degree near edges / nodes).
CsrGraph uniform_graph(int64_t nodes, int64_t edges, uint64_t seed);

}  // namespace flare::sparse
