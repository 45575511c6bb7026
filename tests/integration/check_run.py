#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard run` as a launcher: exit statuses and signals pass through, a SIGTERM to the launcher
# reaches the program (no orphan), the default log path is absolute, and CUMEMGUARD_TORCH_ALLOC_CONF
# is applied before exec.   check_run.py CUMEMGUARD
import os
import signal
import subprocess
import sys
import tempfile
import time


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def main():
    cg = os.path.abspath(sys.argv[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_")}
    run = lambda args, **kw: subprocess.run([cg, "run", "--no-summary"] + args, env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True, **kw)
    p = run(["--", "sh", "-c", "exit 7"])
    if p.returncode != 7:
        fail(f"exit status {p.returncode}, expected 7")
    p = run(["--", "sh", "-c", "kill -TERM $$"])
    if p.returncode != -signal.SIGTERM:
        fail(f"a program killed by SIGTERM gave {p.returncode}, expected the launcher to die of it")
    p = run(["--", "/nonexistent/prog"])
    if p.returncode != 127 or "cannot run" not in p.stderr:
        fail(f"missing program: {p.returncode} {p.stderr!r}")
    p = run(["--frobnicate", "--", "true"])
    if p.returncode != 64 or "unknown option" not in p.stderr:
        fail(f"bad option: {p.returncode} {p.stderr!r}")
    # SIGTERM to the launcher is passed on to the program.
    with tempfile.TemporaryDirectory() as d:
        pidfile = os.path.join(d, "pid")
        launcher = subprocess.Popen([cg, "run", "--no-summary", "--", "sh", "-c",
                                     f"echo $$ > {pidfile}; exec sleep 30"], env=env)
        for _ in range(100):
            if os.path.exists(pidfile) and open(pidfile).read().strip():
                break
            time.sleep(0.05)
        child = int(open(pidfile).read())
        launcher.send_signal(signal.SIGTERM)
        rc = launcher.wait(timeout=10)
        time.sleep(0.2)
        try:
            os.kill(child, 0)
            alive = True
        except ProcessLookupError:
            alive = False
        if alive:
            os.kill(child, signal.SIGKILL)
            fail("the program outlived the launcher after SIGTERM")
        if rc != -signal.SIGTERM:
            fail(f"launcher exit {rc} after SIGTERM")
        # The default log pattern is absolute (a program that changes directory still logs there).
        out = subprocess.run([cg, "run", "--no-summary", "--", "sh", "-c", 'echo "$CUMEMGUARD_LOG"'],
                             env=env, cwd=d, stdout=subprocess.PIPE, text=True).stdout.strip()
        if not out.startswith(d + "/cumemguard.sh.") or not out.endswith(".%p.log"):
            fail(f"default log pattern {out!r}")
    # The allocator override is in the environment the program starts with.
    e = dict(env, CUMEMGUARD_TORCH_ALLOC_CONF="expandable_segments:False",
             PYTORCH_CUDA_ALLOC_CONF="max_split_size_mb:512,garbage_collection_threshold:0.8,"
                                     "expandable_segments:True")
    out = subprocess.run([cg, "run", "--no-summary", "--no-log", "--", "sh", "-c",
                          'echo "$PYTORCH_CUDA_ALLOC_CONF"'], env=e, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True).stdout.strip()
    want = "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:False"
    if out != want:
        fail(f"override before exec: {out!r}, expected {want!r}")
    print("ok")


if __name__ == "__main__":
    main()
