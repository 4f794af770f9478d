#!/usr/bin/env bash
# Forty-third session's device checks (GPU machine, OUT set; carry .anchors-fi and
# .anchors-fi-extra):
#   python: the whole Python suite on CUDA (the DLPack C exchange path reads every torch
#     tensor now), then bench_rope_apply.py next to FlashInfer (its host column).
#   dlpack_ab: bench_python's decode and prefill host times with torch's DLPack table and
#     without it (deleted from torch.Tensor before flare first reads a tensor: the attribute
#     reads), alternating processes, two rounds, no FlashInfer.
#   rope_host: the rope and merge tests on CUDA (no torch.cuda.device around the call now),
#     then bench_rope_apply.py next to FlashInfer (host column).
#   state_ops: merge / append / cascade tests on CUDA (the bindings read torch tensors in place
#     now), then scripts/bench_state_ops.py next to FlashInfer.
#   bench: bench_python.py's decode and prefill tables (run() / plan() host next to FlashInfer
#     and SDPA, same process), then the prefill RoPE table with the 'flare staged' graph row.
set -uo pipefail
stage=${1:?python|bench|dlpack_ab|rope_host|state_ops}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
fi_site() {
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  scripts/flashinfer_sources.sh install /tmp/fi-site >/dev/null 2>&1
}
rope_apply_bench() {  # bench_rope_apply.py next to FlashInfer, from /tmp
  fi_site
  (cd /tmp && PYTHONPATH=/tmp/fi-site MAX_JOBS=16 timeout 240 python3 \
    "$OLDPWD/scripts/bench_rope_apply.py" --json "$OUT/rope_apply.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | tail -n 32)
}
if [ "$stage" = python ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q 2>&1 | tail -n 8
  rope_apply_bench
fi
if [ "$stage" = bench ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "dlpack" 2>&1 | tail -n 1
  fi_site
  tree=$PWD
  cd /tmp
  export PYTHONPATH=/tmp/fi-site PYTHONUNBUFFERED=1
  timeout 300 python3 "$tree/scripts/bench_python.py" --json "$OUT/bench.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | sed -n '/^device:/,$p'
  timeout 200 python3 "$tree/scripts/bench_python.py" --only prefill --rope \
    --json "$OUT/bench_rope.json" 2>&1 | grep -vE "Warning|warn|INFO" | sed -n '/^| prefill/,$p'
fi
if [ "$stage" = dlpack_ab ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "dlpack" 2>&1 | tail -n 1
  tree=$PWD
  cd /tmp
  bench() {  # $1: keep | drop (torch's DLPack table), then bench_python's arguments
    local mode=$1
    shift
    python3 -c "
import runpy, sys, torch
if sys.argv[1] == 'drop':
    del torch.Tensor.__dlpack_c_exchange_api__
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name='__main__')" "$mode" "$tree/scripts/bench_python.py" "$@" 2>&1 |
      grep -E "^\| (decode|prefill) b" | grep -E "\| flare \|" | awk -F'|' -v m="$mode" '{print m" |"$2"|"$4"|"$5"|"}'
  }
  for round in 1 2; do
    for mode in keep drop; do
      echo "== round $round $mode"
      bench $mode --only decode
      bench $mode --only prefill | head -n 1
    done
  done
fi
if [ "$stage" = rope_host ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "rope or merge or dlpack" 2>&1 | tail -n 1
  rope_apply_bench
fi
if [ "$stage" = state_ops ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "merge or append or cascade or page or dlpack" 2>&1 |
    tail -n 1
  fi_site
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site:$tree/scripts MAX_JOBS=16 timeout 280 python3 \
    "$tree/scripts/bench_state_ops.py" --json "$OUT/state_ops.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | tail -n 24
fi
