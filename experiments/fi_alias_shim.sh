#!/usr/bin/env bash
# FlashInfer's attention suite over flare with the shim reduced to what issue 21 asks of it:
# flashinfer.decode, .prefill, .cascade, .page, .fp4_quantization and .triton are flare's own
# modules (sys.modules aliases), only the shim's infrastructure stand-ins (utils, jit, trace) stay.
# Runs a copy of .fitests with that shim (the shared shim is unchanged); with the shared shim,
# FlashInfer names flare has in those modules but the shim does not re-export fail as missing.
# Usage (GPU machine, .fitests carried): OUT=<dir> bash experiments/fi_alias_shim.sh
#   FI_FILES="<test files>" runs those of the suite's files only (a split across device calls);
#   the per-function sample is the same (seeded per function); the selection goes to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
ALIAS=/tmp/fitests_alias
rm -rf "$ALIAS" && cp -r .fitests "$ALIAS" || exit 1
for m in decode prefill cascade page fp4_quantization triton; do
  cat > "$ALIAS/shim/flashinfer/$m.py" <<EOF
"""flashinfer.$m is flare.$m (an alias, no stand-in)."""
import sys

import flare.$m as _module

sys.modules[__name__] = _module
EOF
done
if [ -n "${FI_FILES:-}" ]; then
  python3 - "$ALIAS/run_fi_suite.sh" <<'PY' || exit 1
import re, sys
path = sys.argv[1]
text = open(path).read()
text, n = re.subn(r'^FILES="[^"]*"', 'FILES="$FI_FILES"', text, flags=re.M)
assert n == 1, "run_fi_suite.sh: no FILES list"
open(path, "w").write(text)
PY
fi
FLARE_SRC=$SRC bash "$ALIAS/run_fi_suite.sh"
cp /tmp/selection.json "${OUT:-/tmp/fi_out}/selection.json" 2>/dev/null
