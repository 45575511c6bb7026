#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The in-process A/B benchmark (benchmarks/ab.cpp, docs/performance.md "Method") on the real driver,
# for each profile: control (no shim: must read 1.00), tracking only (the guard profile of plain
# LD_PRELOAD) with and without the busy check at unmap, the guard profile with the event log on,
# what `cumemguard run` does by default (the debugging profile and the log) with and without its
# quarantine, and the debugging profile without a log.
#   tests/gpu/ab.sh BUILD_DIR OUT_DIR [ROUNDS]     writes OUT_DIR/ab.txt
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${2:-$build/gpu-ab}
rounds=${3:-30}
mkdir -p "$out"
bench="$build/benchmarks/cmg-bench-ab"
[ -x "$bench" ] || { echo "cmg-bench-ab not built"; exit 77; }
if [ -z "${CMG_AB_FAKE:-}" ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu ab: no GPU here; skipped"
    exit 77
  fi
  . "$here/libpath.sh"
fi
shim="$build/shim/libcumemguard.so"
run() {
  local name=$1
  shift
  echo "## $name: $*"
  env -u LD_PRELOAD "$@" "$bench" --rounds "$rounds"
  echo
}
{
  run control
  run tracking LD_PRELOAD="$shim"
  # What the busy check at unmap (one cuStreamQuery) costs: the same profile without it.
  run tracking-busy-off LD_PRELOAD="$shim" CUMEMGUARD_BUSY_CHECK=off
  run tracking+log LD_PRELOAD="$shim" CUMEMGUARD_LOG="$out/ab.%p.log"
  # shellcheck disable=SC2086
  run run-default LD_PRELOAD="$shim" ${CMG_AB_DEBUG_ENV:-CUMEMGUARD_PROFILE=debug} CUMEMGUARD_LOG="$out/ab.%p.log"
  # What the quarantine costs inside the default run: the same without it.
  # shellcheck disable=SC2086
  run run-default-no-quarantine LD_PRELOAD="$shim" ${CMG_AB_DEBUG_ENV:-CUMEMGUARD_PROFILE=debug} CUMEMGUARD_QUARANTINE=0 CUMEMGUARD_LOG="$out/ab.%p.log"
  # shellcheck disable=SC2086
  run debug-no-log LD_PRELOAD="$shim" ${CMG_AB_DEBUG_ENV:-CUMEMGUARD_PROFILE=debug}
} > "$out/ab.txt" 2>&1
rm -f "$out"/ab.*.log
cat "$out/ab.txt"
