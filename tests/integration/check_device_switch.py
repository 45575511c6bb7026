#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The device the shim records for each allocation is the driver's answer, however the thread's
# current context changed before it (tests/programs/device_switch.cpp, two fake devices): the
# program's own lines give the driver's device per pointer, the log the shim's.
#
#   check_device_switch.py --build DIR PROGRAM
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

# What each step must allocate on (real-driver.md section 5; the fake models it).
WANT = {
    "set-device-0": 0, "set-device-1": 1, "set-device-1-driver": 1, "ctx-set-current-0": 0,
    "ctx-set-current-0-runtime": 0, "ctx-push-1": 1, "ctx-pop-back-to-0": 0, "ctx-create-1": 1,
    "set-null-pops-to-0": 0, "ctx-push-created-1": 1, "destroy-pops-to-0": 0, "new-thread": 0,
    "new-thread-set-device-1": 1, "other-thread-ctx-set-current-1": 1, "main-thread-still-0": 0,
    "set-device-1-again": 1,
}


def fail(msg):
    print(f"FAIL: {msg}")
    return 1


def run(argv, env):
    timeout = 60 * float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))
    return subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def allocs(out):
    """(step, pointer, driver's device) per "alloc PTR DEV STEP" line."""
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "alloc":
            rows.append((parts[3], int(parts[1], 16), int(parts[2])))
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("program")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    prog = os.path.join(build, "tests", "integration", a.program)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUMEMGUARD_", "FAKECUDA_")) and k not in ("RANK", "LD_PRELOAD")}
    fake = os.path.join(build, "tests", "fakecuda")
    env["LD_LIBRARY_PATH"] = fake + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["FAKECUDA_DEVICES"] = "2"
    p = run([prog], env)
    if p.returncode != 0:
        return fail(f"without the shim: exit {p.returncode}\n{p.stderr}")
    plain = allocs(p.stdout)
    got = {step: dev for step, _, dev in plain}
    if got != WANT:
        return fail(f"the driver's devices without the shim: {got}")
    tmp = tempfile.mkdtemp(prefix="cmg-device-switch-")
    log = os.path.join(tmp, "run.log")
    senv = dict(env)
    # CMG_TEST_SHIM: another build of the shim (an older commit's, to see the check fail there).
    shim = os.environ.get("CMG_TEST_SHIM") or os.path.join(build, "shim", "libcumemguard.so")
    # A sanitized build's runtime first (CMG_PRELOAD_FIRST), as in every process of its tests.
    senv["LD_PRELOAD"] = ":".join(x for x in (os.environ.get("CMG_PRELOAD_FIRST", ""), shim) if x)
    senv["CUMEMGUARD_LOG"] = log
    p = run([prog], senv)
    if p.returncode != 0:
        return fail(f"with the shim: exit {p.returncode}\n{p.stderr}")
    rows = allocs(p.stdout)
    if [(s, d) for s, _, d in rows] != [(s, d) for s, _, d in plain]:
        return fail(f"the shim changed the driver's answers: {rows} != {plain}")
    recorded = {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if (r.get("k") == "call" and r.get("res") == 0 and r.get("delta", 0) > 0 and
                    r["api"] in ("cudaMalloc", "cuMemAlloc_v2")):
                recorded[int(r["args"]["ptr"], 16)] = r["dev"]
    wrong = [(step, dev, recorded.get(ptr)) for step, ptr, dev in rows if recorded.get(ptr) != dev]
    if wrong:
        print(f"(log kept in {tmp})")
        return fail("recorded device differs from the driver's (step, driver, shim): " +
                    ", ".join(f"{s} {d} {r}" for s, d, r in wrong))
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"ok {a.program}: {len(rows)} allocations on the driver's device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
