#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The exit paths on the real driver (docs/reliability.md, "Exit and signal paths"):
#   exit_paths.sh BUILD OUT
#  * sigterm-churn park: a SIGTERM handler calls exit() while four threads churn heap blocks,
#    linear memory and VMM cycles, under `cumemguard run` (the quarantine holds frees) and without
#    the shim, 10 runs each; the program stops its other threads in an atexit handler before the
#    libraries' destructors run ("park": on the real driver an exit() while threads still call
#    CUDA crashes in libcudart without the shim too, 8 of 10 plain runs in docs/gpu/run-7.txt):
#    every run exits 0 within 60 s, the shim allocates nothing on the exiting thread after exit
#    began (no "exit-alloc:" line; exit_alloc.h counts the shim's allocations only: libcudart's
#    destructors free from __cxa_finalize with or without the shim, docs/gpu/run-5.txt), each log
#    ends with one summary and `end`;
#  * exit-two park: two threads call exit() at once, 10 runs under LD_PRELOAD and 10 without:
#    every run exits 0 and every log has its summary and `end`;
#  * armed-calls: the check itself on the real libraries: an armed thread's calls through the shim
#    abort at the shim's first allocation, naming the shim; without the shim all 512 succeed.
set -u
build=$1
out=$2
prog="$build/tests/reliability/exit_cases"
shim="$build/shim/libcumemguard.so"
cg="$build/tools/cumemguard"
[ -x "$prog" ] && [ -f "$shim" ] && [ -x "$cg" ] || { echo "exit_cases or the shim not built"; exit 77; }
work=$(mktemp -d)
bad=0
check_log() {  # DIR: one log ending with one summary and `end`
  python3 - "$1" <<'PYEOF'
import glob, json, sys
logs = glob.glob(sys.argv[1] + "/log.*")
if len(logs) != 1:
    sys.exit(f"logs {logs}")
kinds = [json.loads(l).get("k") for l in open(logs[0], "rb").read().split(b"\n") if l.strip()]
if kinds[-1] != "end" or kinds.count("summary") != 1:
    sys.exit(f"{logs[0]} ends {kinds[-3:]}")
PYEOF
}
one() {  # NAME CASE HOW: HOW is run, preload or plain
  local d="$work/$1"
  mkdir -p "$d"
  case "$3" in
    run) timeout 60 "$cg" run --log "$d/log.%p" -- "$prog" $2 > /dev/null 2> "$d/err" ;;
    preload) LD_PRELOAD="$shim" CUMEMGUARD_LOG="$d/log.%p" CUMEMGUARD_SUMMARY=1 timeout 60 \
               "$prog" $2 > /dev/null 2> "$d/err" ;;
    plain) timeout 60 "$prog" $2 > /dev/null 2> "$d/err" ;;
  esac
  local rc=$?
  local why=""
  [ $rc -eq 0 ] || why="exit $rc"
  grep -q "exit-alloc:" "$d/err" && why="$why allocated after exit began"
  if [ "$3" != plain ] && [ -z "$why" ]; then why=$(check_log "$d" 2>&1); fi
  if [ -n "$why" ]; then
    echo "$1: $why"; head -20 "$d/err"; bad=$((bad + 1))
  fi
}
for i in $(seq 10); do
  one "churn-run-$i" "sigterm-churn park" run
  one "churn-plain-$i" "sigterm-churn park" plain
  one "two-$i" "exit-two park" preload
  one "two-plain-$i" "exit-two park" plain
done
# The check sees the shim's allocations and lets the real libraries' own through.
d="$work/armed"; mkdir -p "$d"
# (In a subshell: the shell's own "Aborted" line is not part of the part's output.)
(LD_PRELOAD="$shim" CUMEMGUARD_LOG="$d/log.%p" timeout 60 "$prog" armed-calls > "$d/out-shim" \
   2> "$d/err-shim"; exit $?) 2> /dev/null
rc=$?
if [ $rc -ne 134 ] || ! grep -q "^exit-alloc: .* by the shim on a thread that began exit" "$d/err-shim" \
   || ! grep -q "libcumemguard.so" "$d/err-shim"; then
  echo "armed-calls with the shim: exit $rc, expected 134 and the shim named"; head -20 "$d/err-shim"
  bad=$((bad + 1))
fi
timeout 60 "$prog" armed-calls > "$d/out-plain" 2> "$d/err-plain"
rc=$?
if [ $rc -ne 0 ] || ! grep -qx "calls_ok 512" "$d/out-plain"; then
  echo "armed-calls without the shim: exit $rc, $(tr '\n' ' ' < "$d/out-plain")"; head -20 "$d/err-plain"
  bad=$((bad + 1))
fi
echo "armed-calls: others $(sed -n 's/^others //p' "$d/out-plain") (1: the libraries under the shim allocated on the armed thread and passed)"
echo "exit paths: $bad of 42 runs failed"
rm -rf "$work"
[ $bad -eq 0 ]
