#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard run` against hostile hosts and files (docs/reliability.md, "The launcher"): its exit
# status counts every process's findings whatever the log names are and whether or not a log could
# be written (each process tells the launcher directly), a log that cannot be written stops the run
# before it starts (73), two processes on one log name keep one log each, files planted where the
# launcher looks (another user's FIFO, a /dev/zero link) never stop it, the program's core file is
# the program's, and a launcher killed outright takes its program with it.
#   run_launcher.py --build BUILD_DIR CASE
# CMG_TEST_CUMEMGUARD runs the cases with another build's launcher (with CMG_TEST_SHIM naming that
# build's shim) to see a regression test fail on the code from before its fix.
import argparse
import json
import os
import resource
import select
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Build, Failure, expect, read_log, run_case, scale, steps  # noqa: E402

NOBODY = 65534


class Launcher:
    def __init__(self, b, tmp):
        self.b, self.tmp = b, tmp
        self.cg = os.environ.get("CMG_TEST_CUMEMGUARD") or b.prog("tools", "cumemguard")
        self.rt = b.prog("tests", "integration", "runtime_cases")
        self.life = b.prog("tests", "reliability", "life_cases")

    def env(self, extra=None):
        env = self.b.env(shim=False, extra=extra)
        if self.b.first:
            env["LD_PRELOAD"] = self.b.first
        env["CUMEMGUARD_SHIM_PATH"] = self.b.shim
        return env

    def run(self, args, cwd=None, extra=None, timeout=60, preexec=None, stdin=None):
        timeout *= scale()
        try:
            p = subprocess.run([self.cg, "run"] + args, env=self.env(extra), cwd=cwd or self.tmp,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                               preexec_fn=preexec, stdin=stdin)
        except subprocess.TimeoutExpired:
            raise Failure(f"cumemguard run {' '.join(args)}: no exit within {timeout} s (hung)")
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")

    def dir(self):
        return tempfile.mkdtemp(dir=self.tmp)


def listed_logs(err):
    lines = [l for l in err.splitlines() if l.startswith("cumemguard: ") and " log" in l and
             ": " in l[12:] and l.split(":")[1].strip().split(" ")[0].isdigit()]
    if not lines:
        return []
    return lines[-1].split(": ", 2)[2].split(" ")


def findings_in(path, cls="double-free"):
    recs, _ = read_log(path)
    return [r for r in recs if r.get("k") == "finding" and r.get("class") == cls]


def case_exit_status_log_names(l):
    """Placeholders and glob characters in the log name, and no log at all: the status still
    counts the finding (it used to come from a glob of the logs, with only %p and %r replaced)."""
    d = l.dir()
    names = [("x.%h.log", {}), ("x.%e.log", {}), ("x.%l.log", {"LOCAL_RANK": "2"}),
             ("x.%q{CMG_JOB}.log", {"CMG_JOB": "j7"}), ("x[1].log", {}), ("x*.log", {}),
             ("x?.log", {}), ("sub.%p/x.log", {})]
    for pattern, extra in names:
        sub = tempfile.mkdtemp(dir=d)
        rc, _, err = l.run(["--no-summary", "--log", os.path.join(sub, pattern),
                            "--error-exitcode", "3", "--", l.rt, "P29"], extra=extra)
        expect(rc == 3 and "1 finding in this run; exiting 3 (--error-exitcode)" in err,
               f"--log {pattern}: rc {rc}\n{err[-1500:]}")
        if "%p" not in pattern:
            logs = listed_logs(err)
            expect(len(logs) == 1 and os.path.dirname(logs[0]) == sub and
                   len(findings_in(logs[0])) == 1,
                   f"--log {pattern}: listed {logs}, files {os.listdir(sub)}")
    rc, _, err = l.run(["--no-summary", "--no-log", "--error-exitcode", "3", "--", l.rt, "P29"])
    expect(rc == 3, f"--no-log: rc {rc}\n{err[-1500:]}")
    # A log that could not be opened (the shim goes on without one): still counted.
    rc, _, err = l.run(["--no-summary", "--log", os.path.join(d, "sub.%p", "x.log"),
                        "--error-exitcode", "3", "--", l.rt, "P29"])
    expect(rc == 3 and "cannot open event log" in err, f"unopenable log: rc {rc}\n{err[-1500:]}")


def case_exit_status_forked_child(l):
    """A finding in a forked child (it frees its parent's allocation), whose log is LOG.<pid> (the
    parent's LOG is taken), and one in a child killed by SIGKILL right after it (no exit path
    ran)."""
    for how in ("fork-finding", "fork-finding-kill"):
        d = l.dir()
        log = os.path.join(d, "fork.log")
        rc, out, err = l.run(["--no-summary", "--log", log, "--error-exitcode", "3", "--",
                              l.life, how])
        s = steps(out)
        want_child = "0" if how == "fork-finding" else str(128 + signal.SIGKILL)
        expect(s.get("child_status") == want_child and s.get("free") == "0",
               f"{how}: the program's steps {s}")
        expect(rc == 3 and "1 finding in this run" in err, f"{how}: rc {rc}\n{err[-1500:]}")
        parent = json.loads(open(log).readline())
        child = [n for n in os.listdir(d) if n != "fork.log"]
        expect(len(child) == 1 and child[0].startswith("fork.log."), f"{how}: logs {os.listdir(d)}")
        recs, _ = read_log(os.path.join(d, child[0]), allow_cut_last=True)
        expect(recs[0]["ppid"] == parent["pid"] and
               len([r for r in recs if r.get("class") == "invalid-free"]) == 1,
               f"{how}: the child's log {child[0]}: {recs[:1]}")
        expect(not findings_in(log, "invalid-free"),
               f"{how}: the parent's log has the child's finding")


def case_exit_status_tree(l):
    """Children of children, exec'd children, --fail-on-leaks over a grandchild's leak, and a
    launcher run inside the program."""
    d = l.dir()
    rc, _, err = l.run(["--no-summary", "--log", os.path.join(d, "t.log"), "--error-exitcode", "3",
                        "--", "sh", "-c", f"sh -c 'exec {l.rt} P29'; {l.rt} basic"])
    expect(rc == 3 and "1 finding in this run" in err, f"grandchild's finding: rc {rc}\n{err}")
    rc, _, err = l.run(["--no-summary", "--no-log", "--error-exitcode", "4", "--fail-on-leaks",
                        "--", "sh", "-c", f"sh -c '{l.rt} leak'; exit 0"])
    expect(rc == 4 and "(leaks at exit included)" in err, f"grandchild's leak: rc {rc}\n{err}")
    rc, _, err = l.run(["--no-summary", "--no-log", "--error-exitcode", "4", "--", "sh", "-c",
                        f"{l.rt} leak"])
    expect(rc == 0, f"a leak without --fail-on-leaks: rc {rc}\n{err}")
    # A script that runs `cumemguard run` itself: the inner run's findings and logs reach the
    # outer launcher too (the inner one has no --error-exitcode: its own status is 0).
    inner = os.path.join(d, "inner.log")
    rc, _, err = l.run(["--no-summary", "--log", os.path.join(d, "outer.log"),
                        "--error-exitcode", "3", "--", "sh", "-c",
                        f"{l.cg} run --no-summary --log {inner} -- {l.rt} P29; {l.rt} basic"])
    logs = listed_logs(err)
    expect(rc == 3 and "1 finding in this run" in err and inner in logs and
           os.path.join(d, "outer.log") in logs,
           f"a launcher inside the run: rc {rc} {logs}\n{err}")
    # An inner run with several logs and a crashed process: the outer one lists every log and,
    # with --fail-on-leaks, says the crashed one's leaks were not checked (the inner run passes
    # its records up as they ended).
    crash = os.path.join(d, "crash.py")
    with open(crash, "w") as f:
        f.write("import ctypes, os, signal\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "p = ctypes.c_void_p()\n"
                "rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096))\n"
                "os.kill(os.getpid(), signal.SIGSEGV)\n")
    extra = {k: (os.environ[k] + ":" if os.environ.get(k) else "") + "handle_segv=0"
             for k in ("ASAN_OPTIONS", "TSAN_OPTIONS")}
    inner = os.path.join(d, "many.%p.log")
    rc, _, err = l.run(["--no-summary", "--log", os.path.join(d, "outer2.log"), "--fail-on-leaks",
                        "--error-exitcode", "3", "--", "sh", "-c",
                        f"{l.cg} run --no-summary --log {inner} -- sh -c "
                        f"'{l.rt} basic; {l.rt} basic; {l.rt} basic; {sys.executable} {crash}'; "
                        "exit 0"], extra=extra)
    logs = listed_logs(err)
    many = [x for x in logs if os.path.basename(x).startswith("many.")]
    expect(rc == 0 and len(many) == 4 and
           "cumemguard: 1 process ended by a fatal signal: its leaks were not checked and are "
           "not in --fail-on-leaks' count" in err.splitlines(),
           f"an inner run's four logs and crash: rc {rc} {logs}\n{err}")


def case_log_unwritable(l):
    """valgrind's --log-file rule: a log that cannot be written stops the run before the program
    starts, with status 73 and one line; the program never runs."""
    d = l.dir()
    marker = os.path.join(d, "ran")
    prog = ["--", "sh", "-c", f"touch {marker}"]
    fifo = os.path.join(d, "fifo.log")
    os.mkfifo(fifo)
    os.symlink(os.path.join(d, "elsewhere"), os.path.join(d, "link.log"))
    os.mkdir(os.path.join(d, "dir.log"))
    cases = [(os.path.join(d, "no", "such", "x.log"), "No such file or directory"),
             (os.path.join(d, "no", "%p", "x.%p.log"), "No such file or directory"),
             (fifo, "FIFO"), (os.path.join(d, "link.log"), "symbolic link"),
             (os.path.join(d, "dir.log"), "directory")]
    for path, words in cases:
        rc, _, err = l.run(["--log", path] + prog, timeout=20)
        lines = err.splitlines()
        expect(rc == 73 and len(lines) == 1 and words in lines[0] and "not started" in lines[0]
               and not os.path.exists(marker), f"--log {path}: rc {rc} {err!r}")
    # The same for a log named in the environment.
    rc, _, err = l.run(prog, extra={"CUMEMGUARD_LOG": os.path.join(d, "no", "x.log")})
    expect(rc == 73 and len(err.splitlines()) == 1 and not os.path.exists(marker),
           f"CUMEMGUARD_LOG in a missing directory: rc {rc} {err!r}")
    expect(stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced")
    if os.geteuid() == 0:
        # Not writable for the user who runs: a root-owned 0755 directory, run as nobody.
        ro = os.path.join(d, "ro")
        os.mkdir(ro, 0o755)
        os.chmod(d, 0o755)
        os.chmod(l.tmp, 0o755)
        rc, _, err = l.run(["--log", os.path.join(ro, "x.log")] + prog, cwd=ro,
                           preexec=lambda: os.setuid(NOBODY))
        expect(rc == 73 and "not writable" in err and len(err.splitlines()) == 1,
               f"a directory nobody cannot write: rc {rc} {err!r}")


def check_own_log(path, cue_pid=None):
    recs, _ = read_log(path)
    with open(path, "rb") as f:
        expect(b"\0" not in f.read(), f"{path}: NUL bytes (two writers in one file)")
    hdrs = [r for r in recs if "cumemguard_log" in r]
    expect(len(hdrs) == 1 and recs[0] is hdrs[0], f"{path}: {len(hdrs)} headers")
    expect(recs[-1].get("k") == "end", f"{path}: does not end with `end`")
    expect(len([r for r in recs if r.get("class") == "double-free"]) == 1,
           f"{path}: not one double-free finding")
    if cue_pid is not None:
        expect(hdrs[0]["pid"] == cue_pid, f"{path}: header of pid {hdrs[0]['pid']}, not {cue_pid}")
    return hdrs[0]["pid"]


def case_log_shared_sequential(l):
    """A log name without %p, two processes one after the other in one run: the second keeps its
    own NAME.<pid> and the first's log stays whole (it used to be truncated, its finding lost)."""
    d = l.dir()
    log = os.path.join(d, "same.log")
    rc, _, err = l.run(["--no-summary", "--log", log, "--error-exitcode", "3", "--", "sh", "-c",
                        f"{l.rt} P29; {l.rt} P29"])
    names = sorted(os.listdir(d))
    expect(rc == 3 and "2 findings in this run" in err, f"rc {rc}\n{err[-1500:]}")
    expect(len(names) == 2 and names[0] == "same.log" and names[1].startswith("same.log."),
           f"logs {names}")
    pids = {check_own_log(os.path.join(d, n)) for n in names}
    expect(len(pids) == 2, f"two logs of one process: {pids}")
    expect(int(names[1][len("same.log."):]) in pids,
           f"{names[1]} is not named after its pid {pids}")
    expect(listed_logs(err) == [os.path.join(d, n) for n in names], f"listed {listed_logs(err)}")
    # A later run replaces what an earlier run left, as before.
    rc, _, err = l.run(["--no-summary", "--log", log, "--", l.rt, "P29"])
    expect(rc == 0 and len(os.listdir(d)) == 2 and json.loads(open(log).readline())["pid"] not in
           pids, f"a later run: rc {rc}, logs {os.listdir(d)}")


def cue_pair(l, argv, env, label, want):
    """Starts two finding-on-cue processes on one log name, lets both go only once both hold a log,
    and returns their pids."""
    procs = [subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, cwd=l.tmp) for _ in range(2)]
    pids = []
    try:
        for p in procs:
            r, _, _ = select.select([p.stdout], [], [], 30 * scale())
            line = p.stdout.readline().decode() if r else ""
            expect(line.startswith("ready "), f"{label}: no ready line from {p.pid}: {line!r}")
            pids.append(int(line.split()[1]))
        for p in procs:
            p.stdin.write(b"x")
            p.stdin.close()
        for p in procs:
            out, err = p.stdout.read(), p.stderr.read()
            p.wait(timeout=30 * scale())
            # Under the launcher (one per process here) the finding is its exit status.
            expect(p.returncode == want and steps(out.decode()).get("second_free") == "0",
                   f"{label}: exit {p.returncode} {out!r} {err[-1500:]!r}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return pids


def case_log_shared_concurrent(l):
    """Two processes at once on one log name: each writes a log of its own (the first the name, the
    second NAME.<pid>), with its own header and finding; they used to share one file (one header,
    megabytes of NUL bytes where each wrote at its own offset). Without the launcher, and with two
    launchers at once (two runs on one name)."""
    b = l.b
    for under_run in (False, True):
        d = l.dir()
        log = os.path.join(d, "shared.log")
        if under_run:
            env = dict(l.env(), CUMEMGUARD_SUMMARY="0")
            argv = [l.cg, "run", "--no-summary", "--log", log, "--error-exitcode", "3", "--",
                    l.life, "finding-on-cue"]
        else:
            env = b.env(log=log)
            argv = [l.life, "finding-on-cue"]
        pids = cue_pair(l, argv, env, "run" if under_run else "LD_PRELOAD", 3 if under_run else 0)
        names = sorted(os.listdir(d))
        expect(len(names) == 2 and names[0] == "shared.log" and names[1].startswith("shared.log."),
               f"logs {names}")
        got = {check_own_log(os.path.join(d, n)) for n in names}
        if not under_run:
            expect(got == set(pids), f"logs of {got}, processes {pids}")
        expect(int(names[1].rsplit(".", 1)[1]) in got, f"{names[1]} is not named after its pid")


def case_planted_glob_files(l):
    """Another user's FIFO and a /dev/zero link planted where the old log glob looked (the current
    directory, named like this run's logs): the launcher neither hangs nor reads them, lists only
    its own log and counts its finding."""
    shared = os.path.join(l.tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    fifo = os.path.join(shared, "cumemguard.runtime_cases.1.log")
    zero = os.path.join(shared, "cumemguard.runtime_cases.2.log")
    os.mkfifo(fifo, 0o666)
    os.symlink("/dev/zero", zero)
    if os.geteuid() == 0:
        os.chown(fifo, NOBODY, NOBODY)
        os.lchown(zero, NOBODY, NOBODY)
    rc, _, err = l.run(["--no-summary", "--error-exitcode", "3", "--", l.rt, "P29"], cwd=shared,
                       timeout=30)
    logs = listed_logs(err)
    expect(rc == 3 and len(logs) == 1 and logs[0] not in (fifo, zero) and
           len(findings_in(logs[0])) == 1, f"rc {rc} logs {logs}\n{err[-1500:]}")
    expect(stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.readlink(zero) == "/dev/zero",
           "a planted file was changed")


def case_planted_status_files(l):
    """The program itself leaves a FIFO, a /dev/zero link, a large file and a directory in the
    run's status directory: the launcher reads none of them as a record, says so in one line, still
    counts the real process, and removes the directory."""
    d = l.dir()
    seen = os.path.join(d, "dir")
    script = ('s="$CUMEMGUARD_STATUS_DIR"; echo "$s" > ' + seen + '; mkfifo "$s/1.0"; '
              'ln -s /dev/zero "$s/2.0"; head -c 100000 /dev/zero > "$s/3.0"; mkdir "$s/4.0"; '
              f'exec {l.rt} P29')
    rc, _, err = l.run(["--no-summary", "--no-log", "--error-exitcode", "3", "--", "sh", "-c",
                        script], timeout=30)
    expect(rc == 3, f"rc {rc}\n{err[-1500:]}")
    warn = [x for x in err.splitlines() if "status directory" in x]
    expect(len(warn) == 1 and warn[0].startswith("cumemguard: warning: 4 entries") and
           "the other 1" in warn[0], f"the unreadable entries: {warn}")
    sdir = open(seen).read().strip()
    expect(sdir and not os.path.exists(sdir), f"the status directory {sdir!r} was left behind")


def case_program_fifo(l):
    """PROGRAM is a FIFO with the execute bit: the launcher reads its `#!` line without blocking,
    and the exec fails as it does without the launcher (126)."""
    d = l.dir()
    prog = os.path.join(d, "prog")
    os.mkfifo(prog)
    os.chmod(prog, 0o755)
    rc, _, err = l.run(["--no-summary", "--no-log", "--", prog], timeout=20)
    expect(rc == 126 and "cannot run" in err, f"rc {rc} {err!r}")


def core_note(path):
    """(pid, program name) from the NT_PRPSINFO note of an x86-64 core file."""
    data = open(path, "rb").read()
    expect(data[:4] == b"\x7fELF", f"{path} is not an ELF file")
    phoff, = struct.unpack_from("<Q", data, 32)
    phnum, = struct.unpack_from("<H", data, 56)
    for i in range(phnum):
        p_type, _, off, _, _, size = struct.unpack_from("<IIQQQQ", data, phoff + i * 56)
        if p_type != 4:  # PT_NOTE
            continue
        o = off
        while o + 12 <= off + size:
            namesz, descsz, ntype = struct.unpack_from("<III", data, o)
            desc = o + 12 + ((namesz + 3) & ~3)
            if ntype == 3:  # NT_PRPSINFO: pr_pid at 24, pr_fname[16] at 40
                pid, = struct.unpack_from("<I", data, desc + 24)
                return pid, data[desc + 40:desc + 56].split(b"\0")[0].decode()
            o = desc + ((descsz + 3) & ~3)
    raise Failure(f"{path}: no NT_PRPSINFO note")


def case_core_file(l):
    """With core dumps on, the program's core file stays the program's: the launcher dies of the
    program's signal without dumping a core of its own (the kernel's status for it has no core
    flag), so it never replaces the program's `core` in the same directory. A shell killing
    itself, and a CUDA program under the shim (its crash handler re-raises), by SIGSEGV and
    SIGABRT. Cores are limited to 64 MiB: the note naming the process comes first, and the fake
    driver's reservations would make a whole core many gigabytes of zeros."""
    pattern = open("/proc/sys/kernel/core_pattern").read().strip()
    runs = [(["sh", "-c", "kill -SEGV $$"], signal.SIGSEGV, "sh"),
            (["sh", "-c", "kill -ABRT $$"], signal.SIGABRT, "sh"),
            ([l.life, "crash-segv"], signal.SIGSEGV, "life_cases"),
            ([l.life, "crash-abort"], signal.SIGABRT, "life_cases")]
    for argv, sig, name in runs:
        label = " ".join(os.path.basename(a) for a in argv)
        d = l.dir()
        env = l.env()
        for k in ("ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"):
            env[k] = (env[k] + ":" if env.get(k) else "") + \
                "handle_segv=0:handle_sigbus=0:handle_abort=0:disable_coredump=0"

        def cores_on():
            resource.setrlimit(resource.RLIMIT_CORE, (64 << 20, 64 << 20))
        p = subprocess.Popen([l.cg, "run", "--no-summary", "--no-log", "--"] + argv, env=env,
                             cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=cores_on)
        err = p.stderr.read()
        _, status = os.waitpid(p.pid, 0)  # the raw status, with its core flag
        p.returncode = -sig  # reaped here: Popen must not wait for it again
        expect(os.WIFSIGNALED(status) and os.WTERMSIG(status) == sig,
               f"{label}: launcher status {status:#x}\n{err[-1500:]!r}")
        expect(not os.WCOREDUMP(status), f"{label}: the launcher dumped a core of its own")
        if pattern == "core":
            # The kernel writes `core` in the crashing process's directory: the program's, here.
            core = os.path.join(d, "core")
            expect(os.path.exists(core), f"{label}: the program left no core")
            pid, got = core_note(core)
            expect(got == name and pid != p.pid,
                   f"{label}: the core is of {got} (pid {pid}); the launcher was {p.pid}")
            os.unlink(core)
        else:
            print(f"core-file: core_pattern is {pattern!r}: the launcher's own status checked")


def case_orphan(l):
    """SIGKILL to the launcher (a timeout, subprocess.run(timeout=...)): the program does not go
    on with parent 1, it is killed too (PR_SET_PDEATHSIG). Waited on with a pidfd, no sleeps."""
    launcher = subprocess.Popen([l.cg, "run", "--no-summary", "--no-log", "--", l.life, "idle"],
                                env=l.env(), cwd=l.tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    try:
        r, _, _ = select.select([launcher.stdout], [], [], 30 * scale())
        expect(r and launcher.stdout.readline() == b"idle\n", "the program did not start")
        children = []
        for e in os.listdir("/proc"):
            if e.isdigit():
                try:
                    fields = open(f"/proc/{e}/stat").read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == launcher.pid:
                    children.append(int(e))
        expect(len(children) == 1, f"the launcher's children: {children}")
        # What a launcher killed outright cannot remove: its status directory (removed here).
        env = open(f"/proc/{children[0]}/environ", "rb").read().split(b"\0")
        status_dir = [e.split(b"=", 1)[1].decode() for e in env
                      if e.startswith(b"CUMEMGUARD_STATUS_DIR=")]
        fd = os.pidfd_open(children[0])
        launcher.kill()
        launcher.wait()
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        gone = poll.poll(int(10000 * scale()))
        if not gone:
            os.kill(children[0], signal.SIGKILL)
        os.close(fd)
        for sd in status_dir:
            shutil.rmtree(sd, ignore_errors=True)
        expect(gone, f"the program {children[0]} outlived the SIGKILLed launcher")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    b = Build(a.build)
    tmp = tempfile.mkdtemp(prefix=f"cmg-launcher-{a.case}-")
    os.chmod(tmp, 0o755)
    cases = {
        "exit-status-log-names": case_exit_status_log_names,
        "exit-status-forked-child": case_exit_status_forked_child,
        "exit-status-tree": case_exit_status_tree,
        "log-unwritable": case_log_unwritable,
        "log-shared-sequential": case_log_shared_sequential,
        "log-shared-concurrent": case_log_shared_concurrent,
        "planted-glob-files": case_planted_glob_files,
        "planted-status-files": case_planted_status_files,
        "program-fifo": case_program_fifo,
        "core-file": case_core_file,
        "orphan": case_orphan,
    }
    return run_case(a.case, lambda: cases[a.case](Launcher(b, tmp)), tmp)


if __name__ == "__main__":
    sys.exit(main())
