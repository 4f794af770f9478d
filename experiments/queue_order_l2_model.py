#!/usr/bin/env python3
"""LRU model of L2 hits on K/V for the one-queue order of items covering every KV head
(src/plan/queue.cpp; scripts/prefill_l2_model.py is the per-head original): entry e of the
queue is (item, head) in one of two orders:
  minor      item e / H under head e % H (the kernels' order before the thirty-third session)
  blocked:B  runs of B items, each run head-major: the run's B items under head 0, then head 1...
CTAs take the next entry when they end one and read one KV tile a step (lockstep). Prints the
hit rate of K/V tile reads and the makespan over the ideal (sum of tiles / CTAs).
Shapes: block-sparse (BSR 64 x 64, one pattern for all heads, as FlashInfer's wrapper) and
causal batches in the planner's order (docs/perf.md, thirty-third session). Usage: python3 experiments/queue_order_l2_model.py"""
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
import prefill_l2_model  # noqa: E402  (the LRU of a 50 MB L2 over 64-key K/V tiles)


def block_sparse(length, density, seed=0):
    rng = random.Random(seed)
    blocks = length // 64
    items = []
    for row in range(blocks):
        cols = [c for c in range(blocks) if rng.random() < density] or [row]
        items.append(((0, tuple(cols)), cols))  # (request, kv tiles read)
    return items


def causal(batch, length, tile=128):
    """The planner's order: length class (bit width of the tile count) longest first, then
    request, later rows first."""
    items = [((r, None), list(range((i + 1) * tile // 64)))
             for r in range(batch) for i in reversed(range(length // tile))]
    return sorted(items, key=lambda item: -len(item[1]).bit_length())


def order(n_items, heads, block):
    if block is None:
        return [(e // heads, e % heads) for e in range(n_items * heads)]
    out = []
    for start in range(0, n_items, block):
        b = min(block, n_items - start)
        out += [(start + i, h) for h in range(heads) for i in range(b)]
    return out


def simulate(items, heads, ctas, entries):
    """The queue of (item, head) entries as prefill_l2_model's items, one a queue entry."""
    queue = [((items[i][0][0], h), items[i][1]) for i, h in entries]
    position = iter(range(len(queue)))
    return prefill_l2_model.simulate(queue, ctas, lambda c: next(position, None))


def main():
    ctas = 132
    shapes = [("block-sparse 16384 d0.9 h32", block_sparse(16384, 0.9), 32),
              ("block-sparse 16384 d0.1 h32", block_sparse(16384, 0.1), 32),
              ("block-sparse 8192 d0.9 h32", block_sparse(8192, 0.9), 32),
              ("causal b16 1024 h16", causal(16, 1024), 16),
              ("causal b4 1024 h32", causal(4, 1024), 32),
              ("causal b1 16384 h16", causal(1, 16384), 16)]
    for name, items, heads in shapes:
        for block in (None, 32, 132, 264, 1 << 30):
            hit, span = simulate(items, heads, ctas, order(len(items), heads, block))
            label = "minor" if block is None else f"blocked:{block if block < 1 << 30 else 'all'}"
            print(f"{name:30s} {label:14s} hits {100 * hit:5.1f}%  makespan {span:.3f}")


if __name__ == "__main__":
    main()
