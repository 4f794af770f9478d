#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test flare (idempotent, quiet).
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
command -v python3 >/dev/null || need+=(python3 python3-pip)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
# A C++ compiler is all flare's build needs. NVRTC (CUDA toolkit) is opened at run time to
# compile the GPU kernels; without it the CPU backend runs and the kernel-compile tests skip.
toolkit=""
for root in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
  if [ -n "$root" ] && [ -d "$root" ]; then toolkit=$root; fi
done
if [ -z "$toolkit" ] && ! command -v nvcc >/dev/null; then
  echo "setup: note: no CUDA toolkit found: building for the CPU backend only" \
    "(the kernel-compile tests will skip)" >&2
fi
