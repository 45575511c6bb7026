#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's examples on the real driver: examples/double_free.py under `cumemguard run` (the
# stale free caught by the debug profile's quarantine, printed with its stacks and Python frames),
# the exporter/importer pair with PyTorch's expandable segments through the bridge, and a program
# built with -fsanitize=address under `cumemguard run` (its runtime preloaded first).
#   examples.sh BUILD OUT
set -u
build=$1
out=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cg="$build/tools/cumemguard"
ex="$here/examples"
[ -d "$ex" ] || { echo "examples/ not in the bundle"; exit 77; }
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU"; exit 77; }
status=0
cd "$out" || exit 1
"$cg" run --log "$out/double_free.%p.log" -- python3 "$ex/double_free.py" > "$out/double_free.txt" 2>&1
grep -q "^same_address 0" "$out/double_free.txt" && grep -q "double-free" "$out/double_free.txt" \
  || { echo "FAIL double_free.py"; status=1; }
# The finding's line is followed by its stacks (the debugging profile's CUMEMGUARD_WARN_FRAMES),
# each line with the process's prefix: the call's frames, then the allocation's and first free's.
# A stack begins with the interpreter's call into C folded into one line ("... N interpreter
# frames calling into C"), and the next line is frame #N, the script's own.
grep -A1 -E '^cumemguard\[[0-9]+\]: warning: double-free in cudaFree' "$out/double_free.txt" \
  | grep -Eq '^cumemguard\[[0-9]+\]:     (#0 |\.\.\. [0-9]+ interpreter frames calling into C$)' && \
  grep -Eq '^cumemguard\[[0-9]+\]:   first free: ' "$out/double_free.txt" \
  || { echo "FAIL double_free.py: no stacks under the finding"; status=1; }
if grep -Eq '^cumemguard\[[0-9]+\]:     \.\.\. [0-9]+ interpreter frames calling into C$' \
     "$out/double_free.txt"; then
  python3 - "$out/double_free.txt" <<'PY' || { echo "FAIL double_free.py: a folded line not followed by its frame number"; status=1; }
import re, sys
lines = [l.split(": ", 1)[1] if ": " in l else l for l in open(sys.argv[1]).read().splitlines()]
for i, l in enumerate(lines):
    m = re.fullmatch(r"    \.\.\. (\d+) interpreter frames calling into C", l)
    if m and not re.match(r"    #%s " % m.group(1), lines[i + 1] if i + 1 < len(lines) else ""):
        sys.exit(1)
PY
fi
# The call's stack names the script's own line of the stale free (the Python frame reader).
stale=$(grep -n '"stale_free"' "$ex/double_free.py" | cut -d: -f1)
grep -Eq "^cumemguard\[[0-9]+\]:     #[0-9]+ main \(.*/double_free\.py:$stale\)\$" \
  "$out/double_free.txt" || { echo "FAIL double_free.py: no Python frame at :$stale"; status=1; }
if python3 -c "import torch" 2>/dev/null; then
  rm -f "$out/h.json" "$out/h.json.done"
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$cg" run --no-log -e CUMEMGUARD_IPC=bridge \
    -- python3 "$ex/exporter.py" "$out/h.json" --torch > "$out/exporter.txt" 2>&1 &
  exp=$!
  "$cg" run --no-log -e CUMEMGUARD_IPC=bridge -- python3 "$ex/importer.py" "$out/h.json" \
    > "$out/importer.txt" 2>&1 || { echo "FAIL importer.py"; status=1; }
  wait $exp || { echo "FAIL exporter.py"; status=1; }
  grep -q "^bytes ok" "$out/importer.txt" || { echo "FAIL importer bytes"; status=1; }
fi
if [ -x "$build/tests/integration/sanitized" ] && \
   ldd "$build/tests/integration/sanitized" | grep -q "not found"; then
  echo "skip the sanitized program: gcc's libasan is not installed here" > "$out/sanitized.txt"
elif [ -x "$build/tests/integration/sanitized" ]; then
  "$cg" run --no-log -- "$build/tests/integration/sanitized" double-free > "$out/sanitized.txt" 2>&1 \
    || { echo "FAIL sanitized program under run"; status=1; }
  grep -q "^asan_active 1" "$out/sanitized.txt" || { echo "FAIL ASan not active"; status=1; }
fi
cat "$out"/double_free.txt "$out"/importer.txt "$out"/sanitized.txt 2>/dev/null | head -40
exit $status
