#!/usr/bin/env python3
"""LRU model of L2 hits on K/V for the one-queue order of items covering every KV head
(src/plan/queue.cpp; scripts/prefill_l2_model.py is the per-head original): entry e of the
queue is (item, head) in one of two orders:
  minor      item e / H under head e % H (the kernels' order before the thirty-third session)
  blocked:B  runs of B items, each run head-major: the run's B items under head 0, then head 1...
CTAs take the next entry when they end one and read one KV tile a step (lockstep). Prints the
hit rate of K/V tile reads and the makespan over the ideal (sum of tiles / CTAs).
Shapes: block-sparse (BSR 64 x 64, one pattern for all heads, as FlashInfer's wrapper) and
causal batches. Usage: python3 experiments/queue_order_l2_model.py"""
import random
from collections import OrderedDict

TILE_BYTES = 64 * 128 * 2 * 2  # K and V rows of one 64-key tile, D 128, 16-bit
L2_BYTES = 50e6


def block_sparse(length, density, seed=0):
    rng = random.Random(seed)
    blocks = length // 64
    items = []
    for row in range(blocks):
        cols = [c for c in range(blocks) if rng.random() < density] or [row]
        items.append(((0, tuple(cols)), cols))  # (request, kv tiles read)
    return items


def causal(batch, length, tile=128):
    return [((r, None), list(range((i + 1) * tile // 64)))
            for r in range(batch) for i in reversed(range(length // tile))]


def order(n_items, heads, block):
    if block is None:
        return [(e // heads, e % heads) for e in range(n_items * heads)]
    out = []
    for start in range(0, n_items, block):
        b = min(block, n_items - start)
        out += [(start + i, h) for h in range(heads) for i in range(b)]
    return out


def simulate(items, heads, ctas, entries):
    capacity = int(L2_BYTES / TILE_BYTES)
    lru, hits, reads, steps = OrderedDict(), 0, 0, 0
    queue = iter(entries)
    state = {}
    for c in range(ctas):
        e = next(queue, None)
        if e is not None:
            state[c] = [e, 0]
    while state:
        for c, (e, j) in list(state.items()):
            item, head = e
            (request, _), tiles = items[item]
            key = (request, head, tiles[j])
            reads += 1
            if key in lru:
                hits += 1
                lru.move_to_end(key)
            else:
                lru[key] = True
                if len(lru) > capacity:
                    lru.popitem(last=False)
            state[c][1] += 1
            if state[c][1] >= len(tiles):
                following = next(queue, None)
                if following is None:
                    del state[c]
                else:
                    state[c] = [following, 0]
        steps += 1
    ideal = heads * sum(len(t) for _, t in items) / ctas
    return hits / reads, steps / ideal


def main():
    ctas = 132
    shapes = [("block-sparse 16384 d0.9 h32", block_sparse(16384, 0.9), 32),
              ("block-sparse 16384 d0.1 h32", block_sparse(16384, 0.1), 32),
              ("block-sparse 8192 d0.9 h32", block_sparse(8192, 0.9), 32),
              ("causal b16 1024 h16", causal(16, 1024), 16),
              ("causal b1 16384 h16", causal(1, 16384), 16)]
    for name, items, heads in shapes:
        for block in (None, 32, 132, 264, 1 << 30):
            hit, span = simulate(items, heads, ctas, order(len(items), heads, block))
            label = "minor" if block is None else f"blocked:{block if block < 1 << 30 else 'all'}"
            print(f"{name:30s} {label:14s} hits {100 * hit:5.1f}%  makespan {span:.3f}")


if __name__ == "__main__":
    main()
