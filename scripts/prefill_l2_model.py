# LRU model of L2 hits on K/V for the prefill kernel's work order (docs/perf.md, prefill v2):
# causal batch x heads requests of one length, 128-row items against all keys up to their
# diagonal (an item: its (request, head) key and the KV tiles it reads), 64-key tiles, CTAs that each read one tile per step. Compares the planner's
# longest-first order (static queues, LPT) with one queue ordered as BatchPrefill::plan does
# (length class, then request and head). Usage: python3 scripts/prefill_l2_model.py 4096
import heapq
import sys
from collections import OrderedDict

QUERY_TILE, KV_TILE, TILE_BYTES = 128, 64, 64 * 128 * 2 * 2  # K and V rows of one tile
L2_BYTES = 50e6


def items_for(seq, batch=16, heads=16):
    return [((r, h), range((i + 1) * QUERY_TILE // KV_TILE))
            for r in range(batch) for h in range(heads) for i in range(seq // QUERY_TILE)]


def static_queues(items, ctas):  # the planner: longest first to the least-loaded CTA
    queues, heap = [[] for _ in range(ctas)], [(0, c) for c in range(ctas)]
    for i in sorted(range(len(items)), key=lambda i: (-len(items[i][1]), items[i][0], i)):
        load, c = heapq.heappop(heap)
        queues[c].append(i)
        heapq.heappush(heap, (load + len(items[i][1]), c))
    return lambda c: queues[c].pop(0) if queues[c] else None


def one_queue(items):  # BatchPrefill::plan's order, taken by whichever CTA is free
    order = sorted(range(len(items)),
                   key=lambda i: (-len(items[i][1]).bit_length(), items[i][0], -len(items[i][1])))
    position = iter(order)
    return lambda c: next(position, None)


def simulate(items, ctas, take):
    capacity = int(L2_BYTES / TILE_BYTES)
    lru, hits, reads, steps = OrderedDict(), 0, 0, 0
    state = {c: [i, 0] for c in range(ctas) if (i := take(c)) is not None}
    while state:
        for c, (i, j) in list(state.items()):
            key = (items[i][0], items[i][1][j])
            reads += 1
            if key in lru:
                hits += 1
                lru.move_to_end(key)
            else:
                lru[key] = True
                if len(lru) > capacity:
                    lru.popitem(last=False)
            state[c][1] += 1
            if state[c][1] >= len(items[i][1]):
                following = take(c)
                if following is None:
                    del state[c]
                else:
                    state[c] = [following, 0]
        steps += 1
    ideal = sum(len(tiles) for _, tiles in items) / ctas
    return hits / reads, steps / ideal


if __name__ == "__main__":
    seq = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    ctas = int(sys.argv[2]) if len(sys.argv) > 2 else 264
    items = items_for(seq)
    for name, take in [("planner order", static_queues(items, ctas)), ("one queue", one_queue(items))]:
        hit, makespan = simulate(items, ctas, take)
        print(f"seq {seq} {name:14s} K/V tile hits {hit:.3f}  makespan / ideal {makespan:.3f}")
