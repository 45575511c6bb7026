#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard run` as CI and as sanitizer users run it, on the fake CUDA stack: --version
# everywhere, --error-exitcode and --fail-on-leaks, the debug profile the launcher sets, SIGINT,
# SIGQUIT and SIGHUP passed on, `--log --` refused, -e values that cannot apply refused, the exit
# summary after the program's own output on a pipe and naming leaks, suppressions (a vendor's
# finding silenced and counted, the program's own kept; --suppressions; an unreadable file stops
# the run), one rule for -e and the environment, a log name whose %q{VAR} is not set refused
# (64), each finding's stacks under its line (a Python
# program's own frames in them; not with --brief or a plain LD_PRELOAD), a program built with
# -fsanitize=address whose runtime the launcher puts first, and a script whose interpreter is a
# FIFO.
#   check_launcher.py --cg CUMEMGUARD --build BUILD_DIR [--sanitized PROGRAM]
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)
    return cond


def records(path):
    out = []
    for line in open(path, errors="replace"):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class Env:
    def __init__(self, a):
        self.cg = os.path.abspath(a.cg)
        b = os.path.abspath(a.build)
        self.rt = os.path.join(b, "tests", "integration", "runtime_cases")
        self.supp = os.path.join(b, "tests", "integration", "suppress_cases")
        self.shim = os.path.join(b, "shim", "libcumemguard.so")
        self.sanitized = os.path.abspath(a.sanitized) if a.sanitized else None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_")}
        self.env["LD_LIBRARY_PATH"] = os.path.join(b, "tests", "fakecuda")
        first = os.environ.get("CMG_PRELOAD_FIRST", "")
        self.env.pop("LD_PRELOAD", None)
        if first:
            self.env["LD_PRELOAD"] = first
        self.tmp = tempfile.mkdtemp(prefix="cmg-launcher-")

    def run(self, args, extra=None, cwd=None, merge=False, timeout=120):
        env = dict(self.env, **(extra or {}))
        p = subprocess.run([self.cg] + args, env=env, cwd=cwd or self.tmp, timeout=timeout,
                           stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                           errors="replace")
        return p

    def logdir(self):
        return tempfile.mkdtemp(dir=self.tmp)


def versions(e):
    for sub in ([], ["run"], ["config"], ["report"]):
        p = e.run(sub + ["--version"])
        want = "cumemguard " + (sub[0] + " " if sub else "")
        check(p.returncode == 0 and p.stdout.startswith(want) and p.stdout.count("\n") == 1,
              f"{sub} --version: rc {p.returncode} {p.stdout!r} {p.stderr!r}")
    p = e.run(["version", "--help"])
    check(p.returncode == 0 and p.stdout.startswith("Usage: cumemguard version\n"),
          f"version --help: {p.stdout!r}")
    p = e.run(["version", "--bogus"])
    check(p.returncode == 64 and "unexpected argument '--bogus'" in p.stderr,
          f"version --bogus: rc {p.returncode} {p.stderr!r}")
    p = e.run(["run", "--help"])
    check(p.returncode == 0 and "Exit status:" in p.stdout and "--error-exitcode N" in p.stdout,
          f"run --help lists exit codes: {p.stdout[:200]!r}")


def usage_errors(e):
    d = e.logdir()
    p = e.run(["run", "--log", "--", "true"], cwd=d)
    check(p.returncode == 64 and "--log needs a value" in p.stderr and not os.listdir(d),
          f"--log --: rc {p.returncode} {p.stderr!r} files {os.listdir(d)}")
    for args, words in ((["--error-exitcode", "x"], "0 to 255"),
                        (["--fail-on-leaks"], "needs --error-exitcode"),
                        (["--suppressions"], "--suppressions needs a value"),
                        (["--suppressions", "a", "--suppressions", "b"], "takes one file"),
                        (["-e", "CUMEMGUARD_ACTION_LEAK=abort"], "abort cannot apply to leak"),
                        (["-e", "CUMEMGUARD_ACTION_FREE_EXPORTED=skip"],
                         "skip cannot apply to free-exported"),
                        (["-e", "CUMEMGUARD_OPTIONS=stacks=99"], "must be between 0 and 64")):
        p = e.run(["run"] + args + ["--", "true"])
        lines = p.stderr.splitlines()
        check(p.returncode == 64 and len(lines) == 1 and words in lines[0],
              f"run {args}: rc {p.returncode} {p.stderr!r}")
    # A misspelt long option is named with the closest one, by each command.
    for sub, arg, want in ((["run"], "--lgo", "--log"), (["run"], "--no-sumary", "--no-summary"),
                           (["report"], "--jsno", "--json"), (["config"], "--jsno", "--json")):
        p = e.run(sub + [arg, "--", "true"])
        want_line = (f"cumemguard {sub[0]}: unknown option '{arg}' (did you mean {want}?) (see "
                     f"cumemguard {sub[0]} --help)")
        check(p.returncode == 64 and p.stderr.splitlines()[:1] == [want_line],
              f"{sub} {arg}: rc {p.returncode} {p.stderr!r}")
    # --log '' is no path: a usage error that names --no-log (an empty CUMEMGUARD_LOG means no log,
    # and the default log used to be written).
    d = e.logdir()
    p = e.run(["run", "--log", "", "--", e.rt, "basic"], cwd=d)
    check(p.returncode == 64 and p.stderr == "cumemguard run: --log needs a path (use --no-log for "
          "no log)\n" and not os.listdir(d), f"--log '': rc {p.returncode} {p.stderr!r} "
          f"{os.listdir(d)}")
    p = e.run(["run", "--", "true"], extra={"CUMEMGUARD_SHIM_PATH": "/nonexistent/lib.so"})
    check(p.returncode == 66 and "CUMEMGUARD_SHIM_PATH=/nonexistent/lib.so is not a file" in p.stderr,
          f"missing CUMEMGUARD_SHIM_PATH: rc {p.returncode} {p.stderr!r}")


def exit_codes(e):
    d = e.logdir()
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--", e.rt, "P29"], cwd=d)
    check(p.returncode == 3 and "1 finding in this run; exiting 3 (--error-exitcode)" in p.stderr,
          f"P29 with --error-exitcode 3: rc {p.returncode} {p.stderr[-300:]!r}")
    p = e.run(["run", "--no-summary", "--", e.rt, "P29"], cwd=d)
    check(p.returncode == 0, f"P29 without --error-exitcode: rc {p.returncode}")
    # Each process tells the launcher its counts: no log is needed for the status.
    p = e.run(["run", "--no-summary", "--no-log", "--error-exitcode", "3", "--", e.rt, "P29"],
              cwd=d)
    check(p.returncode == 3 and "1 finding in this run; exiting 3 (--error-exitcode)" in p.stderr,
          f"P29 with --no-log --error-exitcode 3: rc {p.returncode} {p.stderr[-300:]!r}")
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--", e.rt, "basic"], cwd=d)
    check(p.returncode == 0, f"basic with --error-exitcode: rc {p.returncode} {p.stderr!r}")
    # No CUDA, no log, no findings: the program's own status.
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--", "sh", "-c", "exit 5"], cwd=d)
    check(p.returncode == 5, f"a program without CUDA: rc {p.returncode} {p.stderr!r}")
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--", e.rt, "leak"], cwd=d)
    check(p.returncode == 0, f"leak without --fail-on-leaks: rc {p.returncode} {p.stderr!r}")
    p = e.run(["run", "--no-summary", "--error-exitcode", "4", "--fail-on-leaks", "--", e.rt,
               "leak"], cwd=d)
    check(p.returncode == 4 and "(leaks at exit included)" in p.stderr,
          f"leak with --fail-on-leaks: rc {p.returncode} {p.stderr[-300:]!r}")
    # The findings count wins over the program's status; a signal still kills the launcher.
    p = e.run(["run", "--no-summary", "--error-exitcode=9", "--", "sh", "-c",
               f"{e.rt} P29 >/dev/null; exit 2"], cwd=d)
    check(p.returncode == 9, f"findings and exit 2: rc {p.returncode}")


def profile(e):
    show = ["--", "sh", "-c", 'echo "p=$CUMEMGUARD_PROFILE"']
    p = e.run(["run", "--no-summary", "--no-log"] + show)
    check(p.stdout.strip() == "p=debug", f"run sets the debug profile: {p.stdout!r}")
    p = e.run(["run", "--no-summary", "--no-log"] + show, extra={"CUMEMGUARD_PROFILE": "guard"})
    check(p.stdout.strip() == "p=guard", f"a profile the user set stays: {p.stdout!r}")
    p = e.run(["run", "--no-summary", "--no-log"] + show,
              extra={"CUMEMGUARD_OPTIONS": "profile=guard"})
    check(p.stdout.strip() == "p=", f"a profile in CUMEMGUARD_OPTIONS stays: {p.stdout!r}")
    # Its effect: stacks at the finding and its earlier events, and the stale free caught
    # because the freed address is held back (QUARANTINE=auto).
    d = e.logdir()
    p = e.run(["run", "--no-summary", "--log", os.path.join(d, "p30.log"), "--", e.rt, "P30"])
    out = dict(l.split(" ", 1) for l in p.stdout.splitlines() if " " in l)
    check(p.returncode == 0 and out.get("reused") == "0",
          f"P30 under the debug profile: rc {p.returncode} {p.stdout!r}")
    recs = records(os.path.join(d, "p30.log"))
    fs = [r for r in recs if r.get("k") == "finding"]
    check(len(fs) == 1 and fs[0]["class"] == "double-free" and "stack" in fs[0] and
          all("stack" in r for r in fs[0].get("related", []) if "seq" in r),
          f"P30 finding with stacks: {fs}")
    hdr = recs[0] if recs else {}
    check(hdr.get("profile") == "debug", f"log header names the profile: {hdr.get('profile')!r}")


def options_variable(e):
    # What CUMEMGUARD_OPTIONS sets is the user's choice: the launcher's defaults stay out of its way.
    d = e.logdir()
    p = e.run(["run", "--", e.rt, "P29"],
              extra={"CUMEMGUARD_OPTIONS": f"log='{d}/o.%p.log':summary=0:mode=report"})
    logs = os.listdir(d)
    check(p.returncode == 0 and len(logs) == 1 and logs[0].startswith("o.") and
          "cumemguard: summary" not in p.stderr and f"cumemguard: 1 log: {d}/o." in p.stderr and
          "[forwarded" in p.stderr, f"CUMEMGUARD_OPTIONS under run: {logs} {p.stderr!r}")
    p = e.run(["run", "--no-log", "--", e.rt, "P29"], cwd=d,
              extra={"CUMEMGUARD_OPTIONS": f"log='{d}/n.%p.log'"})
    check(not any(f.startswith("n.") for f in os.listdir(d)), f"--no-log beside a log entry: {os.listdir(d)}")


def signals(e):
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        d = e.logdir()
        pidfile = os.path.join(d, "pid")
        # Default dispositions in the launcher (a test runner may start us with some ignored).
        launcher = subprocess.Popen(
            [e.cg, "run", "--no-summary", "--no-log", "--", "sh", "-c",
             f"echo $$ > {pidfile}; exec sleep 30"], env=e.env,
            preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL)
                                for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)])
        for _ in range(200):
            if os.path.exists(pidfile) and open(pidfile).read().strip():
                break
            time.sleep(0.05)
        child = int(open(pidfile).read())
        launcher.send_signal(sig)
        try:
            rc = launcher.wait(timeout=20)
        except subprocess.TimeoutExpired:
            launcher.kill()
            rc = None
        alive = True
        for _ in range(40):
            try:
                os.kill(child, 0)
                time.sleep(0.05)
            except ProcessLookupError:
                alive = False
                break
        if alive:
            os.kill(child, signal.SIGKILL)
        check(not alive and rc == -sig,
              f"{sig.name} to the launcher: child alive {alive}, launcher rc {rc}")


def summary_order(e):
    d = e.logdir()
    p = e.run(["run", "--log", os.path.join(d, "b.%p.log"), "--", e.rt, "basic"], merge=True)
    lines = p.stdout.splitlines()
    first_summary = next((i for i, l in enumerate(lines) if l.startswith("cumemguard: summary")), -1)
    last_prog = max((i for i, l in enumerate(lines) if l.startswith("free_host ")), default=-1)
    check(p.returncode == 0 and 0 <= last_prog < first_summary,
          f"summary after the program's output on a pipe: {lines}")
    p = e.run(["run", "--no-log", "--", e.rt, "leak"])
    # Leaks apart from the findings, on a line of their own, as the report counts them.
    fl = [l for l in p.stderr.splitlines() if l.startswith(("  findings:", "  leaks:"))]
    check(fl == ["  findings: none", "  leaks: 1 (live at exit)"],
          f"a leaking run's summary: {fl} {p.stderr!r}")


def read_with(e):
    # The last line says how to read the logs with a command that works when pasted: the plain
    # name when `cumemguard` on PATH is this launcher, else the launcher's own path. The shim's
    # summary under `run` names the log and leaves the command to that line.
    d = e.logdir()
    log = os.path.join(d, "r.log")
    for label, path, want in (("not on PATH", "/usr/bin:/bin", os.path.realpath(e.cg)),
                              ("on PATH", d + ":/usr/bin:/bin", "cumemguard")):
        if want == "cumemguard" and not os.path.exists(os.path.join(d, "cumemguard")):
            os.symlink(e.cg, os.path.join(d, "cumemguard"))
        p = e.run(["run", "--log", log, "--", e.rt, "basic"], extra={"PATH": path})
        lines = p.stderr.splitlines()
        check(p.returncode == 0 and lines[-1] == f"cumemguard: read with: {want} report {log}" and
              f"  log: {log}" in lines,
              f"read-with line, cumemguard {label}: rc {p.returncode} {lines[-3:]}")


def suppressions(e):
    d = e.logdir()
    supp = os.path.join(d, "supp.txt")
    with open(supp, "w") as f:
        f.write("# the vendor library frees what it was handed\ndouble-free:vendor_release\n")
    log = os.path.join(d, "v.log")
    p = e.run(["run", "--log", log, "--", e.supp, "vendor"],
              extra={"CUMEMGUARD_SUPPRESSIONS": supp})
    out = dict(l.split(" ", 1) for l in p.stdout.splitlines() if " " in l)
    check(p.returncode == 0 and out.get("vendor_free") == "0",
          f"suppressed double free keeps its action (skipped): {p.returncode} {p.stdout!r}")
    check("warning: double-free" not in p.stderr, f"suppressed finding printed: {p.stderr!r}")
    check("  suppressed: 1 (double-free:vendor_release)\n" in p.stderr and
          "  findings: none\n" in p.stderr, f"exit summary: {p.stderr!r}")
    recs = records(log)
    fs = [r for r in recs if r.get("k") == "finding"]
    summ = [r for r in recs if r.get("k") == "summary"]
    check(len(fs) == 1 and fs[0].get("suppressed") == "double-free:vendor_release" and
          "stack" in fs[0], f"suppressed finding record: {fs}")
    check(len(summ) == 1 and summ[0].get("findings") == {} and
          summ[0].get("suppressed") == [{"class": "double-free", "pattern": "vendor_release",
                                         "count": 1}],
          f"summary record: {summ}")
    # By module, in strict mode: the vendor's does not abort, the program's own does.
    with open(supp, "w") as f:
        f.write("*:libcmgvendor.so\nbogus line\nno-such-class:x\n")
    p = e.run(["run", "--no-log", "--mode", "strict", "--", e.supp, "both"],
              extra={"CUMEMGUARD_SUPPRESSIONS": supp})
    check(p.returncode == -signal.SIGABRT and "warning: double-free" in p.stderr and
          "  findings: double-free 1\n" in p.stderr and
          "  suppressed: 1 (*:libcmgvendor.so)\n" in p.stderr,
          f"strict mode with a module rule: rc {p.returncode} {p.stdout!r} {p.stderr[-400:]!r}")
    check(f"{supp}:2: 'bogus line' is not CLASS:PATTERN; skipped" in p.stderr and
          f"{supp}:3: unknown finding class 'no-such-class'; skipped" in p.stderr,
          f"malformed lines named by file:line: {p.stderr!r}")
    # Suppressed findings do not fail a CI run, given by --suppressions (valgrind's spelling, a
    # relative path made absolute for the program) or by the variable.
    with open(supp, "w") as f:
        f.write("double-free:vendor_*\n")
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--", e.supp, "vendor"], cwd=d,
              extra={"CUMEMGUARD_SUPPRESSIONS": supp})
    check(p.returncode == 0, f"only suppressed findings with --error-exitcode: {p.returncode}")
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--suppressions", "supp.txt", "--",
               "sh", "-c", f"cd / && exec {e.supp} vendor"], cwd=d)
    check(p.returncode == 0 and "warning: double-free" not in p.stderr,
          f"--suppressions FILE: rc {p.returncode} {p.stderr[-400:]!r}")
    p = e.run(["run", "--no-summary", "--error-exitcode", "3", "--suppressions", supp, "--",
               e.supp, "both"], cwd=d)
    check(p.returncode == 3 and "1 finding in this run" in p.stderr,
          f"--suppressions keeps the program's own finding: rc {p.returncode} {p.stderr[-400:]!r}")
    # A file that cannot be read stops the run (64, one line), from -e, the environment or the
    # option alike: ASan and valgrind refuse to run without the suppressions they were given.
    missing = os.path.join(d, "missing.txt")
    for args, extra in ((["--suppressions", missing], None),
                        (["-e", "CUMEMGUARD_SUPPRESSIONS=" + missing], None),
                        ([], {"CUMEMGUARD_SUPPRESSIONS": missing}),
                        ([], {"CUMEMGUARD_OPTIONS": f"suppressions={missing}"}),
                        (["--suppressions", d], None)):
        p = e.run(["run", "--no-summary", "--no-log"] + args + ["--", e.supp, "vendor"],
                  extra=extra)
        lines = p.stderr.splitlines()
        check(p.returncode == 64 and len(lines) == 1 and "cannot read" in lines[0] and
              "not started" in lines[0] and not p.stdout,
              f"unreadable suppressions {args} {extra}: rc {p.returncode} {p.stderr!r}")


def generated_suppressions(e):
    # Two double frees in one function, release(), one called from path_a and one from path_b: the
    # rules report --gen-suppressions writes are anchored on each stack, so the rule of path_a's
    # suppresses path_a's finding and not path_b's (a rule naming release alone matched both).
    # Each frame is FUNCTION@MODULE: a function of that name in another program does not match.
    d = e.logdir()
    log = os.path.join(d, "shared.log")
    p = e.run(["run", "--no-summary", "--log", log, "--", e.supp, "shared"])
    check(p.returncode == 0 and "path_b 0" in p.stdout,
          f"shared: rc {p.returncode} {p.stdout!r} {p.stderr[-400:]!r}")
    g = e.run(["report", "--gen-suppressions", log])
    rules = [l for l in g.stdout.splitlines() if l and not l.startswith("#")]
    check(g.returncode == 0 and len(rules) == 2 and
          all(r.startswith("double-free:^release@suppress_cases;path_") for r in rules) and
          rules[0] != rules[1],
          f"--gen-suppressions: rc {g.returncode}, two anchored rules expected:\n{g.stdout}")
    rule_a = [r for r in rules
              if r.startswith("double-free:^release@suppress_cases;path_a@suppress_cases;")]
    if not check(len(rule_a) == 1, f"no rule for path_a's stack: {rules}"):
        return
    supp = os.path.join(d, "supp.txt")
    with open(supp, "w") as f:
        f.write(rule_a[0] + "\n")
    log2 = os.path.join(d, "shared2.log")
    p = e.run(["run", "--log", log2, "--suppressions", supp, "--", e.supp, "shared"])
    fs = [r for r in records(log2) if r.get("k") == "finding"]
    kept = [r for r in fs if "suppressed" not in r]
    gone = [r for r in fs if r.get("suppressed") == rule_a[0][len("double-free:"):].join(
        ["double-free:", ""])]
    check(p.returncode == 0 and len(fs) == 2 and len(kept) == 1 and len(gone) == 1 and
          "4096 bytes" in gone[0].get("msg", "") and "8192 bytes" in kept[0].get("msg", "") and
          "  findings: double-free 1\n" in p.stderr and
          # The summary cuts a long rule short, naming its length.
          f"  suppressed: 1 ({rule_a[0][:64]}... ({len(rule_a[0])} bytes))\n" in p.stderr,
          f"the rule of path_a's stack: rc {p.returncode}, findings {fs}, {p.stderr[-600:]!r}")


def runs_apart(e):
    # Logs of two runs named together (a glob over a directory both wrote into) are not one
    # program: the report refuses them (64, one line naming each run and its logs, and --run),
    # reads one run with --run ID and all of them with --run all. A launcher inside another's
    # program is of the outer run: the outer launcher's list reads as one.
    d = e.logdir()
    for _ in range(2):
        p = e.run(["run", "--no-summary", "--log", os.path.join(d, "cmg-%p.log"), "--", e.rt,
                   "P29"])
        check(p.returncode == 0, f"runs_apart run: {p.returncode} {p.stderr[-300:]!r}")
    logs = sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("cmg-"))
    ids = [records(l)[0].get("options", {}).get("CUMEMGUARD_RUN_ID") for l in logs]
    if not check(len(logs) == 2 and all(ids) and ids[0] != ids[1], f"two runs' logs {logs} {ids}"):
        return
    p = e.run(["report"] + logs)
    want = (f"cumemguard report: the logs are of 2 runs, not one: {ids[0]} ({logs[0]}); {ids[1]} "
            f"({logs[1]}); report one with --run ID (or name its logs only), or all together "
            f"with --run all\n")
    check(p.returncode == 64 and p.stderr == want and not p.stdout,
          f"two runs merged: rc {p.returncode} {p.stderr!r} {p.stdout[:200]!r}")
    p = e.run(["report", "--json"] + logs)
    check(p.returncode == 64 and p.stderr == want and not p.stdout,
          f"two runs merged, --json: rc {p.returncode} {p.stderr!r}")
    p = e.run(["report", "--run", ids[1]] + logs)
    check(p.returncode == 1 and p.stdout.startswith("cumemguard report: 1 log, ") and
          f"] {logs[1]}\n" in p.stdout and logs[0] not in p.stdout and
          p.stderr == f"cumemguard report: --run {ids[1]}: 1 log of other runs (or of none) left "
                      f"out\n",
          f"--run ID: rc {p.returncode} {p.stderr!r} {p.stdout[:300]!r}")
    p = e.run(["report", "--run", "all"] + logs)
    check(p.returncode == 1 and p.stdout.startswith("cumemguard report: 2 logs, ") and not p.stderr,
          f"--run all: rc {p.returncode} {p.stderr!r} {p.stdout[:200]!r}")
    # The id's start (the launcher's pid, before the '-') names the run when one id starts so.
    pid = ids[1].split("-")[0]
    p = e.run(["report", "--run", pid] + logs)
    check(p.returncode == 1 and f"] {logs[1]}\n" in p.stdout and logs[0] not in p.stdout and
          p.stderr == f"cumemguard report: --run {ids[1]}: 1 log of other runs (or of none) left "
                      f"out\n",
          f"--run PID: rc {p.returncode} {p.stderr!r} {p.stdout[:300]!r}")
    common = os.path.commonprefix(ids)
    if common:  # the pids share their first digits: a start that names both is refused
        p = e.run(["report", "--run", common] + logs)
        check(p.returncode == 64 and p.stderr == f"cumemguard report: --run {common} names 2 runs: "
                                                 f"{ids[0]}, {ids[1]}; give more of the id\n",
              f"--run of two runs' start: rc {p.returncode} {p.stderr!r}")
    p = e.run(["report", "--run", "nope"] + logs)
    check(p.returncode == 64 and p.stderr.startswith("cumemguard report: no log of run nope among "
                                                     f"the logs (runs: {ids[0]} ("),
          f"--run of no log: rc {p.returncode} {p.stderr!r}")
    # Nested: the inner launcher's log carries the outer run's id.
    n = e.logdir()
    p = e.run(["run", "--no-summary", "--log", os.path.join(n, "outer-%p.log"), "--", "sh", "-c",
               f"{e.rt} P29 && {e.cg} run --no-summary --log {n}/inner-%p.log -- {e.rt} P29"])
    nested = sorted(os.path.join(n, f) for f in os.listdir(n))
    nids = {records(l)[0].get("options", {}).get("CUMEMGUARD_RUN_ID") for l in nested}
    r = e.run(["report"] + nested)
    check(p.returncode == 0 and len(nested) == 2 and len(nids) == 1 and r.returncode == 1 and
          r.stdout.startswith("cumemguard report: 2 logs, "),
          f"nested launchers: rc {p.returncode}, logs {nested}, ids {nids}, report rc "
          f"{r.returncode} {r.stderr!r}")


def option_rule(e):
    # One rule for -e and the environment under run: a setting that cannot apply (an unknown
    # name, a bad value, a malformed entry) stops the run with 64 and one line that says so, and
    # never says "ignored"; the program does not start.
    d = e.logdir()
    marker = os.path.join(d, "ran")
    prog = ["--", "sh", "-c", f"touch {marker}"]
    cases = [(["-e", "CUMEMGUARD_STAKS=3"], None,
              "-e CUMEMGUARD_STAKS=3: unknown option CUMEMGUARD_STAKS (did you mean "
              "CUMEMGUARD_STACKS?); the program was not started"),
             (["-e", "cumemguard_stacks=4"], None,
              "-e cumemguard_stacks=4: unknown option cumemguard_stacks (did you mean "
              "CUMEMGUARD_STACKS?); the program was not started"),
             ([], {"Cumemguard_Stacks": "4"},
              "environment: unknown option Cumemguard_Stacks (did you mean CUMEMGUARD_STACKS?); "
              "the program was not started"),
             ([], {"CUMEMGUARD_STAKS": "3"},
              "environment: unknown option CUMEMGUARD_STAKS (did you mean CUMEMGUARD_STACKS?); "
              "the program was not started"),
             ([], {"CUMEMGUARD_STACKS": "99"},
              "environment: CUMEMGUARD_STACKS: '99' is not valid: must be between 0 and 64; the "
              "program was not started"),
             ([], {"CUMEMGUARD_OPTIONS": "stakcs=3"},
              "environment: CUMEMGUARD_OPTIONS: unknown option stakcs (did you mean stacks?); "
              "the program was not started"),
             (["-e", "CUMEMGUARD_OPTIONS=mode"], None,
              "-e CUMEMGUARD_OPTIONS=mode: CUMEMGUARD_OPTIONS: 'mode' is not NAME=VALUE; the "
              "program was not started"),
             # A misspelt prefix is read by nothing: it started the program, status 0.
             (["-e", "CUMEMGAURD_STACKS=3"], None,
              "-e CUMEMGAURD_STACKS=3: unknown option CUMEMGAURD_STACKS (did you mean "
              "CUMEMGUARD_STACKS?); the program was not started"),
             ([], {"CUMEMGURD_OPTIONS": "mode=report"},
              "environment: unknown option CUMEMGURD_OPTIONS (did you mean CUMEMGUARD_OPTIONS?); "
              "the program was not started")]
    for args, extra, want in cases:
        p = e.run(["run", "--no-summary"] + args + prog, extra=extra, cwd=d)
        lines = p.stderr.splitlines()
        check(p.returncode == 64 and lines == ["cumemguard run: " + want] and
              not os.path.exists(marker), f"run {args} {extra}: rc {p.returncode} {p.stderr!r}")
    # The launcher's own variable is not an unknown option, for the launcher or the shim.
    shim = os.path.join(os.path.dirname(os.path.dirname(e.rt)), "..", "shim", "libcumemguard.so")
    p = e.run(["run", "--no-summary", "--no-log", "--", e.rt, "basic"],
              extra={"CUMEMGUARD_SHIM_PATH": os.path.abspath(shim)})
    check(p.returncode == 0 and "cumemguard" not in p.stderr,
          f"CUMEMGUARD_SHIM_PATH: rc {p.returncode} {p.stderr!r}")


def log_target(e):
    # A log the user named that cannot be written stops the run with 73 before the program starts.
    # The launcher finds out by creating the file as the shim would: as root every permission
    # check passes, yet /proc and /sys create no file (the program used to start, logless).
    d = e.logdir()
    marker = os.path.join(d, "ran")
    os.mkdir(os.path.join(d, "adir"))
    os.mkfifo(os.path.join(d, "fifo.log"))
    os.symlink(os.path.join(d, "elsewhere.log"), os.path.join(d, "link.log"))
    for log in (os.path.join(d, "none", "x.log"), os.path.join(d, "adir"),
                os.path.join(d, "fifo.log"), os.path.join(d, "link.log"), "/proc/x.log",
                "/sys/x.log", "/proc/x.%p.log"):
        p = e.run(["run", "--log", log, "--error-exitcode", "9", "--", "sh", "-c",
                   f"touch {marker}"], cwd=d)
        lines = p.stderr.splitlines()
        check(p.returncode == 73 and len(lines) == 1 and
              lines[0].startswith("cumemguard run: cannot write the event log ") and
              "the program was not started" in lines[0] and not os.path.exists(marker),
              f"--log {log}: rc {p.returncode} {p.stderr!r}")
        check(not os.path.lexists(os.path.join(d, "elsewhere.log")) and
              sorted(os.listdir(d)) == ["adir", "fifo.log", "link.log"],
              f"--log {log} left a file behind: {sorted(os.listdir(d))}")
    # A writable place: the check leaves nothing of its own there; the log is the shim's alone.
    for name in ("w.log", "w.%p.log"):
        sub = tempfile.mkdtemp(dir=d)
        p = e.run(["run", "--no-summary", "--log", os.path.join(sub, name), "--", e.rt, "basic"])
        left = os.listdir(sub)
        check(p.returncode == 0 and len(left) == 1 and left[0].startswith("w.") and
              left[0].endswith(".log"), f"--log {name}: rc {p.returncode} {left} {p.stderr!r}")


def default_log_target(e):
    # The default log (cumemguard.<program>.%p.log in the current directory) is checked as a named
    # one is: from a directory no file can be created in (/proc, even as root; a read-only
    # directory as another user) the run stops with 73 and one line naming the directory and
    # --log/--no-log. It used to start the program, which ran logless and exited 0.
    d = e.logdir()
    marker = os.path.join(d, "ran")
    try:
        os.close(os.open("/proc/.cmg-probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        why = None
    except OSError as err:
        why = os.strerror(err.errno)
    if not check(why is not None, "/proc accepted a new file: no place to try the default log"):
        return
    p = e.run(["run", "--brief", "--", "sh", "-c", f"touch {marker}"], cwd="/proc")
    want = ("cumemguard run: cannot write the default event log (the current directory's): "
            f"directory /proc: cannot create a file there ({why}); the program was not started "
            "(give --log a writable place, or --no-log)\n")
    check(p.returncode == 73 and p.stdout == "" and p.stderr == want and
          not os.path.exists(marker),
          f"default log in /proc: rc {p.returncode} {p.stderr!r} ran {os.path.exists(marker)}")
    # What the line offers works from the same directory.
    p = e.run(["run", "--no-summary", "--no-log", "--", "sh", "-c", f"touch {marker}"],
              cwd="/proc")
    check(p.returncode == 0 and os.path.exists(marker), f"--no-log in /proc: rc {p.returncode} "
          f"{p.stderr!r}")
    p = e.run(["run", "--no-summary", "--log", os.path.join(d, "x.log"), "--", e.rt, "basic"],
              cwd="/proc")
    check(p.returncode == 0 and os.path.exists(os.path.join(d, "x.log")),
          f"--log elsewhere from /proc: rc {p.returncode} {p.stderr!r}")


def env_attached(e):
    # -eNAME=VALUE, the value attached as getopt takes it, is -e NAME=VALUE (it was "unknown
    # option '-eCMG_ATTACHED=v'", 64); with a bad setting it is refused as the spaced form is.
    p = e.run(["run", "--no-summary", "--no-log", "-eCMG_ATTACHED=v7", "--", "sh", "-c",
               'printf "%s" "$CMG_ATTACHED"'])
    check(p.returncode == 0 and p.stdout == "v7" and p.stderr == "",
          f"-eNAME=VALUE: rc {p.returncode} {p.stdout!r} {p.stderr!r}")
    spaced = e.run(["run", "--no-log", "-e", "CUMEMGUARD_STACKS=99", "--", "true"])
    attached = e.run(["run", "--no-log", "-eCUMEMGUARD_STACKS=99", "--", "true"])
    check(attached.returncode == 64 and spaced.returncode == 64 and
          attached.stderr == spaced.stderr,
          f"-eCUMEMGUARD_STACKS=99: rc {attached.returncode} {attached.stderr!r} "
          f"(spaced: {spaced.stderr!r})")


def unfinished_processes(e):
    # A process of the run that never reached its exit records (SIGKILL, the out-of-memory killer)
    # is named by the launcher with its log; the run said nothing of it before, though its log
    # stops mid-way and its leaks were never counted. A child that ends with _exit is not named
    # (the shim writes its records there), nor is the parent. Under ThreadSanitizer it failed while
    # a forked child re-made the start lock its fork had taken (threads.h): a child reported a
    # lock-order inversion and ended with status 66 before its records.
    d = e.logdir()
    script = os.path.join(d, "killed.py")
    with open(script, "w") as f:
        f.write("import ctypes, os, signal\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "def child(how):\n"
                "    pid = os.fork()\n"
                "    if pid == 0:\n"
                "        p = ctypes.c_void_p()\n"
                "        rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "        if how == 'kill':\n"
                "            os.kill(os.getpid(), signal.SIGKILL)\n"
                "        os._exit(0)\n"
                "    os.waitpid(pid, 0)\n"
                "    return pid\n"
                "print('killed', child('kill'), 'quick', child('_exit'), 'parent', os.getpid())\n"
                "p = ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "rt.cudaFree(p)\n")
    # Under a preloaded AddressSanitizer, _exit runs its leak check first (CPython's own leaks).
    extra = {"ASAN_OPTIONS": (e.env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")}
    p = e.run(["run", "--no-summary", "--log", os.path.join(d, "k.%p.log"), "--", sys.executable,
               script], extra=extra)
    words = p.stdout.split()
    pids = dict(zip(words[0::2], words[1::2])) if len(words) == 6 else {}
    named = [l for l in p.stderr.splitlines() if "without its exit records" in l]
    want = (f"cumemguard: pid {pids.get('killed')} ended without its exit records (killed by "
            "SIGKILL or the out-of-memory killer, an exec of a program that made no CUDA call, or "
            "the exit_group system call itself): its leaks are not known; its log stops there: "
            f"{os.path.join(d, 'k.' + str(pids.get('killed')) + '.log')}")
    check(p.returncode == 0 and named == [want], f"unfinished processes: rc {p.returncode} "
          f"{p.stdout!r} {named} {p.stderr[-500:]!r}")


def config_refuses_as_run(e):
    # config --run refuses what run refuses about the program's environment, with run's status
    # and words: a log that cannot be written (73), an unknown placeholder or an unset %q{VAR}
    # (64), a suppressions file that cannot be read (64). config exited 0 for all four before.
    d = e.logdir()
    for args, rc in ((["--log", "/nonexistent/x.log"], 73), (["--log", "%z.log"], 64),
                     (["--suppressions", "/nonexistent"], 64),
                     (["--log", "%q{CMG_NOT_SET_X}.log"], 64)):
        r = e.run(["run", "--no-summary"] + args + ["--", "true"], cwd=d)
        c = e.run(["config", "--run"] + args, cwd=d)
        rl = r.stderr.splitlines()
        want = [l.replace("cumemguard run: ", "cumemguard config: ", 1).replace(
            "the program was not started", "refused: cumemguard run would not start the program")
            for l in rl]
        check(r.returncode == rc and len(rl) == 1 and c.returncode == rc and c.stdout == "" and
              c.stderr.splitlines() == want,
              f"config --run {args}: rc {c.returncode} {c.stderr!r}; run: rc {r.returncode} "
              f"{r.stderr!r}")
    # Set by -e, the variable is there: both go on; so do the variables run sets itself (its run
    # id names a run's logs), which config's own environment lacks (it refused them, 64).
    for args in (["--log", "%q{CMG_NOT_SET_X}.log", "-e", "CMG_NOT_SET_X=1"],
                 ["--log", "cg.%q{CUMEMGUARD_RUN_ID}.%p.log"]):
        r = e.run(["run", "--no-summary"] + args + ["--", "true"], cwd=d)
        c = e.run(["config", "--run"] + args, cwd=d)
        check(r.returncode == 0 and c.returncode == 0,
              f"config --run {args}: rc {c.returncode} {c.stderr!r}; run rc {r.returncode}")
    # A setting that cannot apply comes first, as in run: 64, not the log's 73.
    bad = {"CUMEMGUARD_STACKS": "abc", "CUMEMGUARD_LOG": "/nonexistent/x.log"}
    r = e.run(["run", "--no-summary", "--", "true"], extra=bad, cwd=d)
    c = e.run(["config"], extra=bad, cwd=d)
    check(r.returncode == 64 and c.returncode == 64,
          f"config with a bad value and an unwritable log: rc {c.returncode}; run {r.returncode}")
    # A relative log from -e is the user's, made absolute: labelled -e (it read "set by run").
    c = e.run(["config", "--run", "-e", "CUMEMGUARD_LOG=rel.log"], cwd=d)
    line = [l for l in c.stdout.splitlines() if l.startswith("CUMEMGUARD_LOG=")]
    check(c.returncode == 0 and line == [f"CUMEMGUARD_LOG={os.path.realpath(d)}/rel.log  "
                                         "(-e of cumemguard run)"],
          f"config --run -e CUMEMGUARD_LOG=rel.log: rc {c.returncode} {line}")
    # Each value's source, truthfully: run's own default, the run option the user gave, an -e
    # (the options read "set by cumemguard run" as the defaults do, and -e "environment", before).
    c = e.run(["config", "--run", "--mode", "strict", "--log", "x.log", "-e",
               "CUMEMGUARD_STACKS=3"], cwd=d)
    got = {l.split("=")[0]: l.split("  (", 1)[1] for l in c.stdout.splitlines()
           if l.startswith("CUMEMGUARD_") and "  (" in l}
    want = {"CUMEMGUARD_PROFILE": "set by cumemguard run)", "CUMEMGUARD_MODE":
            "--mode of cumemguard run)", "CUMEMGUARD_LOG": "--log of cumemguard run)",
            "CUMEMGUARD_STACKS": "-e of cumemguard run)", "CUMEMGUARD_SUMMARY":
            "set by cumemguard run)", "CUMEMGUARD_RUN_ID": "made by cumemguard run at each launch)"}
    check(c.returncode == 0 and {k: got.get(k) for k in want} == want,
          f"config --run sources: rc {c.returncode} {[(k, got.get(k)) for k in want]}")


def quick_exit_leaks(e):
    # A child that ends by _exit (a DataLoader worker) had no leak check: --fail-on-leaks says that
    # its leaks are not counted instead of reading its status record's 0 as "no leaks" silently.
    # The parent's own leak still fails the gate; without it the run passes.
    d = e.logdir()
    script = os.path.join(d, "quick.py")
    with open(script, "w") as f:
        f.write("import ctypes, os, sys\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    p = ctypes.c_void_p()\n"
                "    rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "    os._exit(0)\n"
                "os.waitpid(pid, 0)\n"
                "p = ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "if sys.argv[1] == 'free':\n"
                "    rt.cudaFree(p)\n")
    extra = {"ASAN_OPTIONS": (e.env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")}
    said = ("cumemguard: 1 process ended by _exit: its leaks were not checked and are not in "
            "--fail-on-leaks' count")
    for how, rc, gate in (("free", 0, []),
                          ("leak", 7, ["cumemguard: 1 finding (leaks at exit included) in this run; "
                                       "exiting 7 (--error-exitcode)"])):
        p = e.run(["run", "--no-summary", "--error-exitcode", "7", "--fail-on-leaks", "--log",
                   os.path.join(d, how + ".%p.log"), "--", sys.executable, script, how], extra=extra)
        lines = [l for l in p.stderr.splitlines()
                 if "ended by _exit:" in l or "(--error-exitcode)" in l]
        check(p.returncode == rc and lines == [said] + gate,
              f"_exit leaks not checked ({how}): rc {p.returncode} {lines} {p.stderr[-600:]!r}")


def signal_leaks(e):
    # A child a fatal signal ended (its crash records have counts, no leak check) is not counted
    # as "no leaks" by --fail-on-leaks either: said as _exit's is. The parent's leak still fails.
    d = e.logdir()
    script = os.path.join(d, "crashchild.py")
    with open(script, "w") as f:
        f.write("import ctypes, os, signal, sys\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    p = ctypes.c_void_p()\n"
                "    rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "    os.kill(os.getpid(), signal.SIGSEGV)\n"
                "_, st = os.waitpid(pid, 0)\n"
                "assert os.WIFSIGNALED(st) and os.WTERMSIG(st) == signal.SIGSEGV, st\n"
                "p = ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "if sys.argv[1] == 'free':\n"
                "    rt.cudaFree(p)\n")
    # As crash_line_plural: a preloaded sanitizer owns SIGSEGV unless told to leave it.
    extra = {k: (e.env[k] + ":" if e.env.get(k) else "") + "handle_segv=0"
             for k in ("ASAN_OPTIONS", "TSAN_OPTIONS")}
    extra["ASAN_OPTIONS"] += ":detect_leaks=0"
    said = ("cumemguard: 1 process ended by a fatal signal: its leaks were not checked and are not "
            "in --fail-on-leaks' count")
    for how, rc, gate in (("free", 0, []),
                          ("leak", 7, ["cumemguard: 1 finding (leaks at exit included) in this run; "
                                       "exiting 7 (--error-exitcode)"])):
        p = e.run(["run", "--no-summary", "--error-exitcode", "7", "--fail-on-leaks", "--log",
                   os.path.join(d, "sig-" + how + ".%p.log"), "--", sys.executable, script, how],
                  extra=extra)
        lines = [l for l in p.stderr.splitlines()
                 if "ended by a fatal signal:" in l or "(--error-exitcode)" in l]
        check(p.returncode == rc and lines == [said] + gate,
              f"crashed child's leaks not checked ({how}): rc {p.returncode} {lines} "
              f"{p.stderr[-600:]!r}")
    # Without --fail-on-leaks nothing is said: leaks are not part of the gate.
    p = e.run(["run", "--no-summary", "--error-exitcode", "7", "--log",
               os.path.join(d, "sig-plain.%p.log"), "--", sys.executable, script, "leak"],
              extra=extra)
    check(p.returncode == 0 and "ended by a fatal signal:" not in p.stderr,
          f"without --fail-on-leaks: rc {p.returncode} {p.stderr[-400:]!r}")
    # Strict mode's abort raises SIGABRT after the exit summary counted the leaks: they were
    # checked and are in the count, so nothing is said of them (the crash handler's state
    # overwrote the exit's, and the launcher said both "not checked" and "leaks included").
    strict = os.path.join(d, "strictchild.py")
    with open(strict, "w") as f:
        f.write("import ctypes\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "a, b = ctypes.c_void_p(), ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(a), ctypes.c_size_t(4096))\n"
                "rt.cudaMalloc(ctypes.byref(b), ctypes.c_size_t(4096))\n"
                "rt.cudaFree(b)\n"
                "rt.cudaFree(b)\n")
    p = e.run(["run", "--no-summary", "--mode", "strict", "--error-exitcode", "7",
               "--fail-on-leaks", "--log", os.path.join(d, "strict.%p.log"), "--", "sh", "-c",
               f"{sys.executable} {strict}; exit 0"], extra=extra)
    lines = [l for l in p.stderr.splitlines()
             if "ended by a fatal signal:" in l or "(--error-exitcode)" in l]
    check(p.returncode == 7 and lines == ["cumemguard: 2 findings (leaks at exit included) in "
                                          "this run; exiting 7 (--error-exitcode)"],
          f"strict abort's counted leaks: rc {p.returncode} {lines} {p.stderr[-600:]!r}")


def crash_line_plural(e):
    # The shim's line for a process killed by a signal counts in words that agree with the number:
    # one CUDA call, then SIGSEGV, read "after 1 calls" before.
    script = os.path.join(e.logdir(), "crash1.py")
    with open(script, "w") as f:
        f.write("import ctypes, os, signal\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "p = ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "os.kill(os.getpid(), signal.SIGSEGV)\n")
    # Under a preloaded sanitizer, the sanitizer owns SIGSEGV and the shim never replaces its
    # handler; it leaves the signal alone here, as the reliability crash cases have it.
    extra = {k: (e.env[k] + ":" if e.env.get(k) else "") + "handle_segv=0"
             for k in ("ASAN_OPTIONS", "TSAN_OPTIONS")}
    p = e.run(["run", "--no-log", "--", sys.executable, script], extra=extra)
    lines = [l for l in p.stderr.splitlines() if " killed by SIGSEGV" in l]
    check(p.returncode == -signal.SIGSEGV and len(lines) == 1 and
          re.fullmatch(r"cumemguard: pid \d+ killed by SIGSEGV after 1 call, 0 findings", lines[0]),
          f"crash line after one call: rc {p.returncode} {lines} {p.stderr[-300:]!r}")


def log_unset_variable(e):
    # %q{VAR} with VAR not set: valgrind's --log-file stops ("environment variable VAR is not
    # set"); run does too, with 64 and one line, before the program starts. With -e VAR=... it
    # runs and the log carries the value. A plain LD_PRELOAD never stops the program: the shim says
    # in one line that VAR is not set (the name used to lose the value without a word).
    d = e.logdir()
    marker = os.path.join(d, "ran")
    e.env.pop("CMG_UNSET_JOB", None)
    pattern = os.path.join(d, "x.%q{CMG_UNSET_JOB}.log")
    p = e.run(["run", "--log", pattern, "--", "sh", "-c", f"touch {marker}"], cwd=d)
    lines = p.stderr.splitlines()
    check(p.returncode == 64 and len(lines) == 1 and
          "%q{CMG_UNSET_JOB}: the environment variable CMG_UNSET_JOB is not set" in lines[0] and
          "the program was not started" in lines[0] and not os.path.exists(marker) and
          os.listdir(d) == [], f"--log with an unset %q{{}}: rc {p.returncode} {p.stderr!r}")
    p = e.run(["run", "--no-summary", "-e", "CMG_UNSET_JOB=j7", "--log", pattern, "--", e.rt,
               "basic"], cwd=d)
    check(p.returncode == 0 and os.listdir(d) == ["x.j7.log"],
          f"-e CMG_UNSET_JOB=j7: rc {p.returncode} {os.listdir(d)} {p.stderr!r}")
    plain = dict(e.env, LD_PRELOAD=":".join(
        x for x in (e.env.get("LD_PRELOAD", ""), e.shim) if x),
        CUMEMGUARD_LOG=os.path.join(d, "y.%q{CMG_UNSET_JOB}.log"))
    p = subprocess.run([e.rt, "basic"], env=plain, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    said = [l for l in p.stderr.splitlines() if "CMG_UNSET_JOB" in l]
    check(p.returncode == 0 and len(said) == 1 and
          "%q{CMG_UNSET_JOB}: the environment variable CMG_UNSET_JOB is not set" in said[0] and
          os.path.exists(os.path.join(d, "y..log")),
          f"LD_PRELOAD with an unset %q{{}}: rc {p.returncode} {p.stderr[-600:]!r} {os.listdir(d)}")


def alloc_conf_once(e):
    # A PYTORCH_CUDA_ALLOC_CONF that PyTorch would reject is said by the process that touches
    # CUDA, once, with the hint `config` gives; the shell and the commands that never touch CUDA
    # print nothing (they used to print one copy each).
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segment:True"}
    want = ("PYTORCH_CUDA_ALLOC_CONF: the first CUDA allocation would raise ValueError: "
            "Unrecognized key 'expandable_segment' in CUDA allocator config. (parser C, at "
            "'expandable_segment:True'); PYTORCH_CUDA_ALLOC_CONF: 'expandable_segment:True': "
            "unknown key (did you mean expandable_segments?)")
    p = e.run(["run", "--no-log", "--no-summary", "--", "sh", "-c",
               "/bin/true; /bin/true; /bin/echo >/dev/null"], extra=conf)
    check(p.returncode == 0 and p.stderr == "",
          f"bad alloc conf, no CUDA: rc {p.returncode} {p.stderr!r}")
    p = e.run(["run", "--no-log", "--no-summary", "--brief", "--", "sh", "-c",
               f"/bin/true; {e.rt} basic; /bin/true"], extra=conf)
    lines = [l for l in p.stderr.splitlines() if "PYTORCH_CUDA_ALLOC_CONF" in l]
    check(p.returncode == 0 and len(lines) == 1 and lines[0].endswith(want) and
          "(first CUDA call)" in lines[0], f"bad alloc conf, one CUDA process: rc {p.returncode} "
          f"{p.stderr!r}")


def alloc_conf_before_cuda(e):
    # A value on which `import torch` aborts (SIGABRT in libc10_cuda.so's static initialisation,
    # before any CUDA call) is still said, once, by the process that dies of it; and at the exit of
    # a process that loaded libc10_cuda.so without calling CUDA. An abort with a good value, and a
    # process that neither aborts nor loads it, print nothing; the exit status is the program's.
    conf = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments=True"}
    want = ("config in (load): PYTORCH_CUDA_ALLOC_CONF='expandable_segments=True': import torch "
            "would abort (std::terminate in the static initialisation of libc10_cuda.so)")
    py = sys.executable
    c10 = os.path.join(os.path.dirname(os.path.dirname(e.rt)), "torch", "libc10_cuda.so")
    for label, code, extra, rc, said in (
            ("abort, bad value", "import os; os.abort()", conf, -6, 1),
            ("kill -ABRT, bad value", "import os, signal; os.kill(os.getpid(), signal.SIGABRT)",
             conf, -6, 1),
            ("abort, no value", "import os; os.abort()", None, -6, 0),
            ("libc10_cuda loaded, bad value", f"import ctypes; ctypes.CDLL({c10!r})", conf, 0, 1),
            ("nothing loaded, bad value", "pass", conf, 0, 0)):
        p = e.run(["run", "--no-log", "--no-summary", "--", py, "-c", code], extra=extra)
        alone = subprocess.run([py, "-c", code], env=dict(e.env, **(extra or {})),
                               capture_output=True, timeout=60)
        lines = [l for l in p.stderr.splitlines() if l.startswith("cumemguard[")]
        ok = p.returncode == rc == alone.returncode and len(lines) == said and all(
            re.match(r"cumemguard\[\d+\]: warning: ", l) and want in l for l in lines)
        check(ok, f"{label}: rc {p.returncode} (want {rc}; the program alone {alone.returncode}), "
                  f"{said} line(s) wanted: {p.stderr!r}")


def frames_of(lines, start):
    """The stacks printed under lines[start]: (heading or None for the call's own, [functions])."""
    stacks = []
    for l in lines[start + 1:]:
        if not re.match(r"cumemguard\[\d+\]: {2}", l):
            break
        body = l.split("]: ", 1)[1]
        if body.startswith("    #"):
            if not stacks:
                stacks.append((None, []))
            stacks[-1][1].append(body.split(" ", 6)[5].split("+")[0])
        elif body.startswith("  ") and not body.startswith("   "):
            stacks.append((body.strip(), []))
        else:
            break
    return stacks


def live_stacks(e):
    # ASan style: a finding's line is followed by the innermost frames of its call, then those
    # of the allocation and of the first free, each line with the process's prefix.
    p = e.run(["run", "--no-summary", "--no-log", "--", e.supp, "both"])
    lines = p.stderr.splitlines()
    at = [i for i, l in enumerate(lines) if ": warning: double-free in cudaFree" in l]
    check(p.returncode == 0 and len(at) == 2, f"two findings: rc {p.returncode} {p.stderr!r}")
    if len(at) == 2:
        pid = re.match(r"cumemguard\[(\d+)\]", lines[at[0]]).group(1)
        block = lines[at[0]:at[1]]
        check(all(l.startswith(f"cumemguard[{pid}]: ") for l in block),
              f"a stack line without the prefix: {block}")
        vendor, own = frames_of(lines, at[0]), frames_of(lines, at[1])
        want_vendor = [(None, ["vendor_release", "main"]),
                       (f"allocation: cudaMalloc, thread {pid}, seq 1", ["main"]),
                       (f"first free: cudaFree, thread {pid}, seq 2", ["main"])]
        check([(h, f[:len(w[1])]) for (h, f), w in zip(vendor, want_vendor)] == want_vendor and
              len(vendor) == 3, f"the vendor's finding's stacks: {vendor}")
        check([h for h, _ in own] == [None, f"allocation: cudaMalloc, thread {pid}, seq 5",
                                       f"first free: cudaFree, thread {pid}, seq 6"] and
              all(f[:2] == ["program_double_free", "main"] for _, f in own),
              f"the program's finding's stacks: {own}")
        check(re.search(r"#0 vendor_release\+0x[0-9a-f]+ \(libcmgvendor\.so\)$",
                        lines[at[0] + 1]), f"a frame's text: {lines[at[0] + 1]!r}")
    # A Python program: its frames (qualified name, file, line) in place of the interpreter's
    # eval frames, after the native frames of ctypes (counted in one line).
    ex = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                      "double_free.py")
    ex = os.path.realpath(ex)
    src = open(ex).read().splitlines()
    line_of = lambda text: next(i for i, l in enumerate(src, 1) if text in l)
    # The interpreter itself, not a launcher script in front of it (pyenv's shims are bash
    # scripts, and bash dies of SIGSEGV with ThreadSanitizer's runtime preloaded). LeakSanitizer
    # tells CPython's leaks at exit by its allocator's names (tests/sanitizers/lsan.supp): an
    # interpreter linked without libpython names none, so its run checks no leaks.
    extra = {}
    if "asan" in e.env.get("LD_PRELOAD", "") and "libpython" not in open("/proc/self/maps").read():
        extra["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    p = e.run(["run", "--no-summary", "--no-log", "-e", "CUMEMGUARD_WARN_FRAMES=2", "--",
               sys.executable, ex], extra)
    lines = p.stderr.splitlines()
    at = [i for i, l in enumerate(lines) if ": warning: double-free in cudaFree" in l]
    check(p.returncode == 0 and len(at) == 1, f"python: rc {p.returncode} {p.stderr[-800:]!r}")
    if at:
        block = [l.split("]: ", 1)[1] for l in lines[at[0] + 1:]
                 if re.match(r"cumemguard\[\d+\]:   ", l)]
        py = [(m.group(1), m.group(2), int(m.group(3))) for m in
              (re.match(r"    #\d+ (\S+) \((.*):(\d+)\)$", b) for b in block) if m]
        top = ("<module>", ex, line_of("sys.exit(main())"))
        want = [("main", ex, line_of('"stale_free"')), top,
                ("main", ex, line_of('print("malloc", _cuda.first_call(rt.cudaMalloc')), top,
                ("main", ex, line_of('print("free", rt.cudaFree')), top]
        # ctypes' and libffi's call into C above the Python frames, and the interpreter's
        # start-up below them, one line each (the report's folds), in each of the three stacks.
        check(py == want and
              sum(bool(re.fullmatch(r"    \.\.\. \d+ interpreter frames calling into C", b))
                  for b in block) == 3 and
              sum(bool(re.fullmatch(r"    \.\.\. \d+ interpreter frames", b)) for b in block) == 3 and
              not any(re.match(r"    #\d+ .*(libffi|_ctypes|Py_BytesMain)", b) for b in block),
              f"python frames under the finding: {py} (expected {want})\n{block}")

    # CUMEMGUARD_WARN_FRAMES bounds the frames per stack.
    p = e.run(["run", "--no-summary", "--no-log", "-e", "CUMEMGUARD_WARN_FRAMES=1", "--", e.supp,
               "both"])
    lines = p.stderr.splitlines()
    at = [i for i, l in enumerate(lines) if ": warning: double-free" in l]
    got = frames_of(lines, at[0]) if at else []
    check(len(got) == 3 and all(len(f) == 1 for _, f in got) and got[0][1] == ["vendor_release"],
          f"WARN_FRAMES=1: {got}")
    # --brief, and the guard profile of a plain LD_PRELOAD: today's one line per finding.
    p = e.run(["run", "--no-summary", "--no-log", "--brief", "--", e.supp, "both"])
    w = [l for l in p.stderr.splitlines() if l.startswith("cumemguard[")]
    check(len(w) == 2 and all(": warning: double-free in cudaFree" in l for l in w),
          f"--brief: {p.stderr!r}")
    env = dict(e.env, LD_PRELOAD=":".join(x for x in (os.environ.get("CMG_PRELOAD_FIRST", ""),
               os.path.abspath(os.path.join(os.path.dirname(e.cg), "..", "shim",
                                            "libcumemguard.so"))) if x))
    p = subprocess.run([e.supp, "both"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    w = [l for l in p.stderr.splitlines() if l.startswith("cumemguard")]
    check(p.returncode == 0 and len(w) == 2 and all(": warning: double-free" in l for l in w),
          f"plain LD_PRELOAD: {p.stderr!r}")


def sanitized(e):
    if not e.sanitized:
        print("skip: no -fsanitize=address program in this build")
        return
    # Without the launcher the problem is real: the shim preloaded first kills the program.
    env = dict(e.env, LD_PRELOAD=os.path.join(os.path.dirname(os.path.dirname(e.rt)), "..",
                                              "shim", "libcumemguard.so"))
    p = subprocess.run([e.sanitized, "double-free"], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    check(p.returncode != 0 and "does not come first" in p.stderr,
          f"plain LD_PRELOAD of the shim before ASan: rc {p.returncode} {p.stderr[-200:]!r}")
    d = e.logdir()
    p = e.run(["run", "--log", os.path.join(d, "s.log"), "--", e.sanitized, "double-free"])
    check(p.returncode == 0 and p.stdout == "asan_active 1\nmalloc 0\nfirst_free 0\nsecond_free 0\n",
          f"sanitized program under run: rc {p.returncode} {p.stdout!r} {p.stderr[-400:]!r}")
    check("warning: double-free in cudaFree" in p.stderr and "  findings: double-free 1" in p.stderr,
          f"the shim's finding in a sanitized program: {p.stderr[-400:]!r}")
    p = e.run(["run", "--no-summary", "--no-log", "--", "sh", "-c", 'echo "$LD_PRELOAD"'])
    p2 = e.run(["run", "--no-summary", "--no-log", "--", e.sanitized, "overflow"])
    check(p2.returncode != 0 and "heap-buffer-overflow" in p2.stderr,
          f"ASan still reports under run: rc {p2.returncode} {p2.stderr[-300:]!r}")
    # LeakSanitizer's check at exit ends the process with exit_group (status 23): the shim's
    # summary, leak records and `end` come from the sanitizer's death callback, and the report
    # reads a complete log (it read "truncated ... killed" before, and no summary was printed).
    log = os.path.join(d, "leak.log")
    p3 = e.run(["run", "--log", log, "--error-exitcode", "9", "--", e.sanitized, "leak"])
    check(p3.returncode == 9 and "LeakSanitizer: detected memory leaks" in p3.stderr
          and "10 byte(s) leaked in 1 allocation(s)" in p3.stderr,
          f"LeakSanitizer under run: rc {p3.returncode} {p3.stderr[-400:]!r}")
    check("  findings: double-free 1" in p3.stderr
          and p3.stderr.index("LeakSanitizer") < p3.stderr.index("cumemguard: summary for pid"),
          f"the shim's summary after LeakSanitizer's report: {p3.stderr[-600:]!r}")
    with open(log) as f:
        last = f.read().splitlines()[-1]
    check(json.loads(last).get("k") == "end" and json.loads(last).get("sanitizer") is True,
          f"the log's last record after LeakSanitizer's exit: {last!r}")
    r = e.run(["report", log])
    check(r.returncode == 1 and r.stdout.startswith("cumemguard report: 1 log, 1 finding (double-free 1)")
          and "TRUNCATED" not in r.stdout,
          f"report of the LeakSanitizer-ended log: rc {r.returncode} {r.stdout[:300]!r}")


def interpreter_fifo(e):
    """A script whose `#!` line names a FIFO: the launcher reads that line to find a sanitizer
    runtime, and blocked in open(2) on the FIFO before the program started. Now the kernel's own
    refusal comes back at once, as without the launcher (126, permission denied)."""
    d = e.logdir()
    fifo, script = os.path.join(d, "fifo"), os.path.join(d, "script")
    os.mkfifo(fifo)
    with open(script, "w") as f:
        f.write(f"#!{fifo}\n")
    os.chmod(script, 0o755)
    # The shell without a sanitizer runtime preloaded (a sanitized build's CMG_PRELOAD_FIRST):
    # dash and bash die of SIGSEGV under ThreadSanitizer's, and the kernel's refusal does not
    # depend on it.
    plain_env = {k: v for k, v in e.env.items() if k != "LD_PRELOAD"}
    plain = subprocess.run(["sh", "-c", '"$0"', script], env=plain_env, timeout=30,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        p = e.run(["run", "--no-log", "--no-summary", "--", script], timeout=30)
    except subprocess.TimeoutExpired:
        check(False, "run of a script whose interpreter is a FIFO: no exit within 30 s (hung)")
        return
    check(plain.returncode == 126 and p.returncode == 126 and "Permission denied" in p.stderr,
          f"interpreter FIFO: rc {p.returncode} (without the launcher {plain.returncode}) "
          f"{p.stderr!r}")


def first_use(e):
    # What a user coming from ASan or valgrind expects of the launcher and of a plain LD_PRELOAD.
    d = e.logdir()
    marker = os.path.join(d, "ran")
    prog = ["--", "sh", "-c", f"touch {marker}"]
    # A CUMEMGUARD_TORCH_ALLOC_CONF that cannot apply stops the run, from -e or the environment.
    why = ("CUMEMGUARD_TORCH_ALLOC_CONF: 'bogus' needs ':value' (or write -bogus to remove it); "
           "the program was not started")
    # As CUMEMGUARD_OPTIONS' torch_alloc_conf entry too (it started the program, status 0), and
    # config refuses what run refuses, in run's words.
    # The entry is named as the entry, not as the variable it was not set in.
    entry_why = why.replace("CUMEMGUARD_TORCH_ALLOC_CONF:", "its torch_alloc_conf entry:")
    for args, extra, label, why in (
            (["-e", "CUMEMGUARD_TORCH_ALLOC_CONF=bogus"], None,
             "-e CUMEMGUARD_TORCH_ALLOC_CONF=bogus", why),
            ([], {"CUMEMGUARD_TORCH_ALLOC_CONF": "bogus"}, "environment", why),
            (["-e", "CUMEMGUARD_OPTIONS=torch_alloc_conf=bogus"], None,
             "-e CUMEMGUARD_OPTIONS=torch_alloc_conf=bogus", entry_why),
            ([], {"CUMEMGUARD_OPTIONS": "stacks=4:torch_alloc_conf=bogus"},
             "environment: CUMEMGUARD_OPTIONS", entry_why)):
        p = e.run(["run", "--no-summary"] + args + prog, extra=extra, cwd=d)
        check(p.returncode == 64 and p.stderr.splitlines() == [f"cumemguard run: {label}: {why}"]
              and not os.path.exists(marker),
              f"run {args} {extra}: rc {p.returncode} {p.stderr!r}")
        c = e.run(["config", "--run"] + args, extra=extra, cwd=d)
        cwhy = why.replace("the program was not started",
                           "refused: cumemguard run would not start the program")
        check(c.returncode == 64 and c.stderr.splitlines() == [f"cumemguard config: {label}: {cwhy}"],
              f"config --run {args} {extra}: rc {c.returncode} {c.stderr!r}")
    # An entry that PyTorch's grammar takes is applied before the program starts, as the variable.
    p = e.run(["run", "--no-summary", "-e",
               "CUMEMGUARD_OPTIONS=torch_alloc_conf='expandable_segments:True'", "--", "sh", "-c",
               'printf "%s" "$PYTORCH_CUDA_ALLOC_CONF"'], extra={"PYTORCH_CUDA_ALLOC_CONF": ""},
              cwd=d)
    check(p.returncode == 0 and p.stdout == "expandable_segments:True",
          f"torch_alloc_conf entry applied: rc {p.returncode} {p.stdout!r} {p.stderr!r}")
    # Under a plain LD_PRELOAD, a job of processes that are not PyTorch ones: only the one that
    # reaches CUDA says the value was not applied, once, at its first CUDA call.
    job = f"sh -c true; /bin/true; sh -c 'sh -c true'; {e.rt} basic >/dev/null; /bin/true"
    plain = dict(e.env, LD_PRELOAD=(e.env.get("LD_PRELOAD", "") + " " + e.shim).strip(),
                 CUMEMGUARD_TORCH_ALLOC_CONF="bogus", CUMEMGUARD_LOG="")
    p = subprocess.run(["sh", "-c", job], env=plain, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    about = [l for l in p.stderr.splitlines() if "CUMEMGUARD_TORCH_ALLOC_CONF" in l]
    check(p.returncode == 0 and len(about) == 1 and "in (first CUDA call)" in about[0],
          f"plain LD_PRELOAD, a refused override in a job: {about}")
    # An unknown option under a plain LD_PRELOAD is said once per process tree, by its first
    # process; a child whose environment has another problem says its own; the program sees one
    # internal variable more.
    plain = dict(e.env, LD_PRELOAD=(e.env.get("LD_PRELOAD", "") + " " + e.shim).strip(),
                 CUMEMGUARD_STAKS="3", CUMEMGUARD_LOG="")
    job = (f"for i in 1 2 3 4 5 6 7 8 9 10; do {e.rt} basic >/dev/null; done; "
           f"CUMEMGUARD_MODE=stict {e.rt} basic >/dev/null; export -p")
    p = subprocess.run(["sh", "-c", job], env=plain, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    staks = [l for l in p.stderr.splitlines() if "CUMEMGUARD_STAKS" in l]
    mode = [l for l in p.stderr.splitlines() if "CUMEMGUARD_MODE" in l]
    # The shell's own list of its environment (a builtin: no coreutils process, whose own leaks a
    # sanitized build's preloaded runtime reports at exit, after they closed stderr).
    seen = sorted(l.split()[1].split("=")[0] for l in p.stdout.splitlines()
                  if l.startswith("export CUMEMGUARD_"))
    check(p.returncode == 0 and len(staks) == 2 and len(mode) == 1 and
          "'stict' is not valid: expected one of guard|report|strict (did you mean 'strict'?)"
          in mode[0] and seen == ["CUMEMGUARD_LOG", "CUMEMGUARD_SAID", "CUMEMGUARD_STAKS"],
          f"plain LD_PRELOAD, an unknown option in a job of 11: rc {p.returncode} {staks} {mode} "
          f"{seen} {p.stderr[-300:]!r}")
    # config refuses what run refuses, with the same status and run's words, with or without
    # --run: one line each on stderr, the listing (without --run) alone on stdout. Without --run a
    # refused CUMEMGUARD_TORCH_ALLOC_CONF exited 0, and a refused option was said on stdout only,
    # as "ignored".
    for extra, why in (({"CUMEMGUARD_STAKS": "3"},
                        "unknown option CUMEMGUARD_STAKS (did you mean CUMEMGUARD_STACKS?)"),
                       ({"CUMEMGUARD_STACKS": "abc"},
                        "CUMEMGUARD_STACKS: 'abc' is not valid: not a whole number"),
                       ({"CUMEMGUARD_TORCH_ALLOC_CONF": "bogus"},
                        "CUMEMGUARD_TORCH_ALLOC_CONF: 'bogus' needs ':value' (or write -bogus to "
                        "remove it)")):
        r = e.run(["run", "--no-summary"] + prog, extra=extra, cwd=d)
        check(r.returncode == 64 and r.stderr.splitlines() ==
              [f"cumemguard run: environment: {why}; the program was not started"],
              f"run {extra}: rc {r.returncode} {r.stderr!r}")
        want = f"cumemguard config: environment: {why}; refused: cumemguard run would not start " \
               "the program"
        for args in (["--run"], []):
            p = e.run(["config"] + args + ["--torch-version", "2.9.1"], extra=extra)
            check(p.returncode == 64 and p.stderr.splitlines() == [want] and
                  (p.stdout == "" if args else
                   p.stdout.startswith("PyTorch allocator configuration")),
                  f"config {args} {extra}: rc {p.returncode} {p.stderr!r} {p.stdout[:200]!r}")
    # --log and --no-log together, either order.
    for args in (["--no-log", "--log", "x.log"], ["--log", "x.log", "--no-log"]):
        p = e.run(["run", "--no-summary"] + args + prog, cwd=d)
        check(p.returncode == 64 and p.stderr == "cumemguard run: --log and --no-log conflict "
              "(give one)\n" and not os.path.exists(marker),
              f"run {args}: rc {p.returncode} {p.stderr!r}")
    # A near-miss of an enum value is named.
    p = e.run(["run", "--mode", "stict"] + prog, cwd=d)
    check(p.returncode == 64 and p.stderr == "cumemguard run: --mode must be guard, report or "
          "strict, not 'stict' (did you mean 'strict'?)\n", f"--mode stict: {p.stderr!r}")
    p = e.run(["run", "-e", "CUMEMGUARD_MODE=stict"] + prog, cwd=d)
    check(p.returncode == 64 and p.stderr == "cumemguard run: -e CUMEMGUARD_MODE=stict: "
          "CUMEMGUARD_MODE: 'stict' is not valid: expected one of guard|report|strict (did you "
          "mean 'strict'?); the program was not started\n", f"-e MODE=stict: {p.stderr!r}")
    # No command: one usage line and where the help is, on stderr, status 64.
    p = e.run([])
    check(p.returncode == 64 and not p.stdout and p.stderr == "Usage: cumemguard COMMAND "
          "[ARGS...]\ntry 'cumemguard --help' for more information\n",
          f"no command: rc {p.returncode} {p.stdout[:100]!r} {p.stderr!r}")
    # The report's header shows the options the user set, not the launcher's own variables.
    log = os.path.join(d, "h.log")
    p = e.run(["run", "--no-summary", "--log", log, "-e", "CUMEMGUARD_STACKS=4", "--", e.rt,
               "basic"], cwd=d)
    r = e.run(["report", log])
    mode = [l for l in r.stdout.splitlines() if l.startswith("    mode ")]
    check(p.returncode == 0 and len(mode) == 1 and "CUMEMGUARD_STACKS=4" in mode[0] and
          "CUMEMGUARD_PROFILE=debug" in mode[0] and "RUN_ID" not in mode[0] and
          "STATUS_DIR" not in mode[0], f"report header: {mode} {p.stderr[-300:]!r}")


def log_without_end(e):
    """A log without its end record: its process still running (read mid-run: 0, said) or killed
    (SIGKILL: 1, said, also with --fail-on-leaks and in JSON; it was 0)."""
    d = e.logdir()
    prog = ("import ctypes, sys, time\n"
            "rt = ctypes.CDLL('libcudart.so.13')\n"
            "p = ctypes.c_void_p()\n"
            "rt.cudaMalloc(ctypes.byref(p), 1 << 20)\n"
            "print('allocated', flush=True)\n"
            "time.sleep(120)\n")
    env = dict(e.env, CUMEMGUARD_LOG=os.path.join(d, "live.log"))
    # (A sanitized build's runtime first, as in every process of its tests: CMG_PRELOAD_FIRST.)
    preload = ":".join(x for x in (e.env.get("LD_PRELOAD", ""), e.shim) if x)
    child = subprocess.Popen(["python3", "-c", prog], cwd=d, stdout=subprocess.PIPE, text=True,
                             env=dict(env, LD_PRELOAD=preload))
    try:
        check(child.stdout.readline().strip() == "allocated", "the sleeping program did not start")
        log = os.path.join(d, "live.log")
        p = e.run(["report", "--no-symbolize", log])
        head = p.stdout.splitlines()[0] if p.stdout else ""
        check(p.returncode == 0 and head.endswith(", STILL RUNNING") and
              f"still running (no end record yet): pid {child.pid} is alive on this host" in
              p.stdout, f"report of a running process: rc {p.returncode} {p.stdout[:600]!r}")
        j = e.run(["report", "--json", log])
        doc = json.loads(j.stdout) if j.stdout.startswith("{") else {}
        check(j.returncode == 0 and doc.get("exit_status") == 0 and
              doc["logs"][0].get("running") is True,
              f"report --json of a running process: rc {j.returncode} {j.stdout[:300]!r}")
        page = os.path.join(d, "live.html")
        h = e.run(["report", "--html", page, log])
        html = open(page).read() if os.path.exists(page) else ""
        check(h.returncode == 0 and "still running" in html and ">truncated<" not in html,
              f"report --html of a running process: rc {h.returncode}, 'still running' in the "
              f"page: {'still running' in html}, '>truncated<': {'>truncated<' in html}")
    finally:
        child.kill()
        child.wait()
    for args in ([], ["--fail-on-leaks"]):
        p = e.run(["report", "--no-symbolize"] + args + [log])
        check(p.returncode == 1 and
              p.stdout.startswith("cumemguard report: 1 log, no findings; leaks not known, "
                                  "TRUNCATED") and
              "status   ended without its end record (killed?): " in p.stdout,
              f"report {args} of a killed process: rc {p.returncode} {p.stdout[:600]!r}")
    page = os.path.join(d, "killed.html")
    h = e.run(["report", "--html", page, log])
    html = open(page).read() if os.path.exists(page) else ""
    check(h.returncode == 1 and "still running" not in html and ">truncated<" in html,
          f"report --html of a killed process: rc {h.returncode}, 'still running' in the page: "
          f"{'still running' in html}")
    j = e.run(["report", "--json", log])
    doc = json.loads(j.stdout) if j.stdout.startswith("{") else {}
    check(j.returncode == 1 and doc.get("exit_status") == 1 and doc["logs"][0].get("running") is False,
          f"report --json of a killed process: rc {j.returncode} {j.stdout[:300]!r}")
    # Its pid given to a newer process: a log older than the process is not that process's.
    with open(log) as f:
        lines = f.read().splitlines(True)
    hdr = json.loads(lines[0])
    hdr["pid"] = os.getpid()
    hdr["start_unix_ns"] = 1_000_000_000 * 1_000_000_000  # 2001, before this process started
    reused = os.path.join(d, "reused.log")
    with open(reused, "w") as f:
        f.write(json.dumps(hdr) + "\n" + "".join(lines[1:]))
    p = e.run(["report", "--no-symbolize", reused])
    check(p.returncode == 1 and "(killed?)" in p.stdout,
          f"report of a log whose pid was reused: rc {p.returncode} {p.stdout[:400]!r}")


def report_outputs(e):
    """`-` as an output of report is standard output (it wrote a file named `-`): the bytes the
    file would hold, on stdout, and no file `-`; two outputs there at once are refused (64). A run
    in which every CUDA call failed (the toolkit's runtime, no driver) reads as not checked in the
    page and the JSON too (they said 0 findings)."""
    d = e.logdir()
    log = os.path.join(d, "p29.log")
    e.run(["run", "--no-summary", "--log", log, "--", e.rt, "P29"], cwd=d)
    text = e.run(["report", "--no-symbolize", log], cwd=d)
    for args, ref in ((["-o", "-"], None), (["--html", "-"], "page.html"),
                      (["--trace", "-"], "trace.json")):
        p = e.run(["report", "--no-symbolize"] + args + [log], cwd=d)
        want = text.stdout
        if ref:
            e.run(["report", "--no-symbolize", args[0], os.path.join(d, ref), log], cwd=d)
            with open(os.path.join(d, ref)) as f:
                want = f.read()
        headline = text.stdout.splitlines(True)[0]
        check(p.returncode == text.returncode == 1 and p.stdout == want and
              not os.path.exists(os.path.join(d, "-")) and
              p.stderr == ("" if not ref else headline),
              f"report {args}: rc {p.returncode} stdout {len(p.stdout)} bytes (want {len(want)}) "
              f"{p.stdout[:80]!r}, stderr {p.stderr!r}, a file '-': "
              f"{os.path.exists(os.path.join(d, '-'))}")
    for args, first, second in ((["--html", "-", "--trace", "-"], "--html -", "--trace -"),
                                (["-o", "-", "--html", "-"], "-o -", "--html -")):
        p = e.run(["report"] + args + [log], cwd=d)
        check(p.returncode == 64 and p.stdout == "" and p.stderr ==
              f"cumemguard report: {first} and {second} both write to standard output; name a "
              "file for one of them (see cumemguard report --help)\n",
              f"report {args}: rc {p.returncode} {p.stderr!r}")
    p = e.run(["report", "--json", "--trace", "-", log], cwd=d)
    check(p.returncode == 64 and p.stdout == "" and p.stderr ==
          "cumemguard report: --trace - writes to standard output, where the JSON report writes "
          "too; give that a file with -o OUT (see cumemguard report --help)\n",
          f"report --json --trace -: rc {p.returncode} {p.stderr!r}")
    libdir = os.environ.get("CMG_CUDA_LIBDIR", "")
    if not os.path.exists(os.path.join(libdir, "libcudart.so.13")):
        print(f"SKIP no-driver report: no CUDA runtime in CMG_CUDA_LIBDIR={libdir!r}")
        return
    nd = os.path.join(d, "nd.log")
    r = e.run(["run", "--no-summary", "--log", nd, "--", e.supp, "double"], cwd=d,
              extra={"LD_LIBRARY_PATH": libdir})
    fake = os.path.join(os.path.dirname(e.shim), "..", "tests", "fakecuda")
    fake = os.path.realpath(fake)
    short = "every CUDA call failed (3 calls) with 35 (cudaErrorInsufficientDriver)"
    p = e.run(["report", "--no-symbolize", nd], cwd=d)
    check(r.returncode == 0 and p.returncode == 0 and
          p.stdout.splitlines()[0] == f"cumemguard report: 1 log, not checked: {short}" and
          p.stdout.count("on a machine without a GPU, run with the fake CUDA stack of this "
                         f"build: LD_LIBRARY_PATH={fake}\n") == 1,
          f"no-driver report: rc {p.returncode} (run {r.returncode}) {p.stdout[:900]!r}")
    j = json.loads(e.run(["report", "--json", nd], cwd=d).stdout)
    got = j["logs"][0].get("every_call_failed") or {}
    check(j["findings"].get("not_checked") == 1 and
          {k: got.get(k) for k in ("calls", "res", "name", "fake_cuda")} ==
          {"calls": 3, "res": 35, "name": "cudaErrorInsufficientDriver", "fake_cuda": fake},
          f"no-driver JSON: {j['findings'].get('not_checked')} {got}")
    page = e.run(["report", "--html", "-", nd], cwd=d).stdout
    check(f'id="summary">1 log, not checked: {short}, 0 leaks</div>' in page and
          "<div class=\"bad\">nothing was checked: " + short in page and
          '<p class="ok">none</p>' not in page,
          f"no-driver page: {[l for l in page.splitlines() if 'summary' in l][:2]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cg", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--sanitized")
    e = Env(ap.parse_args())
    for step in (versions, usage_errors, exit_codes, profile, options_variable, signals, summary_order,
                 read_with, suppressions, generated_suppressions, runs_apart, option_rule,
                 log_target, default_log_target, crash_line_plural, unfinished_processes,
                 quick_exit_leaks, signal_leaks, config_refuses_as_run, env_attached, log_unset_variable,
                 alloc_conf_once,
                 alloc_conf_before_cuda, live_stacks, sanitized, interpreter_fifo, first_use,
                 log_without_end, report_outputs):
        # CMG_LAUNCHER_ONLY=name,name runs those steps alone (a developer's loop; the suite runs all).
        only = os.environ.get("CMG_LAUNCHER_ONLY")
        if not only or step.__name__ in only.split(","):
            step(e)
    if FAILURES:
        print(f"{len(FAILURES)} failed (files kept in {e.tmp})")
        sys.exit(1)
    if os.environ.get("CMG_KEEP_TMP") == "1":
        print(f"files kept in {e.tmp}")
    else:
        shutil.rmtree(e.tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
