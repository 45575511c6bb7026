#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The cumemguard Python package on the real PyTorch: the allocator settings before, inside and
# after expandable_segments(False), and a legacy-IPC export of a buffer allocated inside the block
# succeeding while one allocated outside fails; without and with the shim.
#   python_api.sh BUILD OUT
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
py=${CMG_PYTHON:-python3}
"$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null || { echo "no PyTorch with CUDA"; exit 77; }
. "$here/libpath.sh"
exec "$py" "$here/python_api_check.py" "$1" "$2/python-api"
