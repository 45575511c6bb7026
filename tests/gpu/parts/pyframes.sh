#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Python frames on the real driver with this machine's python3 (3.12 on the GPU machine: the one
# per-version layout the development machine cannot run): the cases of
# tests/integration/check_pyframes.py against the real runtime, then PyTorch, whose caching
# allocator's segment allocation must name the Python line that asked for the memory.
#   pyframes.sh BUILD OUT
set -u
build=$1
out=$2
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU"; exit 77; }
. "$src/tests/gpu/libpath.sh"
status=0
python3 --version > "$out/pyframes_cases.txt" 2>&1
python3 "$src/tests/integration/check_pyframes.py" --real --cg "$build/tools/cumemguard" \
  --build "$build" --src "$src" --python python3 >> "$out/pyframes_cases.txt" 2>&1 || status=1
if python3 -c "import torch" 2>/dev/null; then
  python3 "$src/tests/gpu/pyframes_torch.py" "$build/tools/cumemguard" "$out" \
    >> "$out/pyframes_cases.txt" 2>&1 || status=1
fi
tail -25 "$out/pyframes_cases.txt"
exit $status
