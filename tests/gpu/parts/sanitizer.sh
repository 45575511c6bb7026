#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The same program with planted bugs (double cudaFree, stale free after address reuse, VMM double
# release, a leak) plain, under cumemguard with stacks, and under compute-sanitizer memcheck; prints
# what each found and how long each took.   sanitizer.sh BUILD OUT
set -u
build=$1
out=$2
prog="$build/tests/integration/planted_bugs"
cg="$build/tools/cumemguard"
[ -x "$prog" ] || { echo "planted_bugs not built (no nvcc)"; exit 77; }
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
rounds=${CMG_PLANTED_ROUNDS:-300}
t() { local TIMEFORMAT='wall_s %R'; time "$@"; }
{
  echo "## plain"; t "$prog" "$rounds"
} > "$out/planted-plain.txt" 2>&1
{
  echo "## cumemguard run --stacks 16"
  t "$cg" run --stacks 16 --log "$out/planted.%p.log" -- "$prog" "$rounds"
} > "$out/planted-cumemguard.txt" 2>&1
"$cg" report "$out"/planted.*.log > "$out/planted-report.txt" 2>&1
if [ -n "$cs" ]; then
  {
    echo "## compute-sanitizer --tool memcheck --leak-check full --show-backtrace host"
    t "$cs" --tool memcheck --leak-check full --show-backtrace host "$prog" "$rounds"
  } > "$out/planted-compute-sanitizer.txt" 2>&1
else
  echo "compute-sanitizer not found" > "$out/planted-compute-sanitizer.txt"
fi
for f in plain cumemguard compute-sanitizer; do
  echo "$f: $(grep -E '^wall_s' "$out/planted-$f.txt")"
done
grep -c "finding" "$out/planted-report.txt" >/dev/null
head -5 "$out/planted-report.txt"
grep -E "ERROR SUMMARY|LEAK SUMMARY" "$out/planted-compute-sanitizer.txt"
