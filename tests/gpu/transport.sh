#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Transport-aware cleanup on the real GPU (docs/transport.md): PyTorch with a 1-rank NCCL process
# group, torch.cuda.empty_cache() every iteration while a kernel keeps the device busy, under
# `cumemguard run` in five configurations; transport_check.py checks each run's log and numbers.
#   tests/gpu/transport.sh BUILD_DIR OUT_DIR      (exit 77 without a GPU; about 2 minutes)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${2:-$build/gpu-out/transport}
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "transport: no GPU here; skipped"
  exit 77
fi
if ! python3 -c 'import torch, torch.distributed; assert torch.cuda.is_available()' 2>/dev/null; then
  echo "transport: no PyTorch with CUDA here; skipped"
  exit 77
fi
export NCCL_NVLS_ENABLE=0
status=0
# mode -> environment of the run
declare -A env_of=(
  [native]="CUMEMGUARD_OPPORTUNISTIC=report"
  [defer]="CUMEMGUARD_OPPORTUNISTIC=defer CUMEMGUARD_DEFER_LIMIT=64G"
  [ctypes]="CUMEMGUARD_OPPORTUNISTIC=report"
  [expandable]="CUMEMGUARD_OPPORTUNISTIC=report PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
  [async]="CUMEMGUARD_OPPORTUNISTIC=report PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
)
for mode in ${CMG_TRANSPORT_MODES:-native defer ctypes expandable async}; do
  d="$out/$mode"
  rm -rf "$d" && mkdir -p "$d"
  echo "\$ ${env_of[$mode]} cumemguard run -- python3 transport_workload.py $mode" > "$d/run.txt"
  # shellcheck disable=SC2086
  env ${env_of[$mode]} CUMEMGUARD_SUMMARY=1 timeout 240 \
    "$build/tools/cumemguard" run --log "$d/log.%p" -- \
    python3 "$here/transport_workload.py" "$mode" >> "$d/run.txt" 2>&1
  echo "exit $?" >> "$d/run.txt"
  python3 "$here/transport_check.py" "$build" "$d" "$mode" 2>&1 | tee "$d/check.txt"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
exit $status
