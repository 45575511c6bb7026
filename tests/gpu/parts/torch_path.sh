#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# PyTorch under the shim: the release found loaded and installed, and the allocator path check
# (silent for the default allocator and expandable segments, one config finding for each faked
# mismatch).   torch_path.sh BUILD OUT
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
py=${CMG_PYTHON:-python3}
"$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || { echo "no PyTorch with CUDA"; exit 77; }
. "$here/libpath.sh"
exec "$py" "$here/torch_path_check.py" "$1" "$2/torch-path"
