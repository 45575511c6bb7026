#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Legacy IPC on VMM memory on the real driver (docs/ipc-bridge.md), under two minutes:
#   1. the two-process cases of tests/programs/ipc_bridge.cpp (P11-P16, forged handles, an exited
#      exporter, another user, fork) without and with the shim, as run_case.py --real checks them;
#   2. PyTorch with expandable_segments:True: report mode diagnoses cudaIpcGetMemHandle, bridge
#      mode makes it work (bytes copied back in the importer), and the open latency of a 1 GiB
#      export (ipc_bridge_pair.py).
#   tests/gpu/ipc_bridge.sh BUILD_DIR OUT_DIR        (exit 77 without a GPU)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: ipc_bridge.sh BUILD_DIR OUT_DIR}" && pwd)
out=${2:?usage: ipc_bridge.sh BUILD_DIR OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "ipc_bridge.sh: no GPU here; skipped"
  exit 77
fi
. "$here/libpath.sh"
status=0
{
  echo "# ipc bridge $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
} > "$out/environment.txt"
cat "$out/environment.txt"

: > "$out/cases.txt"
for c in P11 P11-torch P11-deny P11-bridge P12 P12-bridge P13 P14 P15 P16 ipc-multi ipc-forged \
         ipc-exited ipc-peer-uid ipc-fork ipc-one-sided; do
  timeout 60 python3 "$here/../integration/run_case.py" --build "$build" --real "$c" >> "$out/cases.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
done
cat "$out/cases.txt"

timeout 150 python3 "$here/ipc_bridge_pair.py" "$build" "$out/pair" 2>&1 | tee "$out/pair.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
echo "ipc_bridge.sh: $([ $status -eq 0 ] && echo passed || echo FAILED); outputs in $out"
exit $status
