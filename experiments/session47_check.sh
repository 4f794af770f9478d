#!/usr/bin/env bash
# Forty-seventh session's device checks (GPU machine, OUT set):
#   host: the causal library variants' GPU tests pinned to the Hopper family (FLARE_TEST_PREFILL_
#     BACKEND=fa3: their split case now takes the default tiles there, not FA2's 16 rows), then
#     the Python package installed (its attention-sink / cascade / sparse tests as a smoke run)
#     and scripts/bench_host.py next to FlashInfer (.anchors-fi carried): every wrapper's run()
#     and plan() host time (SKIP_FAMILY=1 skips the C++ tests; PY_TESTS picks the Python ones).
#   bench: bench_host.py only (installs the package where it is missing).
#   profile: experiments/host_profile.py (cProfile) of PROFILE_CASES' run(), or plan() with
#     PROFILE_PLAN=1 (next: the graph-mode decode plan, 98-161 us against 18-27 outside graph
#     mode: PROFILE_PLAN=1 PROFILE_CASES="CUDAGraph tensor"); BENCH_ONLY adds bench_host rows.
#   final: the whole Python suite, then bench_host.py.
#   staging: the Python tests PY_TESTS (default: user_path, graph, capture), then bench_host.py
#     --only BENCH_ONLY (default: Graph).
set -uo pipefail
stage=${1:?host|bench|profile|final|staging}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
fi_site() {  # FlashInfer's site where .anchors-fi was carried (../shared/bench/flashinfer)
  [ -d .anchors-fi ] && python3 .anchors-fi/setup_fi.py /tmp/fi-site >"$OUT/fi_setup.log" 2>&1 &&
    echo /tmp/fi-site
}
if [ "$stage" = host ]; then
  source experiments/family_tests.sh
  [ -n "${SKIP_FAMILY:-}" ] ||
    family_tests "$PWD" fa3 'UserVariantPrefill.Library*:-UserVariantPrefill.LibraryPrefixLm*'
  scripts/gpu_check_python.sh "$OUT/py" -q -k "${PY_TESTS:-sink or cascade_cuda or block_sparse}" \
    2>&1 | tail -n 3
fi
if [ "$stage" = bench ]; then  # bench_host.py only (the package installed by an earlier stage)
  (cd /tmp && python3 -c 'import flare' 2>/dev/null) ||  # pytest then selects nothing
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
fi
if [ "$stage" = host ] || [ "$stage" = bench ]; then
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} PYTHONUNBUFFERED=1 \
    timeout 200 python3 "$tree/scripts/bench_host.py" --json "$OUT/bench_host.json" 2>&1 |
    tee "$OUT/bench_host.log" | grep -vE "^(  warnings|$)" | tail -n 45)
fi
if [ "$stage" = profile ]; then  # experiments/host_profile.py on the slow wrappers (cProfile)
  (cd /tmp && python3 -c 'import flare' 2>/dev/null) ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k no_test_has_this_name >/dev/null 2>&1
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 200 python3 \
    "$tree/experiments/host_profile.py" ${PROFILE_PLAN:+--plan} ${PROFILE_CASES:-} 2>&1 | tail -n 200)
  [ -z "${BENCH_ONLY:-}" ] || (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 \
    python3 "$tree/scripts/bench_host.py" --only "$BENCH_ONLY" 2>&1 | grep "^|")
fi
if [ "$stage" = final ]; then  # the whole Python suite on this tree, then bench_host.py
  scripts/gpu_check_python.sh "$OUT/py" -q 2>&1 | tail -n 6
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} PYTHONUNBUFFERED=1 \
    timeout 200 python3 "$tree/scripts/bench_host.py" --json "$OUT/bench_host.json" 2>&1 |
    tee "$OUT/bench_host.log" | grep -E "^\||rror" | tail -n 30)
fi
if [ "$stage" = staging ]; then  # the graph-mode plan's staging: its tests, then its plan() time
  scripts/gpu_check_python.sh "$OUT/py" -q -k "${PY_TESTS:-user_path or graph or capture}" \
    2>&1 | tail -n 4
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} timeout 100 python3 \
    "$tree/scripts/bench_host.py" --only "${BENCH_ONLY:-Graph}" 2>&1 | grep -E "^\||rror")
fi
