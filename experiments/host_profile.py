#!/usr/bin/env python3
"""Where a wrapper's run() (or, with --plan, plan()) host time goes (issue 17 experiment):
scripts/bench_host.py's cases (flare only) under cProfile, 300 back-to-back calls after a
warm-up, the functions with the most own time (an extension call's time counts as its Python
caller's own time). Usage: python3 experiments/host_profile.py [--plan] [substring of case
names ...]"""
import cProfile
import pstats
import sys

import torch

import flare
from bench_host import CASES, WORKSPACE_BYTES


def main():
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    profile_plan = "--plan" in sys.argv[1:]
    wanted = [a for a in sys.argv[1:] if a != "--plan"]
    for name, make in CASES.items():
        if wanted and not any(w in name for w in wanted):
            continue
        plan, run = make(flare, workspace)
        if plan is not None:
            plan()
        if profile_plan:
            if plan is None:
                continue
            run = plan  # plan() is what gets timed below
        for _ in range(20):
            run()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(300):
            run()
        profile.disable()
        torch.cuda.synchronize()
        print(f"=== {name}{' plan()' if profile_plan else ''}: per call, own time (tottime / "
              "300), top 10")
        stats = pstats.Stats(profile)
        rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:10]
        for (file, line, func), (cc, nc, tt, ct, _) in rows:
            print(f"  {tt / 300 * 1e6:7.2f} us own {ct / 300 * 1e6:7.2f} cum  {nc // 300:3d}x  "
                  f"{func} ({file.split('/')[-1]}:{line})")


if __name__ == "__main__":
    main()
