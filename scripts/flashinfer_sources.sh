#!/usr/bin/env bash
# FlashInfer's sources that ../shared/bench/flashinfer's slimmed package lacks and that its own
# MultiLevelCascadeAttentionWrapper JIT-compiles on first use (the merge of the levels' states:
# csrc/cascade.cu and its binding; without them its module fails to build, "Ninja error",
# docs/perf.md thirtieth and thirty-first sessions), and its apply_rope family's (csrc/rope.cu
# and its binding, forty-second session). FlashInfer is the anchor, not flare code.
#   fetch (a machine that reaches PyPI): scripts/flashinfer_sources.sh fetch
#     -> .anchors-fi-extra/csrc/ (git-ignored; carry it with .anchors-fi)
#   install (the GPU machine, after .anchors-fi/setup_fi.py SITE):
#     scripts/flashinfer_sources.sh install SITE
set -euo pipefail
cd "$(dirname "$0")/.."
readonly VERSION=0.7.2.post1  # the version ../shared/bench/flashinfer carries
readonly FILES=(cascade.cu flashinfer_cascade_binding.cu rope.cu flashinfer_rope_binding.cu)
case "${1:-}" in
  fetch)
    tmp=$(mktemp -d)
    python3 -m pip download -q "flashinfer-python==$VERSION" --no-deps -d "$tmp"
    mkdir -p .anchors-fi-extra/csrc
    for f in "${FILES[@]}"; do
      unzip -q -o -j "$tmp"/flashinfer_python-"$VERSION"-*.whl "flashinfer/data/csrc/$f" \
        -d .anchors-fi-extra/csrc
    done
    rm -rf "$tmp"
    ls .anchors-fi-extra/csrc
    ;;
  install)
    site=${2:?site directory}
    [ -d .anchors-fi-extra/csrc ] || { echo "no .anchors-fi-extra (run fetch, carry it)"; exit 1; }
    cp .anchors-fi-extra/csrc/* "$site/flashinfer/data/csrc/"
    ;;
  *)
    echo "usage: $0 fetch | install SITE" >&2
    exit 2
    ;;
esac
