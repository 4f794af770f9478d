#!/usr/bin/env python3
"""One line per case of a decode benchmark result (tests/gpu/decode_bench_test.cpp JSON lines),
prefixed with a label: what scripts/decode_ab.sh and decode_knob_scan.sh print per run."""
import json
import sys

path, label = sys.argv[1], sys.argv[2]
for line in open(path):
    r = json.loads(line)
    print(f"{label:44s} {r['case']:26s} {r['median_us']:8.1f} us {r['tbps']:6.3f} TB/s"
          f"  ctas {r['num_ctas']} items {r['work_items']} merges {r['merge_items']}")
