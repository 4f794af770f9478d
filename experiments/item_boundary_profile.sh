#!/usr/bin/env bash
# Where the Hopper family's time goes between work items (issue 19: causal L 1024 at 0.78x
# cuDNN; issue 18: the document mask at 2048; issue 20: block-sparse at density 0.1 — all runs of
# short items). Three parts, one device call:
#   1. tiles: C++ bench_prefill's ragged / paged causal rows at query tile 128 (auto) and 64, and
#      with a left window of FLARE_PROFILE_WINDOW (default 256) keys: short items of 2-3 KV
#      tiles, as the document mask's (TFLOP/s count the causal FLOPs: compare rows, not rates);
#   2. ncu of the ragged causal L 1024 launch with per-SASS-instruction stall samples
#      (SourceCounters), the kernel compiled with -lineinfo (FLARE_JIT_LINEINFO=1); another of
#      bench_prefill's rows with FLARE_PROFILE_SHAPE (e.g. "causal b16 seq 4096"), and its
#      FLARE_BENCH_* settings pass through (FLARE_BENCH_SOFT_CAP=30: the soft-cap kernel; the
#      report's files keep the l1024 names);
#   3. that cubin's disassembly with line info (nvdisasm -g), so that each sampled address maps
#      to a line of kernels/*.cuh: experiments/item_boundary_lines.py reads 2 and 3 here (where
#      the machine lacks nvdisasm, the cubin comes back for `nvdisasm -g -c` here).
# Usage (GPU machine, OUT set): bash experiments/item_boundary_profile.sh [tiles|ncu|all]
set -uo pipefail
stage=${1:-all}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
bash experiments/build_ab.sh . scripts/bench_prefill.cpp >"$OUT/build.log" 2>&1 ||
  { tail -n 30 "$OUT/build.log"; exit 1; }
bench=$PWD/build-ab/bench_prefill
if [ "$stage" = all ] || [ "$stage" = tiles ]; then
  export FLARE_CACHE_DIR=$PWD/build-ab/jit-cache
  for window in "" "${FLARE_PROFILE_WINDOW:-256}"; do
    for tile in "" 64; do
      echo "== window '${window:-none}', query tile '${tile:-auto}'"
      settings=(FLARE_BENCH_ONLY="causal b16 seq")
      [ -n "$window" ] && settings+=(FLARE_BENCH_WINDOW_LEFT="$window")
      [ -n "$tile" ] && settings+=(FLARE_BENCH_QUERY_TILE="$tile")
      timeout 120 env "${settings[@]}" "$bench" | grep -E "^causal"
    done
  done
fi
if [ "$stage" = all ] || [ "$stage" = ncu ]; then
  export FLARE_CACHE_DIR=$PWD/build-ab/jit-cache-lineinfo FLARE_JIT_LINEINFO=1
  rm -rf "$FLARE_CACHE_DIR"
  FLARE_BENCH_ONLY="${FLARE_PROFILE_SHAPE:-causal b16 seq 1024}" timeout 240 ncu -k 'regex:(?i)prefill' \
    --launch-skip 3 --launch-count 1 --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --import-source no -f -o "$OUT/l1024" "$bench" >"$OUT/ncu.log" 2>&1
  echo "ncu exit $?"; grep -E "Duration|Warp Cycles Per Issued|prefill" "$OUT/ncu.log" | head -5
  ncu -i "$OUT/l1024.ncu-rep" --page source --csv --print-source sass >"$OUT/l1024_sass.csv" 2>&1
  ncu -i "$OUT/l1024.ncu-rep" --page details >"$OUT/l1024_details.txt" 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp" "$OUT/l1024_details.txt" | head -5
  echo "sass page: $(wc -l <"$OUT/l1024_sass.csv") lines"
  rm -f "$OUT/l1024.ncu-rep"
  # The cache entries hold a 64-byte header, then the cubin (its length at bytes [16, 24)).
  for entry in "$FLARE_CACHE_DIR"/*.cubin; do
    name=$(basename "$entry" .cubin)
    python3 - "$entry" "$OUT/$name.cubin" <<'PY'
import struct, sys
data = open(sys.argv[1], "rb").read()
size = struct.unpack_from("<Q", data, 16)[0]
open(sys.argv[2], "wb").write(data[64:64 + size])
PY
    if ! command -v nvdisasm >/dev/null; then
      # Some GPU machines lack it: the cubin comes back instead, for PyPI's
      # nvidia-cuda-nvdisasm here (nvdisasm -g -c; the ncu addresses less the first one's).
      echo "$name: no nvdisasm here; $OUT/$name.cubin kept"
      continue
    fi
    # The disassembly to a file first: under pipefail, `nvdisasm | grep -q` fails whenever grep
    # stops at its first match (nvdisasm's SIGPIPE), which dropped every prefill unit's line info.
    nvdisasm -g -c "$OUT/$name.cubin" >"$OUT/$name.sass" 2>&1
    if grep -q "prefill" "$OUT/$name.sass"; then
      echo "$name: $(grep -c '/\*[0-9a-f]*\*/' "$OUT/$name.sass") instructions"
    else
      rm -f "$OUT/$name.sass"
    fi
    rm -f "$OUT/$name.cubin"
  done
fi
