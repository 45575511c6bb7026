#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs tests/stress/vmm_race.cpp (sleep-mode allocators freeing while asleep, racing with owners of
# the re-issued handle values) under the shim, RUNS times, with stacks off and on in turn, and
# checks each run: exit 0, every legitimate call succeeded, every redundant call was answered with
# SUCCESS, none reached the driver, nothing left live, and the event log records one skipped
# release per free while asleep. A control run without the shim must fail on the fake driver
# (values are re-issued last released first): it proves the test can see the race.
#   run_vmm_race.py --build DIR [--runs N] [--iterations N] [--real] [--out DIR]
# --real: the real driver (gpu suite): the control run is reported, not required to fail.
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

COUNTS = re.compile(r"legit_calls=(\d+) legit_failed=(\d+) redundant_calls=(\d+) "
                    r"redundant_failed=(\d+) redundant_forwarded=(\d+) live_at_end=(-?\d+)")


def run(build, iterations, env_extra, shim, timeout, log=None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUMEMGUARD_", "FAKECUDA_", "LD_PRELOAD"))}
    env.update(env_extra)
    if shim:
        first = os.environ.get("CMG_PRELOAD_FIRST", "")
        env["LD_PRELOAD"] = ":".join(p for p in (first, os.path.join(build, "shim", "libcumemguard.so")) if p)
    if log:
        env["CUMEMGUARD_LOG"] = log
    p = subprocess.run([os.path.join(build, "tests", "stress", "vmm_race"), str(iterations)],
                       env=env, capture_output=True, text=True, timeout=timeout)
    m = COUNTS.search(p.stdout)
    return p, (tuple(int(x) for x in m.groups()) if m else None)


def skipped_releases(log):
    n = 0
    with open(log) as f:
        for line in f:
            if '"api":"cuMemRelease"' in line and '"k":"call"' in line and '"skipped":true' in line:
                n += 1
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=1700)
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    timeout = int(120 * float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1")))
    env = {}
    if not a.real:
        fake = os.path.join(a.build, "tests", "fakecuda")
        env["LD_LIBRARY_PATH"] = fake + (":" + os.environ["LD_LIBRARY_PATH"]
                                         if os.environ.get("LD_LIBRARY_PATH") else "")
    failures = 0
    totals = [0] * 6
    made = not a.out
    out = a.out or tempfile.mkdtemp(prefix="cmg-vmm-race-")
    os.makedirs(out, exist_ok=True)
    for i in range(a.runs):
        stacks = "16" if i % 2 else "0"
        log = os.path.join(out, f"race.{i}.log")
        p, c = run(a.build, a.iterations, dict(env, CUMEMGUARD_STACKS=stacks), True, timeout, log)
        problems = []
        if c is None:
            problems.append(f"no counts (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        else:
            legit, legit_failed, red, red_failed, red_fwd, live = c
            for k in range(6):
                totals[k] += max(c[k], 0)
            if p.returncode != 0:
                problems.append(f"exit {p.returncode}")
            if legit_failed or red_failed or red_fwd or live > 0:
                problems.append(p.stdout.strip())
            skipped = skipped_releases(log)
            if skipped != red // 2:
                problems.append(f"log: {skipped} skipped releases, {red // 2} frees while asleep")
        if problems:
            failures += 1
            print(f"FAIL run {i} (stacks {stacks}): " + "; ".join(problems))
        else:
            os.unlink(log)
    print(f"vmm_race: {a.runs} runs under the shim, {failures} failed; legitimate calls "
          f"{totals[0]}, failed {totals[1]}; redundant calls {totals[2]}, failed {totals[3]}, "
          f"reached the driver {totals[4]}; objects live at the end {totals[5]}")
    p, c = run(a.build, a.iterations, env, False, timeout)
    print(f"control without the shim: exit {p.returncode}: {p.stdout.strip()}")
    if not a.real and (c is None or p.returncode != 1 or not (c[1] or c[3])):
        print("FAIL: the control run without the shim did not fail; the test cannot see the race")
        failures += 1
    # The logs of failed runs are kept where the lines above say; nothing else is left in TMPDIR.
    if made and (failures or os.environ.get("CMG_KEEP_TMP") == "1"):
        print(f"files kept in {out}")
    elif made:
        shutil.rmtree(out, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
