// Seeded synthetic graphs (flare/sparse/generate.h).
#include "flare/sparse/generate.h"

#include <algorithm>
#include <cmath>

#include "flare/core/error.h"

namespace flare::sparse {
namespace {

// splitmix64: a fixed sequence for a seed on every platform.
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
};

void check_size(int64_t nodes, int64_t edges, const char* what) {
  FLARE_CHECK(nodes >= 1 && nodes < (int64_t{1} << 31), ErrorCode::kInvalidArgument, what,
              ": nodes must be in [1, 2^31), got ", nodes);
  FLARE_CHECK(edges >= 0 && static_cast<double>(edges) <=
                                static_cast<double>(nodes) * static_cast<double>(nodes) / 2,
              ErrorCode::kInvalidArgument, what, ": edges must be in [0, nodes^2 / 2], got ", edges,
              " for ", nodes, " nodes");
}

// Sorted, deduplicated (source, destination) keys -> CSR; draws until `edges` distinct keys.
template <class Draw>
CsrGraph build(int64_t nodes, int64_t edges, Draw draw) {
  std::vector<uint64_t> keys;
  keys.reserve(static_cast<size_t>(edges));
  while (static_cast<int64_t>(keys.size()) < edges) {
    const int64_t missing = edges - static_cast<int64_t>(keys.size());
    for (int64_t i = 0; i < missing + missing / 8 + 16; ++i) {
      const auto [src, dst] = draw();
      keys.push_back(static_cast<uint64_t>(src) << 32 | static_cast<uint64_t>(dst));
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  }
  // Drop the surplus deterministically: every k-th key, spread over the graph.
  while (static_cast<int64_t>(keys.size()) > edges) {
    const size_t surplus = keys.size() - static_cast<size_t>(edges);
    const size_t stride = keys.size() / surplus;
    std::vector<uint64_t> kept;
    kept.reserve(static_cast<size_t>(edges));
    size_t dropped = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (dropped < surplus && i % stride == stride - 1) {
        ++dropped;
        continue;
      }
      kept.push_back(keys[i]);
    }
    keys.swap(kept);
  }
  CsrGraph g;
  g.nodes = nodes;
  g.indptr.assign(static_cast<size_t>(nodes + 1), 0);
  for (const uint64_t key : keys) {
    ++g.indptr[static_cast<size_t>(key >> 32) + 1];
    g.indices.push_back(static_cast<int32_t>(key & 0xffffffffu));
  }
  for (int64_t r = 0; r < nodes; ++r) g.indptr[r + 1] += g.indptr[r];
  g.values.assign(g.indices.size(), 1.0f);
  return g;
}

}  // namespace

CsrGraph rmat_graph(int64_t nodes, int64_t edges, uint64_t seed, double a, double b, double c) {
  check_size(nodes, edges, "rmat_graph");
  FLARE_CHECK(a > 0 && b >= 0 && c >= 0 && a + b + c < 1, ErrorCode::kInvalidArgument,
              "rmat_graph: a > 0, b, c >= 0 and a + b + c < 1 needed, got ", a, ", ", b, ", ", c);
  int levels = 0;
  while ((int64_t{1} << levels) < nodes) ++levels;
  SplitMix rng{seed};
  return build(nodes, edges, [&]() {
    for (;;) {
      int64_t src = 0, dst = 0;
      for (int l = 0; l < levels; ++l) {
        const double u = rng.uniform();
        const int quadrant = u < a ? 0 : u < a + b ? 1 : u < a + b + c ? 2 : 3;
        src = src << 1 | (quadrant >> 1);
        dst = dst << 1 | (quadrant & 1);
      }
      if (src < nodes && dst < nodes) return std::pair{src, dst};
    }
  });
}

CsrGraph uniform_graph(int64_t nodes, int64_t edges, uint64_t seed) {
  check_size(nodes, edges, "uniform_graph");
  SplitMix rng{seed};
  return build(nodes, edges, [&]() {
    const auto pick = [&] {
      return static_cast<int64_t>(rng.next() % static_cast<uint64_t>(nodes));
    };
    const int64_t src = pick();
    return std::pair{src, pick()};
  });
}

}  // namespace flare::sparse
