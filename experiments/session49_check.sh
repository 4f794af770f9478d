#!/usr/bin/env bash
# Forty-ninth session's device checks (GPU machine, OUT set):
#   profile: installs the package, then where the composed wrappers' run() spends its host time
#     (experiments/host_profile.py: cascade, shared-prefix, variable block-sparse, sink, single_*)
#     and scripts/bench_host.py (flare only unless .anchors-fi was carried).
set -uo pipefail
stage=${1:?profile|verify|final}
cd "$(dirname "$0")/.."
export PATH=/usr/local/cuda/bin:$PATH FLARE_LOG=quiet
mkdir -p "$OUT"
source experiments/family_tests.sh
install() {
  (cd /tmp && python3 -c 'import flare' 2>/dev/null) ||
    scripts/gpu_check_python.sh "$OUT/py" -q -k "${PY_TESTS:-no_test_has_this_name}" 2>&1 | tail -n 3
}
bench_host() {
  site=$(fi_site)
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts${site:+:$site} PYTHONUNBUFFERED=1 \
    timeout 200 python3 "$tree/scripts/bench_host.py" --json "$OUT/bench_host.json" 2>&1 |
    tee "$OUT/bench_host.log" | grep -E "^\||rror" | tail -n 30)
}
if [ "$stage" = profile ]; then
  install
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 150 python3 \
    "$tree/experiments/host_profile.py" Cascade Shared Variable Sink single 2>&1 |
    tee "$OUT/host_profile.log" | tail -n 80)
  bench_host
fi
# verify: the merge launch's kernel lookup (C++ merge and cascade tests), the shared-prefix
#   wrappers' one-allocation forward and the variable block-sparse views (Python tests), then the
#   host profile and bench_host next to FlashInfer.
if [ "$stage" = verify ]; then
  family_tests "$PWD" auto "MergeState*:Cascade*:Bsr*"
  PY_TESTS="variable_block or shared_prefix or cascade or merge or block_sparse" install
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 python3 \
    "$tree/experiments/host_profile.py" Shared Variable 2>&1 | tail -n 36)
  bench_host
fi
# final: the whole Python suite (the (tensor, shape) views, the shared-prefix and block-sparse
#   wrappers; after the plan() changes: the cascade's joined page ids, the staged host page ids,
#   the variable block-sparse layout in C++), the host profile of the changed wrappers' run()
#   (PROFILE_PLAN=1: of the cascade's and variable block-sparse plan()) and bench_host next to
#   FlashInfer.
if [ "$stage" = final ]; then
  scripts/gpu_check_python.sh "$OUT/py" -q 2>&1 | tail -n 3
  (tree=$PWD && cd /tmp && PYTHONPATH=$tree/scripts timeout 100 python3 \
    "$tree/experiments/host_profile.py" ${PROFILE_PLAN:+--plan Cascade} Shared Variable 2>&1 |
    tail -n 36)
  bench_host
fi
