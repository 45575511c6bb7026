#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The exit paths on the real driver (docs/reliability.md, "Exit and signal paths"):
#   exit_paths.sh BUILD OUT
#  * sigterm-churn park: a SIGTERM handler calls exit() while four threads churn heap blocks,
#    linear memory and VMM cycles, under `cumemguard run` (the quarantine holds frees) and without
#    the shim, 10 runs each; the program stops its other threads in an atexit handler before the
#    libraries' destructors run ("park": without it an exit() while threads still call CUDA
#    crashed in libcudart without the shim in 8 of 10 runs, docs/gpu/run-7.txt);
#  * exit-two park: two threads call exit() at once, 10 runs under LD_PRELOAD and 10 without.
#  Every run with the shim that exits 0 has one log ending with one summary and `end`; no run has
#  the shim allocate on the exiting thread after exit began ("exit-alloc:"; exit_alloc.h counts the
#  shim's allocations only: libcudart's destructors free from __cxa_finalize with or without the
#  shim, docs/gpu/run-5.txt); a run that hangs (20 s) has its threads' stacks printed, and says
#  whether the shim is on one; runs with the shim crash or hang no more often than without it
#  (plus two in ten: what ten runs resolve; run-8: the program alone 2 and 5 of 10);
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
# A run that has not ended after 20 s hangs (a run takes about a second): the stacks of its
# threads are kept (gdb, else eu-stack, else each thread's system call) so that the report can say
# whether the shim is on the hung thread, then it is killed.
stuck_stacks() {  # PID FILE
  local p=$1
  local kid
  kid=$(pgrep -P "$p" | head -1)  # under `cumemguard run` the program is the launcher's child
  [ -n "$kid" ] && p=$kid
  if command -v gdb > /dev/null; then
    timeout 30 gdb -p "$p" -batch -ex "thread apply all bt 30" > "$2" 2>&1
  elif command -v eu-stack > /dev/null; then
    timeout 30 eu-stack -p "$p" > "$2" 2>&1
  else
    for t in /proc/"$p"/task/*; do echo "$t $(cat "$t/syscall" 2>/dev/null) $(cat "$t/wchan" 2>/dev/null)"; done > "$2"
  fi
}
declare -A fails
one() {  # NAME CASE HOW: HOW is run, preload or plain
  local d="$work/$1"
  mkdir -p "$d"
  case "$3" in
    run) "$cg" run --log "$d/log.%p" -- "$prog" $2 > /dev/null 2> "$d/err" & ;;
    preload) LD_PRELOAD="$shim" CUMEMGUARD_LOG="$d/log.%p" CUMEMGUARD_SUMMARY=1 \
               "$prog" $2 > /dev/null 2> "$d/err" & ;;
    plain) "$prog" $2 > /dev/null 2> "$d/err" & ;;
  esac
  local pid=$! waited=0
  while kill -0 "$pid" 2> /dev/null && [ $waited -lt 200 ]; do sleep 0.1; waited=$((waited + 1)); done
  local hung=0
  if kill -0 "$pid" 2> /dev/null; then
    hung=1; stuck_stacks "$pid" "$d/stacks"
    pkill -KILL -P "$pid" 2> /dev/null; kill -KILL "$pid" 2> /dev/null
  fi
  wait "$pid" 2> /dev/null
  local rc=$?
  [ $hung -eq 1 ] && rc=124
  local why="" hard=""
  [ $rc -eq 0 ] || why="exit $rc"
  grep -q "exit-alloc:" "$d/err" && hard="allocated after exit began"
  if [ "$3" != plain ] && [ $rc -eq 0 ]; then hard=$(check_log "$d" 2>&1); fi
  if [ $hung -eq 1 ] && grep -q "libcumemguard" "$d/stacks" 2> /dev/null; then
    why="$why (the shim is on a hung thread's stack)"
  fi
  if [ -n "$hard" ]; then
    echo "$1: $why $hard"; head -20 "$d/err"; bad=$((bad + 1))
  elif [ -n "$why" ]; then
    echo "$1: $why"
    [ -f "$d/stacks" ] && head -60 "$d/stacks"  # gdb's, eu-stack's or each thread's system call
    fails[$4]=$(( ${fails[$4]:-0} + 1 ))
  fi
}
for i in $(seq 10); do
  one "churn-run-$i" "sigterm-churn park" run churn-shim
  one "churn-plain-$i" "sigterm-churn park" plain churn-plain
  one "two-$i" "exit-two park" preload two-shim
  one "two-plain-$i" "exit-two park" plain two-plain
done
# A crash or hang of the program itself: exit() from a signal handler (or from two threads) is not
# async-signal-safe, and on the real driver the program crashes or hangs in libcudart's teardown
# without the shim too (run-8: sigterm-churn 2 of 10, exit-two 5 of 10). With ten runs of each the
# real driver resolves only a difference of more than two runs; the fake's 40-run cases in the
# suite are the strong test. Runs with the shim fail no more than without it, plus two.
for c in churn two; do
  s=${fails[$c-shim]:-0}; p=${fails[$c-plain]:-0}
  echo "$c: crashed or hung with the shim $s of 10, without it $p of 10"
  if [ "$s" -gt $((p + 2)) ]; then echo "$c: the shim is worse than the program without it"; bad=$((bad + 1)); fi
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
echo "exit paths: $bad failed (exit-alloc, broken logs, rates; of 40 runs, 2 armed checks, 2 rates)"
rm -rf "$work"
[ $bad -eq 0 ]
