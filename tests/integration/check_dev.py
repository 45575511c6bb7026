#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# tools/dev as a command: help, -h and --help print the usage on stdout and exit 0; an unknown
# command, a sanitizer it does not know and a stress run without its seed range exit 64 with one
# line on stderr, before building anything (a typo such as `demo --kep` or `tset` too, with a
# did-you-mean). The demo (tests/demo/run-demo) removes its directory
# of logs when it ends, and with --keep keeps it and names it with the log's path.
#   check_dev.py --source SOURCE_ROOT --build BUILD
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)
    return cond


def run(argv, env=None):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120, env=env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    dev = os.path.join(a.source, "tools", "dev")
    text = open(dev).read()
    # The commands the dispatch knows (the case labels of its last `case "$cmd"`).
    dispatch = text[text.rindex('case "$cmd" in'):]
    commands = re.findall(r"^  ([a-z][a-z |-]*)\)", dispatch, re.M)
    commands = [c.strip() for label in commands for c in label.split("|")]
    check({"build", "test", "sanitize", "fuzz", "stress", "ci", "demo", "help"} <= set(commands),
          f"commands found in tools/dev: {commands}")
    for arg in ("help", "-h", "--help"):
        p = run([dev, arg])
        check(p.returncode == 0 and p.stderr == "" and p.stdout.startswith("Usage: tools/dev "),
              f"tools/dev {arg}: exit {p.returncode}, stdout {p.stdout[:200]!r}, "
              f"stderr {p.stderr!r}")
        for c in commands:
            if c.startswith("-"):
                continue
            check(f"tools/dev {c}" in p.stdout, f"tools/dev {arg} does not list '{c}'")
    # A typo of an option or a command stops before anything is configured or built (the build
    # directory named is never made), with a did-you-mean.
    with tempfile.TemporaryDirectory() as tmp:
        fresh = os.path.join(tmp, "never-built")
        # A command's --help is the usage, not a refused argument (demo said "takes only --keep").
        for argv in (["demo", "--help"], ["test", "-h"], ["sanitize", "--help"]):
            p = run([dev] + argv, env=dict(os.environ, CMG_BUILD_DIR=fresh))
            check(p.returncode == 0 and p.stdout.startswith("Usage: tools/dev COMMAND") and
                  not p.stderr and not os.path.exists(fresh),
                  f"tools/dev {' '.join(argv)}: exit {p.returncode} {p.stderr[-200:]!r}")
        for argv, says in ((["demo", "--kep"],
                            "demo takes only --keep, not '--kep' (did you mean --keep?)"),
                           (["tset"], "unknown command 'tset' (did you mean test?)")):
            p = run([dev] + argv, env=dict(os.environ, CMG_BUILD_DIR=fresh))
            lines = p.stderr.splitlines()
            check(p.returncode == 64 and p.stdout == "" and len(lines) == 1 and
                  says in lines[0] and not os.path.exists(fresh),
                  f"tools/dev {' '.join(argv)}: exit {p.returncode}, stdout {p.stdout[:200]!r}, "
                  f"stderr {p.stderr[-300:]!r}, build dir made: {os.path.exists(fresh)}")
    for argv, says in ((["no-such-command"], "unknown command 'no-such-command'"),
                       (["sanitize", "msan"], "sanitize needs asan or tsan, not 'msan'"),
                       (["stress"], "stress needs a seed range FIRST:LAST"),
                       (["stress", "1-5"], "stress needs a seed range FIRST:LAST, not '1-5'")):
        p = run([dev] + argv)
        lines = p.stderr.splitlines()
        check(p.returncode == 64 and p.stdout == "" and len(lines) == 1 and
              lines[0].startswith("tools/dev: ") and says in lines[0],
              f"tools/dev {' '.join(argv)}: exit {p.returncode}, stdout {p.stdout[:200]!r}, "
              f"stderr {p.stderr!r}")

    demo = os.path.join(a.source, "tests", "demo", "run-demo")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        env.pop("LD_PRELOAD", None)
        p = run([demo, a.build], env)
        left = glob.glob(os.path.join(tmp, "cumemguard-demo.*"))
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        check(p.returncode == 0 and "under cumemguard wake_ok=1, b_intact=1" in p.stdout,
              f"demo: exit {p.returncode}\n{p.stdout[-1500:]}{p.stderr[-500:]}")
        check(not left and last.startswith("Its logs were removed (the directory " + tmp) and
              "--keep" in last, f"demo: left {left}, last line {last!r}")
        # The report's sections the demo is about, in full; the rest by title (the whole report
        # made 110 of its 180 lines).
        lines = p.stdout.splitlines()
        check("  cumemguard report: 1 log, 2 findings (double-release 1, unmap-unmapped 1)" in lines and
              "  == Findings: 2 in 2 classes (double-release 1, unmap-unmapped 1)" in lines and
              "  == Resident: 2 snapshots" in lines and "  == Leaks at exit: none" in lines and
              # The range freed while asleep, said where the header counts it put to sleep.
              "      1 of the 2 ranges put to sleep is no longer asleep: freed (or mapped again) "
              "before the first call that is not part of the sleep, when this snapshot was "
              "taken" in lines and
              "  (the report goes on with: Logs; Memory by device and kind; Top allocation sites "
              "by bytes; Calls per API)" in lines and
              not any(l.startswith("  == Calls per API") for l in lines) and len(lines) < 160,
              f"demo's report: {len(lines)} lines\n" + "\n".join(lines[-60:]))
        p = run([demo, a.build, "--keep"], env)
        kept = glob.glob(os.path.join(tmp, "cumemguard-demo.*"))
        last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
        logs = glob.glob(os.path.join(kept[0], "demo.*.log")) if len(kept) == 1 else []
        check(p.returncode == 0 and len(kept) == 1 and len(logs) == 1 and
              last == f"Logs kept in {kept[0]} (the whole report: "
                      f"{os.path.join(a.build, 'tools', 'cumemguard')} report {logs[0]})",
              f"demo --keep: exit {p.returncode}, kept {kept}, logs {logs}, last line {last!r}")
        # Its status tells the truth: a guarded run that cannot start (a stale
        # CUMEMGUARD_SHIM_PATH in the caller's environment) ends it with 1 and the reason; it
        # exited 0 with "wake_ok=, b_intact=" before.
        p = run([demo, a.build], dict(env, CUMEMGUARD_SHIM_PATH="/nonexistent"))
        said = [l for l in p.stderr.splitlines() if l.startswith("run-demo:")]
        check(p.returncode == 1 and said and
              said[0] == "run-demo: the demo did not show what it should: cumemguard run exited 66",
              f"demo with a stale CUMEMGUARD_SHIM_PATH: exit {p.returncode} {said} "
              f"{p.stderr[-300:]!r}")
        p = run([demo, a.build, "--kep"], env)
        check(p.returncode == 64 and len(p.stderr.splitlines()) == 1 and
              len(glob.glob(os.path.join(tmp, "cumemguard-demo.*"))) == 1,
              f"demo --kep: exit {p.returncode}, stderr {p.stderr!r}")
    if FAILURES:
        print(f"{len(FAILURES)} failures")
        return 1
    print("ok tools/dev")
    return 0


if __name__ == "__main__":
    sys.exit(main())
