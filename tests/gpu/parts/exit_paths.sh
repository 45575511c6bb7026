#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The exit paths on the real driver (docs/reliability.md, "Exit and signal paths"):
#   exit_paths.sh BUILD OUT
#  * sigterm-churn: a SIGTERM handler calls exit() while four threads churn heap blocks, linear
#    memory and VMM cycles, under `cumemguard run` (the quarantine holds frees) and without the
#    shim, 10 runs each: every run exits 0 within 60 s, nothing is allocated by the exiting thread
#    after exit began (no "exit-alloc:" line), each log ends with one summary and `end`;
#  * exit-two: two threads call exit() at once, 10 runs under LD_PRELOAD: every log has its summary
#    and `end`.
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
    run) timeout 60 "$cg" run --log "$d/log.%p" -- "$prog" "$2" > /dev/null 2> "$d/err" ;;
    preload) LD_PRELOAD="$shim" CUMEMGUARD_LOG="$d/log.%p" CUMEMGUARD_SUMMARY=1 timeout 60 \
               "$prog" "$2" > /dev/null 2> "$d/err" ;;
    plain) timeout 60 "$prog" "$2" > /dev/null 2> "$d/err" ;;
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
  one "churn-run-$i" sigterm-churn run
  one "churn-plain-$i" sigterm-churn plain
  one "two-$i" exit-two preload
done
echo "exit paths: $bad of 30 runs failed"
rm -rf "$work"
[ $bad -eq 0 ]
