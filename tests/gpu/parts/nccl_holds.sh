#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What NCCL holds, on the real NCCL (2.28.9 on the H200: one rank is what one GPU allows):
#   nccl_holds.sh BUILD OUT
#  * what this NCCL and device offer: NCCL's version, which entry points newer than 2.28 it has
#    (suspend, resume and MemStats came with 2.29.7: they stay fake-only, docs/nccl.md), whether
#    device 0 supports multicast;
#  * the registration, window and multicast cases of tests/integration/nccl_cases.py (each failing
#    program and its fixed variant, without and with the shim; the multicast ones exit 77 on a
#    device without multicast). They are `real` cases, so the suite's cases part runs them too:
#    when run.sh runs that part (CMG_GPU_PARTS_RUN), this part does not run them a second time.
set -u
build=$1
out=$2
here=$(cd "$(dirname "$0")/.." && pwd)
[ -x "$build/tests/integration/nccl_hold_cases" ] || { echo "nccl_hold_cases not built"; exit 77; }
. "$here/libpath.sh"
python3 - <<'PY' || { echo "no libnccl.so.2 or libcuda.so.1 to load"; exit 77; }
import ctypes
nccl = ctypes.CDLL("libnccl.so.2")
v = ctypes.c_int()
nccl.ncclGetVersion(ctypes.byref(v))
late = [n for n in ("ncclCommSuspend", "ncclCommResume", "ncclCommMemStats", "ncclCommGrow")
        if hasattr(nccl, n)]
print(f"nccl {v.value}; entry points newer than 2.28: {' '.join(late) or 'none'}")
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
mc = ctypes.c_int(-1)
r = cuda.cuDeviceGetAttribute(ctypes.byref(mc), 132, 0)  # CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED
print(f"device 0 multicast supported: {mc.value} (cuDeviceGetAttribute {r})")
PY
case " ${CMG_GPU_PARTS_RUN:-} " in
  *" cases "*) echo "nccl cases: run by the suite's cases part (cases.txt)"; exit 0 ;;
esac
status=0
ok=0
for c in reg-free reg-ok reg-segment reg-segment-ok reg-cudafree reg-cudafree-ok window-free \
         window-ok window-double-unmap bind-mem bind-mem-ok bind-addr bind-addr-ok; do
  python3 "$here/../integration/run_case.py" --build "$build" --real "$c"
  rc=$?
  if [ $rc -eq 0 ]; then ok=$((ok + 1)); elif [ $rc -ne 77 ]; then status=1; fi
done
echo "nccl cases: $ok ok"
exit $status
