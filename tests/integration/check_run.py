#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard run` as a launcher: exit statuses and signals pass through, a SIGTERM to the launcher
# reaches the program (no orphan), the default log path is absolute, and CUMEMGUARD_TORCH_ALLOC_CONF
# is applied before exec, and the logs it lists are those of its own run.
#   check_run.py CUMEMGUARD RUNTIME_CASES FAKECUDA_DIR
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
    # A sanitized build: its runtime must be preloaded first, and the launcher keeps it there.
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    if first:
        env["LD_PRELOAD"] = first
    else:
        # The shim goes first, what was preloaded keeps its order after it, except a sanitizer
        # runtime, which must stay first (paths need not exist: ld.so only warns).
        e = dict(env, LD_PRELOAD="/nonexistent/libother.so /nonexistent/libasan.so.8")
        out = subprocess.run([cg, "run", "--no-summary", "--no-log", "--", "sh", "-c",
                              'echo "$LD_PRELOAD"'], env=e, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True).stdout.strip()
        parts = out.split(":")
        if (len(parts) != 3 or parts[0] != "/nonexistent/libasan.so.8"
                or not parts[1].endswith("libcumemguard.so") or parts[2] != "/nonexistent/libother.so"):
            fail(f"LD_PRELOAD given to the program: {out!r}")
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
    for bad in ("abc", "100"):
        p = run(["--stacks", bad, "--", "true"])
        if p.returncode != 64 or "--stacks" not in p.stderr or "keeping" in p.stderr:
            fail(f"--stacks {bad}: {p.returncode} {p.stderr!r}")
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
    # Only this run's logs are listed: a log left in the same directory by another run (same
    # pattern, fresh mtime) is not, because its header carries another CUMEMGUARD_RUN_ID.
    prog, fake = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    with tempfile.TemporaryDirectory() as d:
        other = os.path.join(d, "cumemguard.runtime_cases.1.log")
        with open(other, "w") as f:
            f.write('{"cumemguard_log":1,"tool":"0","pid":1,"options":{"CUMEMGUARD_RUN_ID":"x"}}\n')
        e = dict(env, LD_LIBRARY_PATH=fake)
        p = subprocess.run([cg, "run", "--no-summary", "--", prog, "P29"], env=e, cwd=d,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        listed = [l for l in p.stderr.splitlines() if l.startswith("cumemguard: 1 log: ")]
        logs = sorted(f for f in os.listdir(d) if f != os.path.basename(other))
        if p.returncode != 0 or len(logs) != 1 or len(listed) != 1 or \
                listed[0] != "cumemguard: 1 log: " + os.path.join(d, logs[0]):
            fail(f"log listing: rc {p.returncode}, files {logs}, stderr {p.stderr!r}")
        hdr = open(os.path.join(d, logs[0])).readline()
        if '"CUMEMGUARD_RUN_ID":"' not in hdr:
            fail(f"log header without the run id: {hdr!r}")
    print("ok")


if __name__ == "__main__":
    main()
