"""GPU time per call of an eager function, shared by the experiments' benchmarks: CUDA events
around `repeats` back-to-back calls after a warm-up call, median of `rounds`, in microseconds."""

import statistics

import torch


def time_runs(fn, repeats=20, rounds=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return statistics.median(times)
