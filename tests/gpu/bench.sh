#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU half of the benchmarks (docs/performance.md): the loops of cmg-bench-loop and a small
# PyTorch training step (expandable segments, a 1-rank NCCL all-reduce), each run alternately
# without and with the shim (A B C A B C ...), reporting median ratios. About 2-3 minutes.
#   tests/gpu/bench.sh BUILD_DIR OUT_DIR      (exit 77 where there is no GPU)
# Writes OUT_DIR/bench.md (the table for docs/performance.md) and OUT_DIR/bench-raw.txt.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${2:-$build/gpu-bench}
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu bench: no GPU here; skipped"
  exit 77
fi
. "$here/libpath.sh"
export NCCL_NVLS_ENABLE=0
exec python3 "$here/bench.py" "$build" "$out"
