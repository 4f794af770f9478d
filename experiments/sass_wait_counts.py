#!/usr/bin/env python3
"""Which wait loops of a kernel spin: from ncu's SASS source page (experiments/ncu_hopper_vs_fa3.sh
NCU_SASS=1 writes it as flare_sass.csv), the executed count of every mbarrier try_wait
(SYNCS.PHASECHK) and named-barrier (BAR) line, with its address, largest first, and the kernel's
totals of SYNCS and BRA executions. A try_wait executed far more often than the tiles it guards
is a spinning loop; its address in the SASS (nvdisasm of experiments/dump_prefill_cubin.cpp's
cubin, or the csv itself) says whose: the producer's `empty` waits or the consumers' `full` ones.
Usage: python3 experiments/sass_wait_counts.py flare_sass.csv [top]
"""
import csv
import sys


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 25
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, row in enumerate(rows) if any("Source" in c for c in row))
    header = rows[header_at]
    source = next(i for i, c in enumerate(header) if c.strip() == "Source")
    address = next((i for i, c in enumerate(header) if "Address" in c), None)
    executed = next(i for i, c in enumerate(header) if c.strip().startswith("Instructions Executed"))
    waits, totals = [], {"SYNCS": 0.0, "BRA": 0.0, "all": 0.0}
    for row in rows[header_at + 1:]:
        if len(row) <= max(source, executed):
            continue
        count = number(row[executed])
        if count is None:
            continue
        text = row[source].strip()
        opcode = text.lstrip("@!P0123456789T ").split(" ")[0]
        totals["all"] += count
        for key in ("SYNCS", "BRA"):
            if opcode.startswith(key):
                totals[key] += count
        if opcode.startswith("SYNCS.PHASECHK") or opcode.startswith("BAR."):
            waits.append((count, row[address] if address is not None else "?", text))
    print(f"executed: all {totals['all']:,.0f}, SYNCS {totals['SYNCS']:,.0f}, "
          f"BRA {totals['BRA']:,.0f}")
    for count, where, text in sorted(waits, reverse=True)[:top]:
        print(f"{count:>14,.0f}  {where}  {text}")


if __name__ == "__main__":
    main()
