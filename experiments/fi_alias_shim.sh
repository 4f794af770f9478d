#!/usr/bin/env bash
# FlashInfer's attention suite over flare with the shim reduced to what issue 21 asks of it:
# flashinfer.decode, .prefill, .cascade, .page and .fp4_quantization are flare's own modules
# (sys.modules aliases), only the shim's infrastructure stand-ins (utils, jit, trace) stay.
# Runs a copy of .fitests with that shim (the shared shim is unchanged); with the shared shim,
# FlashInfer names flare has in those modules but the shim does not re-export fail as missing.
# Usage (GPU machine, .fitests carried): OUT=<dir> bash experiments/fi_alias_shim.sh
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
ALIAS=/tmp/fitests_alias
rm -rf "$ALIAS" && cp -r .fitests "$ALIAS" || exit 1
for m in decode prefill cascade page fp4_quantization; do
  cat > "$ALIAS/shim/flashinfer/$m.py" <<EOF
"""flashinfer.$m is flare.$m (an alias, no stand-in)."""
import sys

import flare.$m as _module

sys.modules[__name__] = _module
EOF
done
FLARE_SRC=$SRC bash "$ALIAS/run_fi_suite.sh"
