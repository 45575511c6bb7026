#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The demo's exit status tells the truth: on this machine (the fake CUDA stack) it shows the
# wake-up failing without the shim and succeeding under it, with the report, and exits 0; when its
# guarded run cannot start (a stale CUMEMGUARD_SHIM_PATH in the caller's environment) it says what
# went wrong and exits 1 (it exited 0 with "wake_ok=, b_intact=" before).
#   check_demo.py RUN_DEMO BUILD_DIR
import os
import subprocess
import sys

demo, build = sys.argv[1], sys.argv[2]
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def run(extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CUMEMGUARD_") and k != "LD_PRELOAD"}
    env.update(extra)
    return subprocess.run(["bash", demo, build], capture_output=True, text=True, env=env,
                          timeout=300)


ok = run({})
want = ("Result: wake-up after a free while asleep: without cumemguard wake_ok=0, b_intact=0; "
        "under cumemguard wake_ok=1, b_intact=1")
check(ok.returncode == 0 and want in ok.stdout and "==== 3. cumemguard report --top 2 " in ok.stdout
      and "run-demo:" not in ok.stderr,
      f"demo: rc {ok.returncode} {ok.stdout[-400:]!r} {ok.stderr[-300:]!r}")
bad = run({"CUMEMGUARD_SHIM_PATH": "/nonexistent"})
said = [l for l in bad.stderr.splitlines() if l.startswith("run-demo:")]
check(bad.returncode == 1 and said and
      said[0] == "run-demo: the demo did not show what it should: cumemguard run exited 66",
      f"demo with a stale CUMEMGUARD_SHIM_PATH: rc {bad.returncode} {said} {bad.stderr[-300:]!r}")
if fails:
    sys.exit(1)
print("ok")
