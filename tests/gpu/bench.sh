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
# The runtime and NCCL from the toolkit or the PyTorch wheels (the driver comes from the system).
libs=$(python3 - <<'PY'
import glob, os
dirs = []
for pat in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]:
    if glob.glob(pat + "/libcudart.so.13*"): dirs.append(pat)
try:
    import nvidia
    for base in nvidia.__path__:
        for lib in glob.glob(os.path.join(base, "*", "lib")) + glob.glob(os.path.join(base, "*", "*", "lib")):
            if glob.glob(lib + "/libcudart.so.13*") or glob.glob(lib + "/libnccl.so.2*"):
                dirs.append(lib)
except Exception:
    pass
print(":".join(dict.fromkeys(dirs)))
PY
)
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
exec python3 "$here/bench.py" "$build" "$out"
