#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The diagnosis of a default `cumemguard run` on the real driver, with nvcc-built programs (static
# cudart, as users build): the stale free of a re-issued address (stale_free.cu) caught at the
# stale call with the allocation, first-free and stale-free stacks while the kernel after it
# succeeds; a real crash (SIGSEGV) reported as crashed with the faulting stack; memory unmapped
# under a running kernel (busy_unmap.cu) reported as unmap-while-busy, with the first CUDA error
# it leads to, and prevented by CUMEMGUARD_BUSY_CHECK=sync.   diagnosis.sh BUILD OUT
set -u
build=$1
out=$2/diagnosis
mkdir -p "$out"
cg="$build/tools/cumemguard"
sf="$build/tests/integration/stale_free"
bu="$build/tests/integration/busy_unmap"
[ -x "$sf" ] && [ -x "$bu" ] || { echo "stale_free/busy_unmap not built (no nvcc)"; exit 77; }
status=0
check() {  # check LABEL FILE PATTERN...: every extended regex must match a line of FILE
  local label=$1 file=$2
  shift 2
  for pat in "$@"; do
    if ! grep -Eq -- "$pat" "$file"; then
      echo "FAIL $label: no line matching '$pat' in $(basename "$file")"
      status=1
      return
    fi
  done
  echo "ok $label"
}
cd "$out" || exit 1

"$sf" > stale-plain.txt 2>&1
echo "exit $?" >> stale-plain.txt
check "stale free, plain: the address is re-issued and the kernel after the stale free fails" \
  stale-plain.txt '^reused 1' '^kernel cudaError'

"$cg" run --log stale.%p.log -- "$sf" > stale-run.txt 2>&1
echo "exit $?" >> stale-run.txt
"$cg" report stale.*.log > stale-report.txt 2>&1
check "stale free, default run: the kernel succeeds and the bytes are intact" \
  stale-run.txt '^kernel cudaSuccess' '^bytes_ok 1' '^exit 0'
check "stale free, default run: a double-free at the stale call, with its three stacks" \
  stale-report.txt 'double-free' 'allocation:' 'first free:' 'stale_free'

"$cg" run --log crash.%p.log -- "$sf" crash > crash-run.txt 2>&1
echo "exit $?" >> crash-run.txt
"$cg" report crash.*.log > crash-report.txt 2>&1
echo "report exit $?" >> crash-report.txt
check "crash: the launcher passes the signal on" crash-run.txt '^exit 139'
check "crash: the report says crashed by SIGSEGV, not complete" crash-report.txt 'crashed' 'SIGSEGV'

"$bu" > busy-plain.txt 2>&1
echo "exit $?" >> busy-plain.txt
check "busy unmap, plain: the kernel faults on the unmapped range" busy-plain.txt \
  '^sync cudaErrorIllegalAddress'

"$cg" run --log busy.%p.log -- "$bu" > busy-run.txt 2>&1
echo "exit $?" >> busy-run.txt
"$cg" report busy.*.log > busy-report.txt 2>&1
check "busy unmap, default run: reported at the unmap" busy-report.txt 'unmap-while-busy'
check "busy unmap, default run: the first CUDA error is named" busy-report.txt '700'

"$cg" run -e CUMEMGUARD_BUSY_CHECK=sync --log busysync.%p.log -- "$bu" > busy-sync.txt 2>&1
echo "exit $?" >> busy-sync.txt
"$cg" report busysync.*.log > busy-sync-report.txt 2>&1
check "busy unmap, BUSY_CHECK=sync: the shim waited, nothing faulted" busy-sync.txt \
  '^sync cudaSuccess'
check "busy unmap, BUSY_CHECK=sync: reported with the time waited" busy-sync-report.txt \
  'unmap-while-busy' 'synchronised after'
rm -f ./*.log
exit $status
