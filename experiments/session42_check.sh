#!/usr/bin/env bash
# Forty-second session's device checks (GPU machine, OUT set):
#   rope: apply_rope's GPU tests (the fixture now makes device 0 current), memcheck of the safety
#     cases, then FlashInfer's apply_rope_pos_ids JIT build with its error printed in full
#     (the forty-first session's bench saw only "Ninja build failed"; carry .anchors-fi).
set -uo pipefail
stage=${1:?rope|staging|python|final|ab|paged_drop}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
if [ "$stage" = rope ]; then
  source experiments/family_tests.sh
  family_tests "$PWD" auto '*Rope*'
  FLARE_CACHE_DIR=$PWD/build-ab/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-ab/flare_gpu_tests --gtest_filter='RopeGpuSafety.*:RopeGpuCosSinCache.*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/memcheck.log")"
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  (cd /tmp && PYTHONPATH=/tmp/fi-site MAX_JOBS=16 timeout 200 python3 -c '
import torch, flashinfer, traceback
q = torch.randn(64, 8, 128, dtype=torch.bfloat16, device="cuda"); k = torch.randn(64, 2, 128, dtype=torch.bfloat16, device="cuda")
pos = torch.arange(64, dtype=torch.int32, device="cuda")
try:
    flashinfer.apply_rope_pos_ids(q, k, pos); torch.cuda.synchronize(); print("flashinfer rope: ok")
except Exception as e:
    print("".join(traceback.format_exception(e))[-4000:])
' 2>&1 | grep -vE "Warning|warn" | tail -n 60)
fi
#   staging: rope_staging's GPU tests (kAuto plan by plan, kStaged and kFused) under auto, fa2
#     and fa3, memcheck of the kAuto sequence, then bench_prefill with RoPE: fused against auto
#     (two rounds, plain causal beside them), and the append case's crossover (new tokens 192 to
#     512 over 32768: fused against staged).
if [ "$stage" = staging ]; then
  source experiments/family_tests.sh
  filter='PrefillGpu.StagedRope*:PrefillGpu.FusedRope*:PrefillRopeStagingGpu.*'
  for backend in auto fa2 fa3; do
    family_tests "$PWD" $backend "$filter"
    rm -f "$OUT"/tests_${backend}_*.log
  done
  FLARE_CACHE_DIR=$PWD/build-ab/jit-cache compute-sanitizer --tool memcheck --error-exitcode 99 \
    build-ab/flare_gpu_tests --gtest_filter='PrefillRopeStagingGpu.*' >"$OUT/memcheck.log" 2>&1
  echo "memcheck: exit $? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1) $(grep -E 'tests? ran' "$OUT/memcheck.log")"
  bash experiments/build_ab.sh "$PWD" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build failed"
  bench() { FLARE_CACHE_DIR=$PWD/build-ab/jit-cache timeout 150 build-ab/bench_prefill 2>&1 |
    grep -vE "^case|^$|zipf lengths|append vs|^device"; }
  for round in 1 2; do
    echo "== round $round: plain"; FLARE_BENCH_ROPE=0 bench | head -6
    for staging in fused auto; do
      echo "== round $round: rope $staging"; FLARE_BENCH_ROPE=1 FLARE_BENCH_ROPE_STAGING=$staging bench | head -6
    done
  done
  for qo in 192 256 384 512; do
    for staging in fused staged auto; do
      echo "append $qo $staging: $(FLARE_BENCH_ROPE=1 FLARE_BENCH_ROPE_STAGING=$staging FLARE_BENCH_APPEND_QO=$qo FLARE_BENCH_ONLY='append b8' bench | head -1)"
    done
  done
fi
#   python: the package's RoPE / prefill tests on the GPU, bench_python's prefill with RoPE (plan
#     and run host time, graph and eager; FlashInfer beside), bench_variants' causal and RoPE
#     rows, and bench_rope_apply.py with FlashInfer's rope module (its sources carried in
#     .anchors-fi-extra; carry both).
if [ "$stage" = python ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q -k "prefill or rope" 2>&1 | tail -n 3
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  scripts/flashinfer_sources.sh install /tmp/fi-site
  tree=$PWD
  cd /tmp
  export PYTHONPATH=/tmp/fi-site MAX_JOBS=16
  # FlashInfer's rope module compiles (nvcc) in the background meanwhile.
  python3 -c 'import torch, flashinfer; q = torch.randn(4, 2, 128, dtype=torch.bfloat16, device="cuda"); flashinfer.apply_rope_pos_ids(q, q.clone(), torch.arange(4, dtype=torch.int32, device="cuda"))' >"$OUT/fi_rope_build.log" 2>&1 &
  timeout 240 python3 "$tree/scripts/bench_python.py" --only prefill --rope --json "$OUT/bench_rope.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | sed -n '/^| prefill/,$p'
  timeout 200 python3 "$tree/scripts/bench_variants.py" --variants causal,rope \
    --libraries flare,flashinfer --lengths 2048,8192,16384 --calls 10 2>&1 |
    grep -vE "Warning|warn|INFO" | tail -n 14
  wait
  tail -n 3 "$OUT/fi_rope_build.log"
  timeout 200 python3 "$tree/scripts/bench_rope_apply.py" --json "$OUT/rope_apply.json" 2>&1 |
    grep -vE "Warning|warn|INFO" | tail -n 20
fi
#   final: scripts/gpu_check.sh tests on this tree (every GPU test, both families, sanitizers),
#     then bench_python's prefill with RoPE next to FlashInfer fa2 (carry .anchors-fi).
if [ "$stage" = final ]; then
  OUT=$OUT/check bash scripts/gpu_check.sh tests 2>&1 | grep -vE "^\[  SKIPPED|^=========  +(Host|Saved)" | tail -n 40
  find "$OUT/check" -name "*.log" -size -2k -delete 2>/dev/null
  scripts/gpu_check_python.sh "$OUT/py" -q -k "rope and prefill" 2>&1 | tail -n 1
  python3 .anchors-fi/setup_fi.py /tmp/fi-site >/dev/null 2>&1
  tree=$PWD
  cd /tmp
  PYTHONPATH=/tmp/fi-site timeout 200 python3 "$tree/scripts/bench_python.py" --only prefill --rope \
    --json "$OUT/bench_rope.json" 2>&1 | grep -vE "Warning|warn|INFO" | grep -E "^\||^  "
fi
#   ab <old tree>: bench_prefill of <old tree> against this tree, interleaved, two rounds: plain
#     causal and RoPE fused (the forty-first session's E: ragged causal -1.4% at 1024 / 4096 in
#     one round, unsettled).
if [ "$stage" = ab ]; then
  old=${2:?the old tree}
  for t in "$old" "$PWD"; do
    bash experiments/build_ab.sh "$t" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build of $t failed"
  done
  for round in 1 2; do
    for rope in 0 1; do
      for t in "$old" "$PWD"; do
        echo "== round $round rope $rope: $(basename "$t")"
        FLARE_CACHE_DIR="$t/build-ab/jit-cache" FLARE_BENCH_ROPE=$rope FLARE_BENCH_ROPE_STAGING=fused \
          timeout 100 "$t/build-ab/bench_prefill" 2>&1 | grep -vE "^case|^$|zipf lengths|append vs|^device" | head -6
      done
    done
  done
fi
#   paged_drop: the paged column of bench_prefill with RoPE in processes of one case (Zipf,
#     causal 1024), the ragged one fused against auto (staged), two rounds (C's unexplained drop).
if [ "$stage" = paged_drop ]; then
  bash experiments/build_ab.sh "$PWD" scripts/bench_prefill.cpp >/dev/null 2>&1 || echo "build failed"
  for round in 1 2; do
    for only in zipf "seq 1024"; do
      for staging in fused auto; do
        echo "$round $staging: $(FLARE_CACHE_DIR=$PWD/build-ab/jit-cache FLARE_BENCH_ROPE=1 FLARE_BENCH_ROPE_STAGING=$staging \
          FLARE_BENCH_ONLY="$only" timeout 60 build-ab/bench_prefill 2>&1 | grep -E "^causal")"
      done
    done
  done
fi
