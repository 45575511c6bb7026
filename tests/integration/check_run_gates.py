#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard run` refuses to start a run that would check nothing and still exit 0: a
# CUMEMGUARD_SHIM_PATH that is not the shim (66), a log path that is a device (73), an existing
# file there that is not a cumemguard log (73), a relative CUMEMGUARD_LOG made absolute as --log is,
# an unknown placeholder in the log's name (64), a
# launcher option given with an -e of the setting it makes (64), an -e of a variable the launcher
# sets or reads itself (64); and it says so when the
# environment disables the shim, or when no process of the run loaded it (a static program), where
# --error-exitcode N then exits N.
#   check_run_gates.py --cg CUMEMGUARD --build BUILD_DIR [--static PROGRAM]
import argparse
import os
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)
    return cond


class Env:
    def __init__(self, a):
        self.cg = os.path.abspath(a.cg)
        b = os.path.abspath(a.build)
        self.build = b
        self.rt = os.path.join(b, "tests", "integration", "runtime_cases")
        self.fake = os.path.join(b, "tests", "fakecuda")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_")}
        self.env["LD_LIBRARY_PATH"] = self.fake
        self.env.pop("LD_PRELOAD", None)
        # A sanitized build's runtime comes first in every process its shim is preloaded into
        # (an uninstrumented sh or true included); the launcher keeps what LD_PRELOAD holds.
        if os.environ.get("CMG_PRELOAD_FIRST"):
            self.env["LD_PRELOAD"] = os.environ["CMG_PRELOAD_FIRST"]
        self.static = os.path.abspath(a.static) if a.static else None
        self.tmp = tempfile.mkdtemp(prefix="cmg-gates-")

    def run(self, args, extra=None, cwd=None):
        env = dict(self.env, **(extra or {}))
        return subprocess.run([self.cg, "run"] + args, env=env, cwd=cwd or self.tmp, timeout=120,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace")

    def logdir(self):
        return tempfile.mkdtemp(dir=self.tmp)


def not_the_shim(e):
    # P29 frees twice: with the shim, --error-exitcode 9 exits 9. Preloading any other file ran it
    # unchecked and exited 0 (ld.so ignores a non-ELF file with one line, any shared object
    # silently).
    passwd = os.path.join(e.tmp, "passwd")
    with open(passwd, "w") as f:
        f.write("root:x:0:0:root:/root:/bin/sh\n")
    cudart = os.path.join(e.fake, "libcudart.so")
    # The Python package's policy library defines cumemguard_version too (it ran unchecked, and
    # was then blamed on a static program).
    policy = os.path.join(e.build, "python", "libcumemguard_policy.so")
    check(os.path.exists(policy), f"{policy} is not built")
    for path, why in ((passwd, "it is not an ELF file"),
                      (cudart, "it defines no cumemguard_stats_json symbol"),
                      (policy, "it defines no cumemguard_stats_json symbol")):
        d = e.logdir()
        p = e.run(["--error-exitcode", "9", "--", e.rt, "P29"],
                  extra={"CUMEMGUARD_SHIM_PATH": path}, cwd=d)
        want = (f"cumemguard run: {path} is not libcumemguard.so: {why}; the program was not "
                "started\n")
        check(p.returncode == 66 and p.stderr == want and p.stdout == "" and not os.listdir(d),
              f"CUMEMGUARD_SHIM_PATH={path}: rc {p.returncode} {p.stderr!r} {p.stdout!r} "
              f"{os.listdir(d)}")


def relative_shim_path(e):
    # A relative CUMEMGUARD_SHIM_PATH went into LD_PRELOAD as written: a process that changed
    # directory preloaded nothing (ld.so: "cannot be preloaded ... ignored"), and the gate passed.
    shim = os.path.join(e.build, "shim", "libcumemguard.so")
    rel = os.path.relpath(shim, e.tmp)
    sub = e.logdir()
    p = e.run(["--error-exitcode", "9", "--", "sh", "-c", f"cd {sub} && exec {e.rt} P29"],
              extra={"CUMEMGUARD_SHIM_PATH": rel}, cwd=e.tmp)
    check(p.returncode == 9 and "cannot be preloaded" not in p.stderr and
          "double-free" in p.stderr,
          f"CUMEMGUARD_SHIM_PATH={rel} (relative), the program in another directory: "
          f"rc {p.returncode} {p.stderr[-600:]!r}")


def relative_log(e):
    # A relative CUMEMGUARD_LOG (-e, the environment, an entry of CUMEMGUARD_OPTIONS) went into the
    # environment as written: a program that changed directory wrote its log there, and the list
    # of logs and the "read with" line named a file in the launcher's directory that was not there.
    # Made absolute against the launcher's directory, as --log is.
    self_cmd = os.path.realpath(e.cg)
    for args, extra in ((["-e", "CUMEMGUARD_LOG=rel.log"], None),
                        ([], {"CUMEMGUARD_LOG": "rel.log"}),
                        ([], {"CUMEMGUARD_OPTIONS": "log=rel.log"})):
        d, sub = e.logdir(), e.logdir()
        p = e.run(["--no-summary"] + args + ["--", "sh", "-c", f"cd {sub} && exec {e.rt} P29"],
                  extra=extra, cwd=d)
        log = os.path.join(d, "rel.log")
        check(p.returncode == 0 and os.listdir(d) == ["rel.log"] and os.listdir(sub) == [] and
              p.stderr.splitlines()[-2:] == [f"cumemguard: 1 log: {log}",
                                              f"cumemguard: read with: {self_cmd} report {log}"],
              f"relative log {args} {extra}: rc {p.returncode} in {d}: {os.listdir(d)}, in the "
              f"program's directory: {os.listdir(sub)}; {p.stderr[-400:]!r}")


def disabled(e):
    for extra, args, said in (
            ({"CUMEMGUARD_DISABLE": "1"}, [], "CUMEMGUARD_DISABLE=1"),
            ({}, ["-e", "CUMEMGUARD_DISABLE=yes"], "CUMEMGUARD_DISABLE=yes"),
            ({"CUMEMGUARD_OPTIONS": "disable=1"}, [], "CUMEMGUARD_OPTIONS=...disable=1")):
        for gate in ([], ["--error-exitcode", "9"]):
            d = e.logdir()
            p = e.run(args + gate + ["--", e.rt, "P29"], extra=extra, cwd=d)
            want = (f"cumemguard run: warning: {said}: the shim is disabled and checks nothing "
                    "in this run" + ("; a run that checks nothing fails --error-exitcode" if gate
                                     else "") + "\n")
            # The entry of CUMEMGUARD_OPTIONS still opens a log (of no events): listed after.
            # With the gate: its status, said on the last line (it exited 0: a green gate that
            # had looked at nothing).
            last = "cumemguard: the shim was disabled in this run; exiting 9 (--error-exitcode)\n"
            check(p.returncode == (9 if gate else 0) and p.stderr.splitlines(True)[:1] == [want]
                  and (not gate or p.stderr.splitlines(True)[-1:] == [last]) and
                  "warning: double-free" not in p.stderr and "second_free" in p.stdout,
                  f"disabled {extra} {args} {gate}: rc {p.returncode} {p.stderr!r}")
    p = e.run(["--", e.rt, "P29"], extra={"CUMEMGUARD_DISABLE": "0"}, cwd=e.logdir())
    check("disabled" not in p.stderr and "double-free" in p.stderr,
          f"CUMEMGUARD_DISABLE=0: {p.stderr!r}")


def log_paths(e):
    # A character device: the shim could write there, but the run then listed /dev/null as its log
    # to read, which the report refuses.
    for dev in ("/dev/null", "/dev/zero"):
        p = e.run(["--log", dev, "--", e.rt, "P29"])
        check(p.returncode == 73 and p.stdout == "" and p.stderr ==
              f"cumemguard run: cannot write the event log {dev}: not a regular file (a character "
              "device); the program was not started (give --log a writable place, or --no-log)\n",
              f"--log {dev}: rc {p.returncode} {p.stderr!r}")
    # An unknown placeholder, or %q without braces: refused as an unset %q{VAR} is, no file made.
    for name, why in (("x.%z.log", "'%z' is not a placeholder"),
                      ("x.%q.log", "'%q' needs a variable name in braces, as in %q{SLURM_JOB_ID}"),
                      ("x.log%", "'%' at the end is not a placeholder")):
        d = e.logdir()
        p = e.run(["--log", name, "--", e.rt, "P29"], cwd=d)
        check(p.returncode == 64 and p.stdout == "" and not os.listdir(d) and p.stderr ==
              f"cumemguard run: the event log {d}/{name}: {why} (placeholders: %p %r %l %h %e "
              "%q{VAR} %%); the program was not started\n",
              f"--log {name}: rc {p.returncode} {p.stderr!r} {os.listdir(d)}")
        p = e.run(["--", e.rt, "P29"], extra={"CUMEMGUARD_LOG": name}, cwd=d)
        check(p.returncode == 64 and why in p.stderr and not os.listdir(d),
              f"CUMEMGUARD_LOG={name}: rc {p.returncode} {p.stderr!r}")
    # An existing file that is not a log is kept; a log (or an empty file) is written over.
    d = e.logdir()
    keep = os.path.join(d, "notes.txt")
    with open(keep, "w") as f:
        f.write("precious\n")
    p = e.run(["--log", keep, "--", e.rt, "P29"], cwd=d)
    check(p.returncode == 73 and p.stdout == "" and p.stderr ==
          f"cumemguard run: cannot write the event log {keep}: it exists and is not a cumemguard "
          "event log (remove it, or name another log); the program was not started (give --log "
          "a writable place, or --no-log)\n" and open(keep).read() == "precious\n",
          f"--log over a text file: rc {p.returncode} {p.stderr!r} {open(keep).read()!r}")
    log = os.path.join(d, "run.log")
    open(log, "w").close()
    for k in range(2):
        p = e.run(["--no-summary", "--log", log, "--", e.rt, "P29"], cwd=d)
        check(p.returncode == 0 and f"cumemguard: 1 log: {log}\n" in p.stderr and
              open(log).readline().startswith('{"cumemguard_log"'),
              f"--log over {'an empty file' if k == 0 else 'a log'}: rc {p.returncode} "
              f"{p.stderr!r}")


def option_and_env(e):
    # One rule: a launcher option and an -e of the setting it makes are refused, neither winning.
    for opt, env, var in ((["--log", "a.log"], "CUMEMGUARD_LOG=b.log", "CUMEMGUARD_LOG"),
                          (["--no-log"], "CUMEMGUARD_LOG=b.log", "CUMEMGUARD_LOG"),
                          (["--log=a.log"], "CUMEMGUARD_OPTIONS=log=b.log", "CUMEMGUARD_LOG"),
                          (["--mode", "report"], "CUMEMGUARD_MODE=strict", "CUMEMGUARD_MODE"),
                          (["--mode", "strict"], "CUMEMGUARD_OPTIONS=mode=report:stacks=2",
                           "CUMEMGUARD_MODE"),
                          (["--stacks", "4"], "CUMEMGUARD_STACKS=8", "CUMEMGUARD_STACKS"),
                          (["--suppressions", "s.supp"], "CUMEMGUARD_SUPPRESSIONS=t.supp",
                           "CUMEMGUARD_SUPPRESSIONS"),
                          (["--brief"], "CUMEMGUARD_WARN_FRAMES=3", "CUMEMGUARD_WARN_FRAMES"),
                          (["--no-summary"], "CUMEMGUARD_SUMMARY=1", "CUMEMGUARD_SUMMARY")):
        d = e.logdir()
        p = e.run(opt + ["-e", env, "--", e.rt, "P29"], cwd=d)
        name = opt[0].split("=")[0]
        check(p.returncode == 64 and p.stdout == "" and not os.listdir(d) and p.stderr ==
              f"cumemguard run: {name} and -e {env} both set {var}; give one of them (the "
              "program was not started)\n", f"{opt} -e {env}: rc {p.returncode} {p.stderr!r}")
    # Settings of other options go through.
    d = e.logdir()
    p = e.run(["--mode", "report", "-e", "CUMEMGUARD_OPTIONS=stacks=2", "--no-summary",
               "--log", "x.log", "--", e.rt, "P29"], cwd=d)
    check(p.returncode == 0 and os.listdir(d) == ["x.log"], f"other -e: {p.returncode} "
          f"{p.stderr!r}")


def launcher_variables(e):
    # The launcher's own variables: an -e of one was dropped without a word (CUMEMGUARD_RUN_ID
    # replaced, CUMEMGUARD_SHIM_PATH given to the program while another shim was preloaded), or
    # taken for an outer launcher's (CUMEMGUARD_STATUS_DIR with CUMEMGUARD_RUN_ID: the counts went
    # to that directory). Each is refused before anything runs, P29's double free unchecked.
    shim = os.path.join(e.build, "shim", "libcumemguard.so")
    outer = tempfile.mkdtemp(dir=e.tmp)
    internal = "is set by the launcher and the shim themselves; -e cannot give it to the program"
    for sets, line in (
            (["CUMEMGUARD_RUN_ID=x"], f"-e CUMEMGUARD_RUN_ID=x: CUMEMGUARD_RUN_ID {internal}"),
            ([f"CUMEMGUARD_STATUS_DIR={outer}", "CUMEMGUARD_RUN_ID=x"],
             f"-e CUMEMGUARD_STATUS_DIR={outer}: CUMEMGUARD_STATUS_DIR {internal}"),
            (["CUMEMGUARD_SAID=1"], f"-e CUMEMGUARD_SAID=1: CUMEMGUARD_SAID {internal}"),
            ([f"CUMEMGUARD_SHIM_PATH={shim}"],
             f"-e CUMEMGUARD_SHIM_PATH={shim}: the launcher reads CUMEMGUARD_SHIM_PATH in its own "
             f"environment, not in the program's: set it before the command "
             f"(CUMEMGUARD_SHIM_PATH={shim} cumemguard run ...)")):
        d = e.logdir()
        args = [w for kv in sets for w in ("-e", kv)]
        p = e.run(["--error-exitcode", "9"] + args + ["--", e.rt, "P29"], cwd=d)
        check(p.returncode == 64 and p.stdout == "" and not os.listdir(d) and
              not os.listdir(outer) and
              p.stderr == f"cumemguard run: {line}; the program was not started\n",
              f"-e {sets}: rc {p.returncode} {p.stdout!r} {p.stderr!r} {os.listdir(outer)}")
    # The supported way: CUMEMGUARD_SHIM_PATH in the launcher's own environment.
    d = e.logdir()
    p = e.run(["--error-exitcode", "9", "--no-summary", "--", e.rt, "P29"],
              extra={"CUMEMGUARD_SHIM_PATH": shim}, cwd=d)
    check(p.returncode == 9, f"CUMEMGUARD_SHIM_PATH in the launcher's environment: rc "
                             f"{p.returncode} {p.stderr[-300:]!r}")


def unloaded(e):
    line = ("cumemguard: warning: no process of the run loaded the shim (ld.so ignores LD_PRELOAD "
            "for a static or setuid program): nothing was checked")
    if e.static:
        for gate, rc, tail in (([], 0, ""), (["--error-exitcode", "9"], 9,
                                             "; exiting 9 (--error-exitcode)")):
            p = e.run(gate + ["--", e.static], cwd=e.logdir())
            check(p.returncode == rc and p.stdout == "static program ran\n" and
                  p.stderr == line + tail + "\n",
                  f"static program {gate}: rc {p.returncode} {p.stdout!r} {p.stderr!r}")
    else:
        print("SKIP static program: no static linking here")
    # A program that loads the shim and never calls CUDA is checked (there is nothing to find),
    # and a program that cannot be run is not one that ran unchecked.
    for prog, rc in (("true", 0), ("/nonexistent-program", 127)):
        p = e.run(["--error-exitcode", "9", "--", prog], cwd=e.logdir())
        check(p.returncode == rc and "loaded the shim" not in p.stderr,
              f"{prog}: rc {p.returncode} {p.stderr!r}")
    # A disabled shim is said once, not twice.
    p = e.run(["--", "true"], extra={"CUMEMGUARD_DISABLE": "1"}, cwd=e.logdir())
    check(p.returncode == 0 and p.stderr.count("\n") == 1 and "disabled" in p.stderr,
          f"disabled, no CUDA: rc {p.returncode} {p.stderr!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cg", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--static")
    e = Env(ap.parse_args())
    for t in (not_the_shim, relative_shim_path, relative_log, disabled, log_paths, option_and_env,
              launcher_variables, unloaded):
        t(e)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
