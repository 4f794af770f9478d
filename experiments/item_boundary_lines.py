#!/usr/bin/env python3
"""Stall samples of one ncu SourceCounters profile by kernel source line (issue 19 experiment, not
a user script; experiments/item_boundary_profile.sh makes both inputs).

Inputs: the SASS page of the report as CSV (`ncu -i R --page source --csv --print-source sass`:
each instruction's address and "Warp Stall Sampling (All Samples)") and the same cubin's
disassembly with line info (`nvdisasm -g -c`, the kernel compiled with FLARE_JIT_LINEINFO=1; no
GPU needed: PyPI's nvidia-cuda-nvdisasm, and NVRTC here makes the device's cubin, so
experiments/hopper_spill_probe.cpp with FLARE_PROBE_CUBINS gives it too). The nth instruction of
the CSV is the nth of the disassembly (the script checks the counts and the opcodes).

Prints the samples of the consumer and the producer warps (split at the producer's register
release, USETMAXREG.DEALLOC, after which the kernel's code is the producer's), then the top
source lines of each with their share.
Usage: experiments/item_boundary_lines.py <sass.csv> <nvdisasm -g output> [top lines, 25]
"""
import csv
import re
import sys
from collections import Counter


def samples_by_instruction(path):
    rows = list(csv.reader(open(path)))
    header_row = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    header = rows[header_row]
    sampled = header.index("Warp Stall Sampling (All Samples)")
    source = header.index("Source")
    out = []
    for r in rows[header_row + 1:]:
        if len(r) <= sampled:
            continue
        out.append((r[source].strip(), int(r[sampled] or 0)))
    return out


def lines_by_instruction(path):
    location = "?"
    out = []
    file_line = re.compile(r'//## File "([^"]+)", line (\d+)')
    instruction = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
    for text in open(path):
        m = file_line.search(text)
        if m:
            location = f"{m.group(1).rsplit('/', 1)[-1]}:{m.group(2)}"
            continue
        m = instruction.search(text)
        if m:
            out.append((m.group(1), location))
    return out


def opcode(text):
    words = [w for w in text.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def main():
    sass = samples_by_instruction(sys.argv[1])
    lines = lines_by_instruction(sys.argv[2])
    top = int(sys.argv[3]) if len(sys.argv) > 3 else 25
    if len(sass) != len(lines):
        sys.exit(f"{len(sass)} profiled instructions against {len(lines)} disassembled: "
                 "not the same cubin")
    mismatched = sum(opcode(a) != opcode(b) for (a, _), (b, _) in zip(sass, lines))
    if mismatched > len(sass) // 100:
        sys.exit(f"{mismatched} opcodes differ: not the same cubin")
    producer_start = next((i for i, (text, _) in enumerate(sass) if "USETMAXREG.DEALLOC" in text),
                          len(sass))
    for role, span in (("consumers", range(0, producer_start)),
                       ("producer", range(producer_start, len(sass)))):
        by_line = Counter()
        for i in span:
            by_line[lines[i][1]] += sass[i][1]
        total = sum(by_line.values())
        print(f"== {role}: {total} samples")
        for location, count in by_line.most_common(top):
            print(f"{count:7d} {100 * count / max(total, 1):5.1f}%  {location}")


if __name__ == "__main__":
    main()
