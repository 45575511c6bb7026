#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What NCCL holds, on the real NCCL (2.28.9 on the H200: one rank is what one GPU allows): the
# registration and window cases of tests/integration/nccl_cases.py without and with the shim, the
# multicast ones where the device supports multicast (skipped, 77, where it does not), and what
# this NCCL and device offer. Suspend and resume (NCCL 2.29.7) stay fake-only.
#   nccl_holds.sh BUILD OUT
set -u
build=$1
out=$2
[ -x "$build/tests/integration/nccl_hold_cases" ] || { echo "nccl_hold_cases not in the bundle"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
. "$here/gpu/libpath.sh"
mkdir -p "$out"
python3 - <<'PY'
import ctypes
nccl = ctypes.CDLL("libnccl.so.2")
v = ctypes.c_int()
nccl.ncclGetVersion(ctypes.byref(v))
late = [n for n in ("ncclCommSuspend", "ncclCommResume", "ncclCommMemStats", "ncclCommGrow")
        if hasattr(nccl, n)]
print(f"nccl {v.value}; entry points newer than 2.28: {late or 'none'}")
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
mc = ctypes.c_int(-1)
r = cuda.cuDeviceGetAttribute(ctypes.byref(mc), 132, 0)  # CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
print(f"device 0 multicast supported: {mc.value} (cuDeviceGetAttribute {r})")
PY
status=0
for c in reg-free reg-ok reg-segment reg-segment-ok reg-cudafree reg-cudafree-ok window-free \
         window-ok bind-mem bind-mem-ok bind-addr bind-addr-ok; do
  python3 "$here/integration/run_case.py" --build "$build" --real "$c"
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
done
exit $status
