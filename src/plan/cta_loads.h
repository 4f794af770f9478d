// Planner internals: the CTA loads of Algorithm 1 (src/plan/schedule.cpp), the lightest CTA
// and adding a cost to it.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace flare::plan_detail {

// The CTA loads as a tournament tree (a binary min-tree) over 64-bit keys, load << index_bits |
// CTA index: the lightest CTA, ties to the lower index, is the smallest key, at the root, and
// adding a cost is one integer addition to it. nodes[num_ctas + c] is CTA c's key, nodes[p]
// the smaller of nodes[2p] and nodes[2p + 1]. An update walks the leaf's path to the root once
// with the siblings' keys, which do not depend on each other: the loads issue together and the
// chain is one min per level. A 3-ary heap's sift-down chains a load, two compares and the
// next load per level: the planner took 12-15% longer with it (decode batch 256 on 528 CTAs,
// interleaved runs of flare plan-latency).
// While some CTAs still share the round's base load (0 at first) and every other CTA is above
// it, the lightest is the lowest such CTA, so positive costs go to CTAs 0, 1, 2, ... in order
// and no tree is kept (decode batch 64 on 528 CTAs: about two thirds of all assignments). A
// round ends once every CTA has a cost above the base: when all loads are then equal (alike
// chunks, one each), the next round starts from that load, else the tree is built (NVFP4 b64
// q1 kv2048 on 396 CTAs: two rounds, 792 of 908 assignments, docs/perf.md).
class CtaLoads {
 public:
  CtaLoads(int num_ctas, std::vector<uint64_t>& nodes)
      : index_bits_(num_ctas > 1 ? std::bit_width(static_cast<uint32_t>(num_ctas - 1)) : 0),
        size_(static_cast<size_t>(num_ctas)),
        nodes_(nodes) {
    nodes_.assign(2 * size_, std::numeric_limits<uint64_t>::max());
  }

  int index_bits() const { return index_bits_; }
  int32_t lightest() const {
    return static_cast<int32_t>(filling() ? loaded_ : root_ & index_mask());
  }
  uint64_t lightest_load() const { return filling() ? base_ : root_ >> index_bits_; }

  // Adds `cost` to the lightest CTA.
  void add_to_lightest(uint64_t cost) {
    uint64_t* const nodes = nodes_.data();
    if (filling()) {
      if (cost == 0) return;  // the CTA keeps the base load and stays the lightest
      nodes[size_ + loaded_] = (base_ + cost) << index_bits_ | loaded_;
      if (++loaded_ == size_) end_round();
      return;
    }
    uint64_t key = root_ + (cost << index_bits_);
    size_t node = size_ + (key & index_mask());
    nodes[node] = key;
    for (; node > 1; node >>= 1) {
      key = std::min(key, nodes[node ^ 1]);
      nodes[node >> 1] = key;
    }
    root_ = key;
  }

  // Load of every CTA, in cost units.
  void loads(std::vector<uint64_t>& out) const {
    out.assign(size_, base_);
    const size_t keys = filling() ? loaded_ : size_;
    for (size_t c = 0; c < keys; ++c) out[c] = nodes_[size_ + c] >> index_bits_;
  }

 private:
  uint64_t index_mask() const { return (uint64_t{1} << index_bits_) - 1; }
  bool filling() const { return loaded_ < size_; }

  // Every CTA has a cost above the base: a new round from the common load, or the tree.
  void end_round() {
    const uint64_t* const leaves = nodes_.data() + size_;
    const uint64_t load = leaves[0] >> index_bits_;
    for (size_t c = 1; c < size_; ++c) {
      if (leaves[c] >> index_bits_ != load) {
        build();
        return;
      }
    }
    base_ = load;
    loaded_ = 0;
  }

  void build() {
    uint64_t* const nodes = nodes_.data();
    for (size_t p = size_; p-- > 1;) nodes[p] = std::min(nodes[2 * p], nodes[2 * p + 1]);
    root_ = nodes[1];
  }

  int index_bits_;
  size_t size_;
  size_t loaded_ = 0;  // CTAs above the base while filling: 0 .. loaded_ - 1
  uint64_t base_ = 0;  // the load of CTAs loaded_ .. size_ - 1 while filling
  std::vector<uint64_t>& nodes_;
  uint64_t root_ = 0;  // nodes_[1], kept out of memory: every update starts from it
};

}  // namespace flare::plan_detail
