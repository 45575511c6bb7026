#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sleep-mode allocators freeing while asleep against owners of the re-issued handle values, on the
# real driver, under the shim (stacks off and on in turn): every legitimate call succeeds, every
# redundant one is answered with SUCCESS and skipped (one skipped release per free while asleep in
# the log), and a control run without the shim is reported.   vmm_race.sh BUILD OUT
set -u
build=$1
out=$2
[ -x "$build/tests/stress/vmm_race" ] || { echo "vmm_race not in the bundle"; exit 77; }
here=$(cd "$(dirname "$0")/../.." && pwd)
py="$build/tests/stress/run_vmm_race.py"
[ -f "$py" ] || py="$here/stress/run_vmm_race.py"
python3 "$py" --build "$build" --real --runs "${CMG_VMM_RACE_RUNS:-6}" \
  --iterations "${CMG_VMM_RACE_ITERATIONS:-1700}" --out "$out/vmm_race"
