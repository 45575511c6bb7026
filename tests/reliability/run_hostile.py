#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Hostile and broken input (docs/reliability.md): every CUMEMGUARD_* variable with garbage, huge
# values and empty strings; attacks on the log path (a planted symlink, FIFO or file, a missing or
# unusable directory); a full disk; another interposer preloaded before or after the shim. In every
# case the program must run exactly as without the shim (same statuses, exit 0) and the shim may
# say so in at most one clear line per problem on stderr.
import argparse
import os
import resource
import re
import signal
import stat
import subprocess
import sys
import tempfile
import json
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Build, Failure, expect, logs_in, read_log, run_case, scale, steps,  # noqa: E402
                     stderr_lines)

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GARBAGE = ["", "garbage", "-1", "0", "99999999999999999999999999", "18446744073709551616",
           "1e400", "0x10", " 1", "1 ", "\x1b[2J\x1b[31mred", "a\nb", "\xff\xfe",
           "%n%n%n%s%s%p", "A" * 100000, "a\u202egpj.exe"]
MAX_LINE = 2100  # one clear line: the shim shortens what it quotes
# Bidi_Control and the line/paragraph separators: U+202E makes the terminal show the rest reversed.
BIDI = set("\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def options():
    names = re.findall(r'CMG_OPTION\(\w+, "(\w+)", (\w+)',
                       open(os.path.join(SRC, "policy", "options.def")).read())
    return names + [("ACTION_DOUBLE_RELEASE", "Enum"), ("ACTION_LEAK", "Enum")]


def clean_lines(err, label):
    """Every stderr line of the shim: printable, bounded; returns them."""
    lines = stderr_lines(err)
    other = [l for l in err.splitlines() if l and not l.startswith("cumemguard")]
    expect(not other, f"{label}: stderr lines not from the shim: {[o[:200] for o in other[:5]]}")
    for l in lines:
        expect(len(l) <= MAX_LINE, f"{label}: a {len(l)}-byte stderr line")
        expect(not any(ord(c) < 0x20 or ord(c) == 0x7f or c in BIDI for c in l),
               f"{label}: control characters on stderr: {l[:200]!r}")
    return lines


class Runner:
    def __init__(self, b, tmp):
        self.b, self.tmp = b, tmp
        self.basic = [b.prog("tests", "integration", "runtime_cases"), "basic"]
        rc, out, err = b.run(self.basic, b.env(shim=False))
        expect(rc == 0, f"baseline: {rc} {err}")
        self.base = steps(out)

    def run(self, extra, label, argv=None, cwd=None, timeout=60, preexec=None, log=True):
        timeout *= scale()
        d = tempfile.mkdtemp(dir=self.tmp)
        env = self.b.env(log=os.path.join(d, "log.%p") if log else None, extra=extra)
        t0 = time.monotonic()
        try:
            p = subprocess.run(argv or self.basic, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=timeout, cwd=cwd or d,
                               preexec_fn=preexec)
        except subprocess.TimeoutExpired:
            raise Failure(f"{label}: no exit within {timeout} s (hung)")
        out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
        expect(p.returncode == 0, f"{label}: exit {p.returncode}\n{err[-2000:]}")
        if argv is None:
            expect(steps(out) == self.base, f"{label}: statuses {steps(out)} != {self.base}")
        for p in logs_in(d):
            recs, _ = read_log(p)  # whole JSON lines, however hostile the input
            expect(recs and recs[-1].get("k") == "end", f"{label}: {p} does not end with `end`")
        return out, err, d, time.monotonic() - t0


def case_options_garbage(r):
    runs = 0
    for name, kind in options():
        if name in ("LOG", "DISABLE"):
            continue  # LOG is a path (cases below); DISABLE is read before the rest
        for v in GARBAGE:
            label = f"CUMEMGUARD_{name}={v[:20]!r}"
            extra = {f"CUMEMGUARD_{name}": v}
            if name == "MODE" and v == "":
                pass
            _, err, _, dt = r.run(extra, label)
            runs += 1
            lines = clean_lines(err, label)
            about = [l for l in lines if f"CUMEMGUARD_{name}" in l]
            expect(len(about) <= 1, f"{label}: {len(about)} lines about it: {about}")
            for l in about:
                if name == "TORCH_ALLOC_CONF":  # a string: PyTorch's grammar decides, not ours
                    expect("not applied" in l and "driver" not in l, f"{label}: unclear line {l[:300]}")
                elif name == "SUPPRESSIONS":  # a path: one line saying it cannot be read
                    expect("cannot read" in l and "no suppressions loaded" in l,
                           f"{label}: unclear line {l[:300]}")
                elif name == "STATUS_DIR":  # the launcher's directory: one line, what is lost
                    expect("cannot keep this process's status" in l and "will not count" in l,
                           f"{label}: unclear line {l[:300]}")
                else:
                    expect("not valid" in l and "keeping" in l, f"{label}: unclear line {l[:300]}")
            expect(dt < 10 * scale(), f"{label}: took {dt:.1f} s")
            if kind in ("Int", "Size", "Enum") and v in ("garbage", "1e400", "\xff\xfe", "A" * 100000):
                expect(len(about) == 1, f"{label}: an invalid value without its one line: {lines}")
    # DISABLE with garbage: not a boolean, so the shim stays enabled (and still says so once).
    _, err, d, _ = r.run({"CUMEMGUARD_DISABLE": "maybe"}, "DISABLE=maybe")
    expect(logs_in(d), "DISABLE=maybe turned the shim off")
    print(f"options-garbage: {runs} runs")


def case_unknown_names(r):
    _, err, _, _ = r.run({"CUMEMGUARD_MODEE": "guard"}, "typo")
    lines = clean_lines(err, "typo")
    expect(len(lines) == 1 and "did you mean CUMEMGUARD_MODE" in lines[0], f"typo: {lines}")
    many = {f"CUMEMGUARD_X{i}": "1" for i in range(300)}
    many["CUMEMGUARD_" + "Q" * 120000] = "1"           # near the kernel's limit for one string
    many["CUMEMGUARD_\x1b[31mRED"] = "1"               # a name that would drive the terminal
    _, err, _, dt = r.run(many, "many unknown names", timeout=60)
    lines = clean_lines(err, "many unknown names")
    expect(dt < 5 * scale(), f"302 unknown names took {dt:.1f} s")
    expect(any("more unknown" in l for l in lines), f"the unknown names beyond the first are not counted: {lines}")
    expect(len(lines) <= 25, f"{len(lines)} stderr lines for unknown names (expected a bounded number)")


def case_options_unclosed_quote(r):
    """A quote opened in a CUMEMGUARD_OPTIONS value and never closed swallowed every entry after
    it without a word (here mode=report and the log name). Now it is said once and taken as a
    plain character: the entries after it apply."""
    _, err, d, _ = r.run({"CUMEMGUARD_OPTIONS": "stacks='8:mode=report"}, "unclosed quote")
    lines = clean_lines(err, "unclosed quote")
    expect(len([l for l in lines if "the quote in 'stacks='8' is not closed" in l]) == 1,
           f"unclosed quote: no single line saying so: {lines}")
    (log,) = logs_in(d)
    header = read_log(log)[0][0]
    expect(header.get("mode") == "report", f"unclosed quote: mode {header.get('mode')!r}, the "
                                           "entry after the quote was lost")


def run_envp(argv, envp, timeout):
    """Runs argv with exactly this environment list, repeated names included (a dict cannot):
    the list goes to a trampoline on its stdin, and the trampoline calls execve(2) with it."""
    tramp = ("import ctypes, sys\n"
             "env = sys.stdin.buffer.read().split(b'\\0')\n"
             "arr = lambda l: (ctypes.c_char_p * (len(l) + 1))(*l, None)\n"
             "args = [a.encode() for a in sys.argv[1:]]\n"
             "ctypes.CDLL(None).execve(args[0], arr(args), arr(env))\n"
             "sys.exit(127)\n")
    return subprocess.run([sys.executable, "-c", tramp] + argv,
                          input="\0".join(envp).encode("utf-8", "surrogateescape"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout * scale())


def case_env_duplicates(r):
    """A name present twice is read as getenv() reads it (the first entry), by the shim and by
    `cumemguard config` alike; 20,000 bad values of one name give a bounded number of lines."""
    d = tempfile.mkdtemp(dir=r.tmp)
    first, second = os.path.join(d, "first.%p.log"), os.path.join(d, "second.%p.log")
    base = [f"{k}={v}" for k, v in r.b.env().items()]
    prog = [r.b.prog("tests", "integration", "runtime_cases"), "P29"]
    envp = base + ["CUMEMGUARD_MODE=report", f"CUMEMGUARD_LOG={first}", "CUMEMGUARD_MODE=strict",
                   f"CUMEMGUARD_LOG={second}"]
    p = run_envp(prog, envp, 60)
    err = p.stderr.decode(errors="replace")
    # report (the first MODE) forwards the second free; strict would have aborted.
    expect(p.returncode == 0, f"duplicates: exit {p.returncode} (strict, the second entry, won?)\n{err}")
    names = sorted(os.listdir(d))
    expect(len(names) == 1 and names[0].startswith("first."), f"duplicates: logs {names}")
    lines = clean_lines(err, "duplicates")
    about = [l for l in lines if "is set 2 times" in l]
    expect(len(about) == 2 and "CUMEMGUARD_MODE is set 2 times in the environment; the first "
           "('report') is used" in about[0], f"duplicates: {about}")
    hdr = json.loads(open(os.path.join(d, names[0])).readline())
    expect(hdr.get("mode") == "report", f"duplicates: header mode {hdr.get('mode')}")
    cfg = run_envp([r.b.prog("tools", "cumemguard"), "config", "--json"], envp, 60)
    opts = {o["name"]: o for o in json.loads(cfg.stdout)["options"]}
    expect(opts["CUMEMGUARD_MODE"]["effective"] == "report" and
           opts["CUMEMGUARD_LOG"]["effective"] == first,
           f"config reads another entry than the shim: {opts['CUMEMGUARD_MODE']}")
    # 20,000 bad values of one name, and 8,000 bad entries in CUMEMGUARD_OPTIONS (one string of
    # the environment is at most 128 KiB).
    many = base + ["CUMEMGUARD_STACKS=bad%d" % i for i in range(20000)] + \
        ["CUMEMGUARD_OPTIONS=" + ":".join("warn_limit=x%d:j%d" % (i, i) for i in range(4000))]
    t0 = time.monotonic()
    p = run_envp([r.b.prog("tests", "integration", "runtime_cases"), "basic"], many, 60)
    dt = time.monotonic() - t0
    err = p.stderr.decode(errors="replace")
    expect(p.returncode == 0, f"20,000 bad values: exit {p.returncode}\n{err[-2000:]}")
    lines = clean_lines(err, "20,000 bad values")
    expect(len(lines) <= 25, f"20,000 bad values: {len(lines)} stderr lines")
    expect(any("CUMEMGUARD_STACKS is set 20000 times" in l for l in lines) and
           any("more malformed CUMEMGUARD_OPTIONS entries" in l for l in lines),
           f"20,000 bad values: the repeats are not counted: {lines}")
    expect(dt < 10 * scale(), f"20,000 bad values took {dt:.1f} s")


def case_log_missing_dir(r):
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(r.tmp, "no", "such", "dir", "log")},
                         "missing dir", log=False)
    lines = clean_lines(err, "missing dir")
    expect(len(lines) == 1 and "cannot open event log" in lines[0], f"missing dir: {lines}")


def case_log_symlink(r):
    d = tempfile.mkdtemp(dir=r.tmp)
    target = os.path.join(d, "precious")
    with open(target, "w") as f:
        f.write("precious\n")
    link = os.path.join(d, "cg.log")
    os.symlink(target, link)
    dangling = os.path.join(d, "cg2.log")
    os.symlink(os.path.join(d, "created-through-link"), dangling)
    for path in (link, dangling):
        _, err, _, _ = r.run({"CUMEMGUARD_LOG": path}, f"symlink {path}", log=False)
        lines = clean_lines(err, "symlink")
        expect(len(lines) == 1 and "symbolic link" in lines[0], f"symlink: {lines}")
    expect(open(target).read() == "precious\n", "the shim wrote through a planted symlink")
    expect(not os.path.exists(os.path.join(d, "created-through-link")),
           "the shim created a file through a dangling symlink")


def case_log_fifo(r):
    d = tempfile.mkdtemp(dir=r.tmp)
    fifo = os.path.join(d, "cg.log")
    os.mkfifo(fifo)
    _, err, _, dt = r.run({"CUMEMGUARD_LOG": fifo}, "fifo", log=False, timeout=20)
    lines = clean_lines(err, "fifo")
    expect(len(lines) == 1 and "cannot open event log" in lines[0], f"fifo: {lines}")


def case_log_not_a_log(r):
    # A file that is not an event log at the log's path (a mistyped name, a placeholder that
    # expands to an existing file) was truncated and overwritten: refused, left as it was. An
    # earlier event log at the path is written over as before.
    d = tempfile.mkdtemp(dir=r.tmp)
    precious = os.path.join(d, "train.py")
    with open(precious, "w") as f:
        f.write("precious\n")
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": precious}, "not a log", log=False)
    lines = clean_lines(err, "not a log")
    expect(len(lines) == 1 and "cannot open event log " + precious + ": it is a file of 9 bytes "
           "that is not a cumemguard event log" in lines[0], f"not a log: {lines}")
    expect(open(precious).read() == "precious\n", "the shim overwrote a file that is not a log")
    old = os.path.join(d, "old.log")
    with open(old, "w") as f:
        f.write('{"cumemguard_log":1,"pid":1}\n')
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": old}, "earlier log", log=False)
    expect(not clean_lines(err, "earlier log") and '"pid":1}' not in open(old).read() and
           open(old).read().startswith('{"cumemguard_log":'), "an earlier log was not written over")


def case_log_directory(r):
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": r.tmp}, "directory", log=False)
    lines = clean_lines(err, "directory")
    expect(len(lines) == 1 and "cannot open event log" in lines[0], f"directory: {lines}")


def case_log_planted_file(r):
    if os.geteuid() != 0:
        print("log-planted-file: needs root to plant a file owned by another user")
        raise SystemExit(77)
    shared = os.path.join(r.tmp, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o1777)  # a /tmp-like directory: world-writable and sticky
    planted = os.path.join(shared, "cg.log")
    with open(planted, "w") as f:
        f.write("planted\n")
    os.chown(planted, 65534, 65534)
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": planted}, "planted", log=False)
    lines = clean_lines(err, "planted")
    expect(len(lines) == 1 and "another user" in lines[0], f"planted: {lines}")
    expect(open(planted).read() == "planted\n", "the shim truncated a file planted by another user")
    # Our own file in the same directory is reused as before.
    mine = os.path.join(shared, "mine.log")
    open(mine, "w").close()
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": mine}, "own file", log=False)
    expect(not clean_lines(err, "own file") and os.path.getsize(mine) > 0, "own file not written")


def case_log_planted_open_dir(r):
    # Another user's world-writable directory without the sticky bit (a shared scratch space): the
    # 0666 file it holds is that user's, planted or not; root's run must not write into it.
    if os.geteuid() != 0:
        print("log-planted-open-dir: needs root to plant files of another user")
        raise SystemExit(77)
    shared = os.path.join(r.tmp, "open")
    os.mkdir(shared)
    os.chmod(shared, 0o777)
    os.chown(shared, 65534, 65534)
    planted = os.path.join(shared, "cg.log")
    with open(planted, "w") as f:
        f.write("planted\n")
    os.chmod(planted, 0o666)
    os.chown(planted, 65534, 65534)
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": planted}, "planted open dir", log=False)
    lines = clean_lines(err, "planted open dir")
    expect(len(lines) == 1 and "another user" in lines[0], f"planted open dir: {lines}")
    expect(open(planted).read() == "planted\n", "the shim wrote into another user's file")


def case_log_hardlink(r):
    # A hard link at the log path to a file of ours elsewhere: truncating "the log" would empty
    # that file. Refused for any file with more than one link.
    d = tempfile.mkdtemp(dir=r.tmp)
    precious = os.path.join(d, "precious")
    with open(precious, "w") as f:
        f.write("precious\n")
    link = os.path.join(d, "cg.log")
    os.link(precious, link)
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": link}, "hard link", log=False)
    lines = clean_lines(err, "hard link")
    expect(len(lines) == 1 and "links" in lines[0], f"hard link: {lines}")
    expect(open(precious).read() == "precious\n", "the shim truncated a file through a hard link")
    expect(os.stat(precious).st_nlink == 2, "the link was changed")


def case_log_names(r):
    b = r.b
    d = tempfile.mkdtemp(dir=r.tmp)
    host = os.uname().nodename.replace("/", "_")
    # Every placeholder, each rank variable in its order, an unknown placeholder twice.
    runs = [({"RANK": "3", "OMPI_COMM_WORLD_RANK": "7", "SLURM_PROCID": "9", "LOCAL_RANK": "1",
              "CMG_JOB": "job/42"}, "a.%p.%r.%l.%h.%e.%q{CMG_JOB}.%%", "a.{pid}.3.1.{host}.runtime_cases.job_42.%"),
            ({"OMPI_COMM_WORLD_RANK": "7", "PMI_RANK": "8", "SLURM_PROCID": "9",
              "OMPI_COMM_WORLD_LOCAL_RANK": "2", "SLURM_LOCALID": "5"}, "b.%r.%l", "b.7.2"),
            ({"PMI_RANK": "8", "SLURM_PROCID": "9", "MPI_LOCALRANKID": "4"}, "c.%r.%l", "c.8.4"),
            ({"SLURM_PROCID": "9", "SLURM_LOCALID": "5"}, "d.%r.%l", "d.9.5"),
            ({}, "e.%r.%l.%q{CMG_UNSET}.", "e.na.na.."),
            ({}, "f.%x.%x.%q.%", "f.%x.%x.%q.%")]
    for env, pattern, want in runs:
        sub = tempfile.mkdtemp(dir=d)
        _, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(sub, pattern), **env}, pattern, log=False)
        names = os.listdir(sub)
        expect(len(names) == 1, f"{pattern}: logs {names}")
        pid = read_log(os.path.join(sub, names[0]))[0][0]["pid"]
        expect(names[0] == want.format(pid=pid, host=host), f"{pattern}: {names[0]}, expected {want}")
        lines = clean_lines(err, pattern)
        if pattern.startswith("f."):
            # Each placeholder kept as written is said once, however often it appears.
            expect(len(lines) == 3 and sum("'%x'" in l for l in lines) == 1 and
                   sum("'%q'" in l for l in lines) == 1 and sum("'%'" in l for l in lines) == 1,
                   f"{pattern}: {lines}")
        elif pattern.startswith("a."):
            # The value's '/' became '_', and the run says so once.
            expect(len(lines) == 1 and "the value of %q{CMG_JOB} ('job/42')" in lines[0],
                   f"{pattern}: {lines}")
        elif pattern.startswith("e."):
            # A variable that is not set is written as nothing, and said once (valgrind refuses
            # the name; the shim never stops the program, so it says so).
            expect(len(lines) == 1 and "%q{CMG_UNSET}: the environment variable CMG_UNSET is "
                   "not set; written as nothing" in lines[0], f"{pattern}: {lines}")
        else:
            expect(not lines, f"{pattern}: {lines}")
    # JOB=.. made /logs/%q{JOB}/x.log climb out of /logs: the component is written '__' and the
    # run says so once; nothing lands above the directory the pattern names.
    sub = tempfile.mkdtemp(dir=d)
    os.mkdir(os.path.join(sub, "__"))
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(sub, "%q{CMG_JOB}", "g.%p"),
                          "CMG_JOB": ".."}, "JOB=..", log=False)
    lines = clean_lines(err, "JOB=..")
    expect(len(lines) == 1 and "makes the path component '..'; written as '__'" in lines[0],
           f"JOB=..: {lines}")
    expect(len(os.listdir(os.path.join(sub, "__"))) == 1 and
           sorted(os.listdir(d)) == sorted(n for n in os.listdir(d) if
                                           os.path.isdir(os.path.join(d, n))),
           f"JOB=..: logs {os.listdir(os.path.join(sub, '__'))}, above: {os.listdir(d)}")
    # A child that execs another program is named after that program, not after its parent.
    sub = tempfile.mkdtemp(dir=d)
    argv = [b.prog("tests", "reliability", "life_cases"), "exec-other",
            b.prog("tests", "integration", "runtime_cases"), "basic"]
    out, _, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(sub, "log.%e.%p")}, "exec", argv=argv,
                         log=False)
    s = steps(out)
    expect(s.get("child_status") == "0", f"exec: the child failed: {out}")
    names = sorted(os.listdir(sub))
    parent = [n for n in names if n.startswith("log.life_cases.")]
    expect(len(names) == 2 and f"log.runtime_cases.{s.get('child_pid')}" in names and
           len(parent) == 1 and read_log(os.path.join(sub, parent[0]))[0][0]["pid"] ==
           int(parent[0].rsplit(".", 1)[1]), f"exec: logs {names}, child {s.get('child_pid')}")


def case_log_umask(r):
    for mask, mode in ((0o077, 0o600), (0o022, 0o644), (0o002, 0o664)):
        _, _, d, _ = r.run({}, f"umask {mask:o}", preexec=lambda m=mask: os.umask(m))
        (log,) = logs_in(d)
        got = stat.S_IMODE(os.stat(log).st_mode)
        expect(got == mode, f"umask {mask:o}: log mode {got:o}, expected {mode:o}")


def case_log_pattern(r):
    d = tempfile.mkdtemp(dir=r.tmp)
    _, _, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(d, "x.%p.%r.%%.%q.%"), "RANK": "3"},
                       "pattern", log=False)
    names = os.listdir(d)
    expect(len(names) == 1 and re.fullmatch(r"x\.\d+\.3\.%\.%q\.%", names[0]), f"pattern: {names}")


def case_log_long_path(r):
    _, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(r.tmp, "a" * 5000)}, "long path",
                         log=False)
    lines = clean_lines(err, "long path")
    expect(len(lines) == 1 and "cannot open event log" in lines[0], f"long path: {lines}")


def case_log_device(r):
    # A device as the log under a plain LD_PRELOAD: the shim wrote its events into /dev/zero or
    # /dev/null, which keep nothing a report could read (`cumemguard run --log /dev/zero` refused
    # it with 73). One line, no log, the program as without the shim.
    for dev in ("/dev/zero", "/dev/null"):
        _, err, _, _ = r.run({"CUMEMGUARD_LOG": dev}, dev, log=False)
        lines = clean_lines(err, dev)
        want = (f"warning: cannot open event log {dev}: not a regular file (a character "
                "device); continuing without an event log")
        expect(len(lines) == 1 and re.fullmatch(r"cumemguard\[\d+\]: " + re.escape(want),
                                                lines[0]), f"{dev}: {lines}")


def case_disk_full(r):
    # Every write of the log fails as on a full disk: the file size limit, with SIGXFSZ ignored
    # (inherited through exec), makes write(2) return EFBIG. (/dev/full did this before devices
    # were refused as logs.)
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16, 16))
    # host_double: host memory only (the fake driver backs device memory with a memfd, which the
    # limit would refuse too); its second free is the shim's finding, said on its own line.
    d = tempfile.mkdtemp(dir=r.tmp)
    out, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(d, "full.log")}, "file size limit",
                           argv=[r.b.prog("tests", "integration", "runtime_cases"), "host_double"],
                           log=False, preexec=limit)
    failed = [l for l in clean_lines(err, "file size limit") if "write failed" in l]
    expect(out == "first_free cudaSuccess\nsecond_free cudaSuccess\n" and
           failed == ["cumemguard: warning: event log write failed; further events are not logged"],
           f"file size limit: {out!r} {failed}")


def case_disk_tmpfs(r):
    mnt = os.path.join(r.tmp, "mnt")
    os.mkdir(mnt)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", mnt],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        print("disk-tmpfs: cannot mount a tmpfs here (not root or no CAP_SYS_ADMIN)")
        raise SystemExit(77)
    try:
        stress = r.b.prog("tests", "stress", "stress")
        out, err, _, _ = r.run({"CUMEMGUARD_LOG": os.path.join(mnt, "log"),
                                "CUMEMGUARD_STACKS": "16"},
                               "tmpfs", argv=[stress, "3", "400", "4"], log=False, timeout=120)
        lines = clean_lines(err, "tmpfs")
        expect([l for l in lines if "write failed" in l], f"tmpfs: the full disk went unnoticed: {lines}")
        expect(len([l for l in lines if "write failed" in l]) == 1, f"tmpfs: {lines}")
        expect(steps(out).get("mismatches") == "0", f"tmpfs: statuses changed: {out[-500:]}")
        recs, _ = read_log(os.path.join(mnt, "log"), allow_cut_last=True)
        expect(recs and recs[0].get("cumemguard_log") == 1, "tmpfs: no header")
    finally:
        subprocess.run(["umount", mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def case_interposer(r, before):
    b = r.b
    other = b.prog("tests", "reliability", "libotherhook.so")
    order = [other, b.shim] if before else [b.shim, other]
    programs = [
        ([b.prog("tests", "integration", "runtime_cases"), "basic"], "cudaMalloc", 1),
        ([b.prog("tests", "integration", "runtime_cases"), "driver_double"], "cuMemAlloc_v2", 1),
        ([b.prog("tests", "integration", "vmm_cases"), "P01"], "cuMemCreate", 2),
    ]
    for argv, api, n in programs:
        label = f"{' '.join(os.path.basename(x) for x in order)} {argv[1]}"
        rc0, out0, _ = b.run(argv, b.env())  # the shim alone
        d = tempfile.mkdtemp(dir=r.tmp)
        rc, out, err = b.run(argv, b.env(log=os.path.join(d, "log.%p"), preload=order))
        expect(rc == 0 == rc0, f"{label}: exit {rc} (shim alone: {rc0})\n{err[-3000:]}")
        expect(steps(out) == steps(out0), f"{label}: statuses {steps(out)} != {steps(out0)}")
        m = re.search(r"otherhook cudaMalloc (\d+) cuMemAlloc_v2 (\d+) cuMemCreate (\d+)", err)
        expect(m, f"{label}: the other interposer did not report: {err[-1000:]}")
        counts = dict(zip(("cudaMalloc", "cuMemAlloc_v2", "cuMemCreate"), map(int, m.groups())))
        expect(counts[api] == n, f"{label}: the other interposer saw {counts[api]} {api}, expected {n}")
        (log,) = logs_in(d)
        recs, _ = read_log(log)
        calls = [x for x in recs if x.get("k") == "call" and x.get("api") == api]
        expect(len(calls) == n, f"{label}: the shim recorded {len(calls)} {api}, expected {n}")
        foreign = [l for l in stderr_lines(err) if "libotherhook" in l]
        if before:
            # Named once, at start-up, with the entry points it takes first, and in the header.
            named = [l for l in foreign if "is loaded before cumemguard" in l]
            expect(len(named) == 1 and all(n in named[0] for n in
                                           ("cudaMalloc", "cuMemAlloc_v2", "cuMemCreate")),
                   f"{label}: no single line naming the interposer before the shim: "
                   f"{stderr_lines(err)}")
            inter = recs[0].get("interposers", [])
            expect(len(inter) == 1 and inter[0]["path"].endswith("libotherhook.so") and
                   sorted(inter[0]["symbols"]) == ["cuMemAlloc_v2", "cuMemCreate", "cudaMalloc"],
                   f"{label}: header interposers {inter}")
        else:
            expect(not [l for l in foreign if "is loaded before cumemguard" in l],
                   f"{label}: an interposer after the shim named as one before it")
        if not before:
            # What stands after the shim is named, once: for the runtime's function or the
            # driver's, whichever the program called.
            lib = "not libcudart" if api == "cudaMalloc" else "not libcuda:"
            expect(len(foreign) == 1 and lib in foreign[0] and api in foreign[0],
                   f"{label}: no single line naming the interposer after the shim: "
                   f"{stderr_lines(err)}")


def case_interposer_routes(r):
    # A limiter or profiler preloaded after the shim, defining cudaMalloc and cuMemAlloc_v2 by
    # symbol only (no dlsym hook). The program starts the runtime, then calls the driver by the
    # PLT, by dlsym in the global scope and by dlsym with libcuda's handle. Without the shim the
    # other interposer sees the PLT and global calls (2 cuMemAlloc_v2, 1 cudaMalloc) and neither
    # cudart's own nor the handle-scoped one; with the shim in front it must see exactly as many.
    # It saw none of the driver calls once the runtime had started: the shim called what
    # cudart's cuGetProcAddress had answered (the driver) for every way in.
    b = r.b
    other = b.prog("tests", "reliability", "libotherhook.so")
    argv = [b.prog("tests", "integration", "runtime_cases"), "routes"]
    pat = r"otherhook cudaMalloc (\d+) cuMemAlloc_v2 (\d+) cuMemCreate (\d+)"
    seen = {}
    for label, preload in (("without the shim", [other]), ("with the shim", [b.shim, other])):
        d = tempfile.mkdtemp(dir=r.tmp)
        rc, out, err = b.run(argv, b.env(log=os.path.join(d, "log.%p"), preload=preload))
        expect(rc == 0, f"{label}: exit {rc}\n{err[-3000:]}")
        st = steps(out)
        expect(all(st.get(k) == v for k, v in (("malloc", "cudaSuccess"), ("plt_alloc", "CUDA_SUCCESS"),
                                                ("global_alloc", "CUDA_SUCCESS"),
                                                ("handle_alloc", "CUDA_SUCCESS"),
                                                ("free", "cudaSuccess"))), f"{label}: {st}")
        m = re.search(pat, err)
        expect(m, f"{label}: the other interposer did not report: {err[-1000:]}")
        seen[label] = tuple(map(int, m.groups()))
        shim_run = (d, err)
    expect(seen["without the shim"] == (1, 2, 0),
           f"without the shim the other interposer saw {seen['without the shim']}")
    expect(seen["with the shim"] == seen["without the shim"],
           f"the other interposer saw {seen['with the shim']} (cudaMalloc, cuMemAlloc_v2, "
           f"cuMemCreate) with the shim, {seen['without the shim']} without")
    d, err = shim_run
    (log,) = logs_in(d)
    recs, _ = read_log(log)
    allocs = [x for x in recs if x.get("k") == "call" and x.get("api") == "cuMemAlloc_v2"]
    expect(len(allocs) == 3, f"the shim recorded {len(allocs)} cuMemAlloc_v2, expected 3 (PLT, "
           "global and handle-scoped)")
    # What stands after the shim is named once for the runtime and once for the driver.
    foreign = sorted(l for l in stderr_lines(err) if "libotherhook" in l)
    expect(len(foreign) == 2 and "cuMemAlloc_v2" in foreign[0] and "not libcuda:" in foreign[0]
           and "cudaMalloc" in foreign[1] and "not libcudart" in foreign[1],
           f"the interposer after the shim is not named once per library: {stderr_lines(err)}")


def case_module_fifo(r):
    """A dlopened plugin whose file is then replaced by a FIFO at the same path (deleted and made
    again): the finding in it is symbolized to match the suppressions, which reads the module's
    file. The host must not block in open(2) on the FIFO (it did, holding the symbolizer's lock,
    and its fork() hung behind that), and must print what it prints without the shim."""
    src = r.b.prog("tests", "reliability", "libfifo_plugin.so")
    prog = r.b.prog("tests", "reliability", "module_fifo")
    supp = os.path.join(r.tmp, "none.supp")
    with open(supp, "w") as f:
        f.write("double-free:no_such_function_anywhere\n")

    def once(shim):
        d = tempfile.mkdtemp(dir=r.tmp)
        plugin = os.path.join(d, "libplugin.so")
        with open(src, "rb") as i, open(plugin, "wb") as o:
            o.write(i.read())
        extra = {"CUMEMGUARD_MODE": "report", "CUMEMGUARD_SUPPRESSIONS": supp,
                 "CUMEMGUARD_STACKS": "16"}
        env = r.b.env(shim=shim, log=os.path.join(d, "log.%p") if shim else None, extra=extra)
        rc, out, err = r.b.run([prog, plugin], env, timeout=60)
        expect(stat.S_ISFIFO(os.stat(plugin).st_mode), "the plugin's path is not a FIFO")
        return rc, out, err, d

    rc0, out0, err0, _ = once(False)
    expect(rc0 == 0 and "free1 0" in out0 and "child 7" in out0,
           f"without the shim: exit {rc0}: {out0} {err0}")
    rc, out, err, d = once(True)
    expect(rc == 0, f"under the shim: exit {rc}: {err[-2000:]}")
    expect(out == out0, f"under the shim the program printed {out!r}, without it {out0!r}")
    recs = [x for p in logs_in(d) for x in read_log(p)[0]]
    found = [x for x in recs if x.get("k") == "finding" and x.get("class") == "double-free"]
    expect(len(found) == 1, f"{len(found)} double-free findings in the logs, expected 1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    b = Build(a.build)
    tmp = tempfile.mkdtemp(prefix=f"cmg-hostile-{a.case}-")
    cases = {
        "options-garbage": case_options_garbage,
        "unknown-names": case_unknown_names,
        "options-unclosed-quote": case_options_unclosed_quote,
        "env-duplicates": case_env_duplicates,
        "log-missing-dir": case_log_missing_dir,
        "log-symlink": case_log_symlink,
        "log-fifo": case_log_fifo,
        "log-not-a-log": case_log_not_a_log,
        "log-directory": case_log_directory,
        "log-planted-file": case_log_planted_file,
        "log-planted-open-dir": case_log_planted_open_dir,
        "log-hardlink": case_log_hardlink,
        "log-names": case_log_names,
        "log-umask": case_log_umask,
        "log-pattern": case_log_pattern,
        "log-long-path": case_log_long_path,
        "log-device": case_log_device,
        "disk-full": case_disk_full,
        "disk-tmpfs": case_disk_tmpfs,
        "interposer-before": lambda r: case_interposer(r, True),
        "interposer-after": lambda r: case_interposer(r, False),
        "module-fifo": case_module_fifo,
        "interposer-routes": case_interposer_routes,
    }
    return run_case(a.case, lambda: cases[a.case](Runner(b, tmp)), tmp)


if __name__ == "__main__":
    sys.exit(main())
