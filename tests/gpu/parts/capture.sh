#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stream capture on the real driver: PyTorch's CUDA graphs under the shim with the native allocator,
# expandable segments and cudaMallocAsync (no finding, the captures seen, the private pool counted
# as the graph's). The conformance rows C1-C17 and the capture cases (capture_checks.py, one
# failing program and its fixed variant per finding) run in the suite's conformance and cases
# parts.   capture.sh BUILD OUT
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
py=${CMG_PYTHON:-python3}
"$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || { echo "no PyTorch with CUDA"; exit 77; }
. "$here/libpath.sh"
exec "$py" "$here/capture_torch.py" "$1" "$2/capture"
