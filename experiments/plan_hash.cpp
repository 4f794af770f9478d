// The planner's safety net for changes meant to keep plans identical (speed, refactors): a hash
// of every field of the plans of 4,000 random problems (one-queue and per-CTA, all mask kinds,
// page sizes, GQA ratios, options), the same before and after. Modes: `base` (default
// options), `item_cost` (random item costs too), `rates` (random queue_rates too, and batches of
// alike tiles a third of the time). Hashes of main after the thirty-fourth session (Algorithm
// 1 of one-queue plans over head groups): base 36e6f8fd8d72be4a, item_cost 821869d0f7fe73c0,
// rates a4d70fc7c2cea6c7; after the thirty-third (with head_major_queue): fa248745d33c6df1,
// b0b40694fc5ef79c, b386cc5916358609 (without that field, as from the twenty-sixth to the
// thirty-second: 729d81d593d33a56, a2c9df684dd1a310, 247911dc1513eb1a).
// Build here (no GPU): g++ -O2 -std=c++20 -Iinclude -Isrc -I. experiments/plan_hash.cpp
//   -Lbuild -lflare -Wl,-rpath,build -o /tmp/plan_hash && /tmp/plan_hash rates
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "flare/plan/plan.h"

using namespace flare;

namespace {

uint64_t hash = 1469598103934665603ull;  // FNV-1a
void mix(const void* data, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= b[i];
    hash *= 1099511628211ull;
  }
}
template <class T>
void mix_vector(const std::vector<T>& v) {
  const size_t n = v.size();
  mix(&n, sizeof(n));
  if (n > 0) mix(v.data(), n * sizeof(T));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "base";
  if (mode != "base" && mode != "item_cost" && mode != "rates") {
    std::fprintf(stderr, "usage: plan_hash [base|item_cost|rates]\n");
    return 2;
  }
  std::mt19937 rng(12345);
  int with_slots = 0;
  for (int it = 0; it < 4000; ++it) {
    const int batch = 1 + static_cast<int>(rng() % (it % 3 == 0 ? 4 : 128));
    std::vector<int32_t> q(static_cast<size_t>(batch)), kv(static_cast<size_t>(batch));
    const int kind = static_cast<int>(rng() % 4);
    for (int b = 0; b < batch; ++b) {
      q[b] = kind == 0 ? 1 : kind == 1 ? 1 + rng() % 32 : 1 + rng() % 4096;
      kv[b] = q[b] + static_cast<int32_t>(rng() % (kind == 3 ? 65536 : 8192));
    }
    PlanProblem p;
    const int kv_heads = 1 << (rng() % 4);
    const int group = 1 << (rng() % 4);
    p.num_kv_heads = kv_heads;
    p.num_qo_heads = kv_heads * group;
    p.head_dim_qk = p.head_dim_vo = 128;
    p.page_size = 1 << (rng() % 5);
    p.causal = rng() % 2;
    p.window_left = rng() % 8 == 0 ? 1 + static_cast<int>(rng() % 2048) : -1;
    PlanOptions o;
    o.one_queue = rng() % 4 != 0;
    o.kv_tile = 64 << (rng() % 2);
    if (rng() % 3 == 0) o.alpha = 0.5f + static_cast<float>(rng() % 100) / 10.0f;
    if (mode != "base" && rng() % 2 == 0) o.item_cost = static_cast<float>(rng() % 400) * 0.75f;
    if (rng() % 8 == 0) o.fixed_split_size = 256 << (rng() % 4);
    if (rng() % 16 == 0) o.disable_split_kv = true;
    if (!o.one_queue && rng() % 4 == 0) o.waves = 1 + static_cast<int>(rng() % 3);
    if (mode == "rates") {
      if (rng() % 3 == 0) {  // alike tiles: equal lengths, a q1 / q16-like query
        const int32_t q_len = rng() % 2 ? 1 : 16;
        const int32_t kv_len = q_len + static_cast<int32_t>(rng() % 16384);
        std::fill(q.begin(), q.end(), q_len);
        std::fill(kv.begin(), kv.end(), kv_len);
        p.causal = false;
      }
      if (rng() % 4 != 0) {
        o.queue_rates = {10.0 + rng() % 100, 1000.0 + rng() % 20000,
                         static_cast<double>(rng() % 20)};
      }
    }
    p.qo_len = q;
    p.kv_len = kv;
    Plan r;
    try {
      plan(p, {132, 1 + static_cast<int>(rng() % 3)}, o, r);
    } catch (...) {
      mix("E", 1);
      continue;
    }
    mix(&r.num_ctas, sizeof(r.num_ctas));
    mix(&r.query_tile, sizeof(r.query_tile));
    mix(&r.kv_chunk, sizeof(r.kv_chunk));
    mix(&r.num_partial_slots, sizeof(r.num_partial_slots));
    mix(&r.item_heads, sizeof(r.item_heads));
    mix(&r.head_major_queue, sizeof(r.head_major_queue));
    mix_vector(r.cta_indptr);
    mix_vector(r.work_items);
    mix_vector(r.merge_indptr);
    mix_vector(r.merge_items);
    mix_vector(r.merge_slots);
    mix_vector(r.cta_cost);
    with_slots += r.num_partial_slots > 0;
  }
  std::printf("%s hash %016llx (plans with slots %d)\n", mode.c_str(),
              static_cast<unsigned long long>(hash), with_slots);
  return 0;
}
