#!/usr/bin/env python3
"""Top stall sites of a kernel from `ncu -i REPORT --page source --csv --print-source sass`
(experiments/ncu_small_item_stalls.sh): the SASS lines with the most warp-stall samples, with
their share, and the sampled total. Column names vary across ncu versions: the sample column is
the first whose name starts with "Warp Stall Sampling (All"; every column is listed first.
Usage: python3 experiments/ncu_small_item_stalls.py SOURCE.csv [top]"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path, top = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # skip ncu's banner lines
    # ncu 2025+ prints a "Kernel Name" row before the column header.
    header = next((i for i, line in enumerate(lines) if line.startswith('"Address"')), 0)
    lines = lines[header:]
    rows = list(csv.DictReader(lines))
    if not rows:
        print(f"{path}: no rows")
        return
    columns = list(rows[0].keys())
    print("columns:", ", ".join(c for c in columns if c))
    samples = next((c for c in columns if c.startswith("Warp Stall Sampling (All")), None)
    if samples is None:
        print("no stall-sampling column")
        return
    total = sum(number(r[samples]) for r in rows) or 1.0
    source = next((c for c in columns if c.lower() == "source"), columns[1])
    address = next((c for c in columns if c.lower() == "address"), columns[0])
    print(f"{samples}: {total:.0f} samples over {len(rows)} lines")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:top]:
        print(f"{100 * number(r[samples]) / total:5.1f}%  {r[address]}  {r[source].strip()}")


if __name__ == "__main__":
    main()
