#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Python frames in the stacks of findings (tests/programs/python/pyframes_cases.py), with each
# interpreter given: every case run plainly and under `cumemguard run`, then `cumemguard report
# --json` must name the exact file, qualified function and line of the second free, the first
# free and the allocation, innermost first, in place of the interpreter's frames; the text report
# must name them too; the suppression `--gen-suppressions` writes must silence that finding and no
# other.
#   check_pyframes.py --cg CUMEMGUARD --build BUILD_DIR --src SOURCE_DIR --python PY [--python PY]
# A --python value is a command (split like a shell word list), so an interpreter run through a
# loader of its own counts too.
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tempfile

FAILURES = []
PASSED = [0]
STDOUT = {}  # log -> what the program printed under the shim
FAKECACHING = []  # the PyTorch-shaped cache of the fake stack (not in the gpu suite's runs)
# Sanitized builds stretch every limit (tools/dev sanitize sets the multiplier).
SLOW = max(1, int(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1")))


def check(cond, msg):
    if cond:
        PASSED[0] += 1
    else:
        FAILURES.append(msg)
        print("FAIL " + msg)


def markers(path):
    """Line numbers of "# @NAME" comments: by NAME where it is marked once, and by
    (function, NAME) within the top-level function that holds it."""
    out, count, func = {}, {}, None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            d = re.match(r"def (\w+)\(", line)
            if d:
                func = d.group(1)
            m = re.search(r"# @([\w-]+)\s*$", line)
            if m:
                out[(func, m.group(1))] = n
                out[m.group(1)] = n
                count[m.group(1)] = count.get(m.group(1), 0) + 1
    return {k: v for k, v in out.items() if isinstance(k, tuple) or count[k] == 1}


def py_frames(stack):
    return [f for f in (stack or {}).get("frames", []) if f.get("kind") == "python"]


def related(example, what):
    for r in example.get("related", []):
        if r["what"] == what:
            return r.get("stack")
    return None


def expect(label, stack, want, script):
    """want: [(function, line), ...] the innermost Python frames, all in `script`."""
    got = [(f["function"], f["line"]) for f in py_frames(stack)[:len(want)]]
    files = {f["file"] for f in py_frames(stack)[:len(want)]}
    check(got == want and files == {script}, f"{label}: want {want} in {script}, got {got} "
          f"in {sorted(files)}")


class Interp:
    def __init__(self, spec, tmp):
        self.cmd = shlex.split(spec)
        q = subprocess.run(self.cmd + ["-c", "import sys, sysconfig; print(sys.version_info[0], "
                                       "sys.version_info[1], sys.executable, "
                                       "sysconfig.get_paths()['include'], "
                                       "sysconfig.get_config_var('EXT_SUFFIX'), "
                                       "sysconfig.get_config_var('Py_ENABLE_SHARED'), "
                                       "sysconfig.get_config_var('LIBDIR'), "
                                       "sysconfig.get_config_var('LDVERSION'))"],
                           capture_output=True, text=True, timeout=60 * SLOW)
        major, minor, exe, self.include, self.suffix, shared, self.libdir, self.ldversion = \
            q.stdout.split()
        self.version = f"{major}.{minor}"
        self.exe = exe
        # The interpreter itself, not a launcher script in front of it (pyenv's shims are bash
        # scripts): bash dies of SIGSEGV with a sanitizer runtime preloaded (its own malloc against
        # the runtime's), which made the run without the shim fail where the program did not.
        self.cmd = [exe] + self.cmd[1:]
        # Debian's python3 says Py_ENABLE_SHARED=1 (it ships libpython3.X.so too) but links the
        # interpreter into the executable: what counts is whether the program loads libpython.
        ldd = subprocess.run(["ldd", exe], capture_output=True, text=True, timeout=60 * SLOW).stdout
        self.shared = "libpython" in ldd
        self.label = f"python {self.version} ({'shared libpython' if self.shared else 'static'}, {exe})"
        self.ext_dir = os.path.join(tmp, "ext-" + self.version + ("-shared" if self.shared else ""))
        os.makedirs(self.ext_dir, exist_ok=True)

    def build_extension(self, src):
        out = os.path.join(self.ext_dir, "cmg_pyext" + self.suffix)
        # The parent too: Debian's pyconfig.h includes <x86_64-linux-gnu/python3.X/pyconfig.h>.
        p = subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-g", "-I" + self.include,
                            "-I" + os.path.dirname(self.include), src, "-o",
                            out, "-ldl", "-lpthread"], capture_output=True, text=True, timeout=120 * SLOW)
        check(p.returncode == 0, f"{self.label}: building the C extension: {p.stderr[-500:]}")
        return p.returncode == 0

    def build_embedding(self, src):
        """A program linked with this interpreter's libpython; None when it has none."""
        if not self.shared:
            return None
        out = os.path.join(self.ext_dir, "cmg_embed")
        p = subprocess.run(["cc", "-O1", "-g", "-I" + self.include, "-I" + os.path.dirname(self.include),
                            src, "-o", out, "-L" + self.libdir, "-Wl,-rpath," + self.libdir,
                            "-lpython" + self.ldversion, "-ldl", "-lpthread", "-lm"],
                           capture_output=True, text=True, timeout=120 * SLOW)
        check(p.returncode == 0, f"{self.label}: building the embedding program: {p.stderr[-500:]}")
        return out if p.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    for a in ("--cg", "--build", "--src"):
        ap.add_argument(a, required=True)
    ap.add_argument("--python", action="append", required=True)
    ap.add_argument("--fake-python", help="tests/programs/fake_python.c, built")
    ap.add_argument("--no-vm-readv", help="tests/programs/no_vm_readv.c, built")
    ap.add_argument("--real", action="store_true",
                    help="the CUDA libraries of LD_LIBRARY_PATH (the gpu suite), not the fakes")
    a = ap.parse_args()
    cg = os.path.abspath(a.cg)
    progs = os.path.join(os.path.abspath(a.src), "tests", "programs", "python")
    script = os.path.join(progs, "pyframes_cases.py")
    mark = markers(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_") and
           k not in ("LD_PRELOAD", "PYTHONPATH", "PYTHONHOME")}
    if not a.real:
        env["LD_LIBRARY_PATH"] = os.path.join(os.path.abspath(a.build), "tests", "fakecuda")
        FAKECACHING.append(os.path.join(os.path.abspath(a.build), "tests", "integration",
                                        "libfakecaching.so"))
    if os.environ.get("CMG_PRELOAD_FIRST"):
        env["LD_PRELOAD"] = os.environ["CMG_PRELOAD_FIRST"]
    extra = os.environ.get("CMG_TEST_PYTHONS", "")  # more interpreters, ';'-separated commands
    specs = a.python + [s for s in extra.split(";") if s.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        seen = set()
        for spec in specs:
            it = Interp(spec, tmp)
            key = (it.exe, it.version)
            if key in seen:
                continue
            seen.add(key)
            print("==", it.label)
            run_interp(cg, it, script, mark, env, tmp, progs)
            if a.no_vm_readv:
                run_refused(cg, it, os.path.abspath(a.no_vm_readv), script, env, tmp)
        if a.fake_python:
            print("== interpreters the reader must not trust")
            run_fake(cg, os.path.abspath(a.fake_python), env, tmp)
    if FAILURES:
        print(f"{PASSED[0]} passed, {len(FAILURES)} failed")
        sys.exit(1)
    print(f"{PASSED[0]} passed, 0 failed")


def sanitizer_env(env, it, crash=False):
    """A sanitized build preloads its runtime into every process (CMG_PRELOAD_FIRST). Its
    LeakSanitizer tells CPython's leaks at exit (by design) from others by CPython's allocator
    functions (tests/sanitizers/lsan.supp); an interpreter without a symbol table names none, so
    its runs check no leaks (the shared-libpython runs of the same cases do). A crash case lets
    SIGSEGV take its default action, as without the sanitizer."""
    pre = env.get("LD_PRELOAD", "")
    if not any(k in pre for k in ("asan", "tsan")):
        return env
    e = dict(env)
    for var in ("ASAN_OPTIONS", "TSAN_OPTIONS"):
        opts = e.get(var, "")
        if var == "ASAN_OPTIONS" and not it.shared:
            opts += ":detect_leaks=0"
        if crash:
            opts += ":handle_segv=0"
        e[var] = opts.lstrip(":")
    return e


def run_case(cg, it, script, case, env, tmp, extra_env=None, args=(), report=True):
    env = sanitizer_env(env, it)
    log = os.path.join(tmp, f"{case}-{it.version}-{int(it.shared)}-{len(os.listdir(tmp))}.log")
    cmd = it.cmd + [script, case] + list(args)
    plain = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True, timeout=120 * SLOW)
    e = dict(env, **(extra_env or {}))
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--"] + cmd, env=e, cwd=tmp,
                       capture_output=True, text=True, timeout=300 * SLOW)
    STDOUT[log] = p.stdout
    check(plain.returncode == 0 and p.returncode == 0 and f"done {case}" in p.stdout and
          f"done {case}" in plain.stdout,
          f"{it.label} {case}: plain {plain.returncode} {plain.stderr[-300:]!r}, under the shim "
          f"{p.returncode} {p.stdout[-200:]!r} {p.stderr[-600:]!r}")
    if not report:
        return log, {}, []
    r = subprocess.run([cg, "report", "--json", log], capture_output=True, text=True, timeout=120 * SLOW)
    try:
        rep = json.loads(r.stdout)
    except json.JSONDecodeError:
        check(False, f"{it.label} {case}: report --json: {r.stdout[:200]!r} {r.stderr[-300:]!r}")
        return log, None, []
    groups = []
    for c in rep["findings"]["classes"]:
        if c["class"] == "double-free":
            groups += c["groups"]
    return log, rep, groups


def run_interp(cg, it, script, mark, env, tmp, progs):
    class ByCase(dict):
        """m["first-call"] inside the case being listed: the marker of that case's function."""
        case = None

        def __missing__(self, name):
            return mark[(self.case, name)]

    m = ByCase((k, v) for k, v in mark.items() if not isinstance(k, tuple))
    # Each case: the frames of the second free, of the first free, and the function that called
    # alloc(), innermost first, as (qualified function, line).
    def c(case):
        m.case = "case_" + case.replace("-", "_")
        return m.case

    cases = {
        "ctypes": (c("ctypes") and [("free_buffer", m["free"]), ("case_ctypes", m["second-call"])],
                   [("free_buffer", m["free"]), ("case_ctypes", m["first-call"])], "case_ctypes"),
        "stale": (c("stale") and [("free_buffer", m["free"]), ("case_stale", m["second-call"])],
                  [("free_buffer", m["free"]), ("case_stale", m["first-call"])], "case_stale"),
        "thread": (c("thread") and [("free_buffer", m["free"]), ("worker", m["thread-call"])],
                   [("free_buffer", m["free"]), ("case_thread", m["first-call"])], "case_thread"),
        "generator": (c("generator") and [("free_buffer", m["free"]), ("freeing_generator", m["gen-second"]),
                       ("case_generator", m["second-call"])],
                      [("free_buffer", m["free"]), ("freeing_generator", m["gen-first"]),
                       ("case_generator", m["first-call"])], "case_generator"),
        "recursion": (c("recursion") and [("free_buffer", m["free"]), ("recurse", m["deep-call"])] +
                      [("recurse", m["recurse-call"])] * 10,
                      [("free_buffer", m["free"]), ("case_recursion", m["first-call"])],
                      "case_recursion"),
        "exception": (c("exception") and [("free_buffer", m["free"]), ("raising", m["finally-call"]),
                       ("case_exception", m["raising-call"])],
                      [("free_buffer", m["free"]), ("case_exception", m["first-call"])],
                      "case_exception"),
        "thread-exit": (c("thread-exit") and [("free_buffer", m["free"]), ("case_thread_exit", m["second-call"])],
                        [("free_buffer", m["free"]), ("case_thread_exit", m["first-call"])],
                        "case_thread_exit"),
    }
    alloc = lambda caller: [("alloc", m["malloc"]), (caller, mark[(caller, "alloc-call")])]
    for case, (second, first, caller) in cases.items():
        log, rep, groups = run_case(cg, it, script, case, env, tmp)
        if rep is None:
            continue
        label = f"{it.label} {case}"
        check(len(groups) == 1 and groups[0]["count"] == 1,
              f"{label}: one double free, got {[g['count'] for g in groups]}")
        if not groups:
            continue
        ex = groups[0]["example"]
        expect(f"{label} second free", groups[0]["stack"], second, script)
        expect(f"{label} first free", related(ex, "first free"), first, script)
        expect(f"{label} allocation", related(ex, "allocation"), alloc(caller), script)
        frames = groups[0]["stack"]["frames"]
        # The interpreter's eval loop is not shown where its Python frames are.
        check(not any(f.get("function", "").startswith("_PyEval_EvalFrame") for f in frames[:8]),
              f"{label}: an eval frame above the Python frames: {frames[:8]}")
        if case == "recursion":
            py = py_frames(groups[0]["stack"])
            marker = [f for f in frames if f.get("kind") == "marker"]
            check(len(py) == 64 and marker == [{"kind": "marker", "python_end": "truncated"}],
                  f"{label}: 64 Python frames then the truncation marker, got {len(py)} {marker}")
        if case == "thread":
            py = py_frames(groups[0]["stack"])
            # 3.10 code objects have no qualified name: the function's own name is shown.
            run = "run" if it.version == "3.10" else "Thread.run"
            check(len(py) >= 3 and py[2]["function"] == run and
                  py[2]["file"].endswith("threading.py"),
                  f"{label}: the thread's own frames below worker: {py[:4]}")
        if case == "ctypes":
            text = subprocess.run([cg, "report", log], capture_output=True, text=True,
                                  timeout=120 * SLOW).stdout
            for fn, line in second + first + alloc(caller):
                check(f"{fn} ({script}:{line})" in text,
                      f"{label}: the text report names {fn} ({script}:{line})")
            # Below <module> the interpreter's native frames (start-up, eval loop) are one line
            # each stack, the Python frames all shown; --full-stacks prints them, JSON has them.
            full = subprocess.run([cg, "report", "--full-stacks", log], capture_output=True,
                                  text=True, timeout=120 * SLOW).stdout
            folds = [int(n) for n in re.findall(
                r"^ +\.\.\. (\d+) interpreter frames(?: calling into C)? \(--full-stacks to "
                r"show\)$", text, re.M)]
            # Above the innermost Python frame, ctypes' and libffi's call into the driver is one
            # line too: each stack begins with it and then the program's own line (seven frames
            # of the interpreter came first before).
            calls = re.findall(r"^ +\.\.\. \d+ interpreter frames calling into C \(--full-stacks "
                               r"to show\)\n +#\d+ (\S+) \(" + re.escape(script) + r":\d+\)$",
                               text, re.M)
            check(len(calls) >= 3 and set(calls) <= {fn for fn, _ in second + first + alloc(caller)},
                  f"{label}: stacks begin with the call into C, then {calls}")
            check(len(folds) >= 3 and all(n >= 2 for n in folds) and
                  len(full.splitlines()) - len(text.splitlines()) == sum(n - 1 for n in folds),
                  f"{label}: folded {folds}: {len(text.splitlines())} lines, "
                  f"{len(full.splitlines())} with --full-stacks")
            below = [l for l in text.splitlines() if re.search(
                r"#\d+ (Py_BytesMain|pymain_|PyRun_|_PyEval_EvalFrameDefault|_start\b|"
                r"__libc_start_main)", l)]
            check(not below, f"{label}: interpreter start-up frames shown: {below[:4]}")
            check(re.search(r"#\d+ (Py_BytesMain|pymain_run_python|__libc_start_main)", full),
                  f"{label}: --full-stacks lacks the start-up frames")
            for fn, line in second + first + alloc(caller):
                check(f"{fn} ({script}:{line})" in full,
                      f"{label}: --full-stacks names {fn} ({script}:{line})")
            print(f"{label}: {len(text.splitlines())} lines folded {folds}, "
                  f"{len(full.splitlines())} with --full-stacks")
            gen = subprocess.run([cg, "report", "--gen-suppressions", log], capture_output=True,
                                 text=True, timeout=120 * SLOW).stdout
            rules = [l for l in gen.splitlines() if l and not l.startswith("#")]
            # Anchored on the finding's Python frames from its call site (free_buffer), each
            # frame FUNCTION@FILE: the script's own path, so the rule matches this script alone.
            check(len(rules) == 1 and
                  rules[0].startswith(f"double-free:^free_buffer@{script};case_ctypes@{script};") and
                  rules[0].endswith(f";<module>@{script}"),
                  f"{label}: --gen-suppressions names the finding's Python stack: {rules}")
            pattern = rules[0].split(":", 1)[1] if rules else ""
            supp = os.path.join(tmp, f"supp-{it.version}-{int(it.shared)}.txt")
            with open(supp, "w") as f:
                f.write(gen)
            # The rule silences that finding ...
            _, rep2, groups2 = run_case(cg, it, script, "ctypes", env, tmp,
                                        {"CUMEMGUARD_SUPPRESSIONS": supp})
            if rep2 is not None:
                rules2 = (rep2.get("suppressed") or {}).get("rules", [])
                check(not groups2 and [(r["class"], r["pattern"], r["count"]) for r in rules2] ==
                      [("double-free", pattern, 1)],
                      f"{label}: suppressed by the generated rule: {groups2} {rules2}")
            # ... and no other: the C extension's double free is another stack.
            if it.build_extension(os.path.join(progs, "cmg_pyext.c")):
                _, rep3, groups3 = run_case(cg, it, script, "cext", env, tmp,
                                            {"CUMEMGUARD_SUPPRESSIONS": supp}, [it.ext_dir])
                check(rep3 is not None and len(groups3) == 2,
                      f"{label}: the rule leaves other double frees alone: {len(groups3)} groups")
    # What is resident, made from Python: the snapshot's site is the program's innermost Python
    # frame (alloc's cudaMalloc line), and its creator this file; the native module is kept apart.
    log, rep, _ = run_case(cg, it, script, "resident", env, tmp, {"CUMEMGUARD_STACKS": "16"})
    if rep is not None:
        label = f"{it.label} resident"
        snaps = [x for x in rep["resident"]["snapshots"] if x["label"] == "resident"]
        sites = [x for s in snaps for x in s["sites"]]
        want = {"file": script, "function": "alloc", "line": mark["malloc"]}
        got = [(x["creator"], x.get("python"), x["bytes"], x["kind"]) for x in sites]
        check(len(snaps) == 1 and got == [(script, want, 1 << 20, "linear")],
              f"{label}: the resident site {got}, want {want}")
        check(len(sites) == 1 and sites[0].get("module") not in (None, "", script),
              f"{label}: the native module {[x.get('module') for x in sites]}")
        creators = [c["creator"] for s in snaps for c in s["by_creator"]]
        check(creators == [script], f"{label}: by creator {creators}")
        text = subprocess.run([cg, "report", log], capture_output=True, text=True,
                              timeout=120 * SLOW).stdout
        line = f"created by {script}, at alloc ({script}:{mark['malloc']})"
        check(line in text, f"{label}: the text report says {line!r}")
        # --diff prints the new site's stack as the text report does: the Python frames, the
        # interpreter's below <module> folded into one line (it printed them all).
        diff = subprocess.run([cg, "report", "--diff", log + "@before", log + "@resident"],
                              capture_output=True, text=True, timeout=120 * SLOW)
        new = re.search(r"^  \[1\] new .*\n((?:        .*\n)+)", diff.stdout, re.M)
        frames = new.group(1).splitlines() if new else []
        check(diff.returncode == 0 and
              any(f"alloc ({script}:{mark['malloc']})" in l for l in frames) and
              any(f"case_resident ({script}:{mark[('case_resident', 'alloc-call')]})" in l for l in frames) and
              len([l for l in frames if re.match(r" +\.\.\. \d+ interpreter frames \(", l)]) == 1 and
              re.match(r" +\.\.\. \d+ interpreter frames calling into C \(", frames[0]) and
              not any(re.search(r"#\d+ (Py_BytesMain|pymain_|PyRun_|_start\b)", l) for l in frames),
              f"{label}: --diff's stack: rc {diff.returncode} {frames[:12]} {diff.stderr[-300:]!r}")
    # Code objects made at the address of freed ones: each double free names its own function
    # (and the case must really have reused an address, or it shows nothing).
    log, rep, groups = run_case(cg, it, script, "reused-code", env, tmp)
    if rep is not None:
        label = f"{it.label} reused-code"
        reused = re.search(r"reused code addresses (\d+)", STDOUT[log])
        check(reused and int(reused.group(1)) > 0, f"{label}: no code address was reused: "
              f"{STDOUT[log][-200:]!r}")
        c("reused-code")
        got, want = [], []
        for i in range(6):
            want.append([("free_buffer", m["free"], script), (f"generated_{i}", 2, "generated.py"),
                         ("case_reused_code", m["second-call"], script)])
        for g in groups:
            got.append([(f["function"], f["line"], f["file"]) for f in py_frames(g["stack"])[:3]])
        check(sorted(got) == sorted(want) and all(g["count"] == 1 for g in groups),
              f"{label}: each double free names its own generated function: {got} "
              f"{[g['count'] for g in groups]}")
        for g in groups:
            name = py_frames(g["stack"])[1]["function"] if len(py_frames(g["stack"])) > 1 else "?"
            first = [(f["function"], f["line"]) for f in py_frames(related(g["example"],
                                                                          "first free"))[:3]]
            check(first == [("free_buffer", m["free"]), (name, 2),
                            ("case_reused_code", m["first-call"])],
                  f"{label}: the first free of {name}: {first}")
    # A sub-interpreter run on a thread whose stacks were captured in the main interpreter first:
    # its own frames (3.10/3.11's thread-specific key still names the main interpreter's state).
    log, rep, groups = run_case(cg, it, script, "subinterpreter", env, tmp)
    if rep is not None and "no sub-interpreters" not in STDOUT[log]:
        label = f"{it.label} subinterpreter"
        sub = lambda name: mark[name] - mark["sub-start"] + 1  # lines of the SUB text
        want = lambda call: [("sub_free", sub("sub-free")), ("sub_main", sub(call)),
                             ("<module>", sub("sub-module"))]
        got = [(f["function"], f["line"]) for f in py_frames(groups[0]["stack"])[:3]] if groups else []
        first = [(f["function"], f["line"]) for f in
                 py_frames(related(groups[0]["example"], "first free"))[:3]] if groups else []
        files = {f["file"] for g in groups for f in py_frames(g["stack"])[:3]}
        check(len(groups) == 1 and got == want("sub-second") and first == want("sub-first") and
              len(files) == 1 and files <= {"<string>", "<script>"},
              f"{label}: the sub-interpreter's frames: {got} {first} {files}")
    elif rep is not None:
        check(it.version not in ("3.10", "3.11", "3.12", "3.13"),
              f"{it.label} subinterpreter: this version has sub-interpreters")
    # More code objects than the look-up table has slots: each interned once (one pycode record).
    log, _, _ = run_case(cg, it, script, "many-code", env, tmp, report=False)
    if os.path.exists(log):
        with open(log, encoding="utf-8") as f:
            names = [json.loads(l)["name"] for l in f if l.startswith('{"k":"pycode"')]
        many = [n for n in names if n.startswith("many_")]
        check(len(many) == 20000 and len(set(many)) == 20000 and len(names) == len(set(names)),
              f"{it.label} many-code: one record per code object: {len(many)} records of "
              f"{len(set(many))} functions, {len(names) - len(set(names))} repeated")
    # Frees while NCCL is live, stacks off: only the stack of the cache flush is kept, and only its
    # Python frames are read (pycode records of the other frees' functions would show the reader
    # ran where no stack was kept).
    if FAKECACHING:
        log, rep, _ = run_case(cg, it, script, "nccl-free", env, tmp, {"CUMEMGUARD_STACKS": "0"},
                               FAKECACHING)
        if rep is not None:
            label = f"{it.label} nccl-free"
            with open(log, encoding="utf-8") as f:
                records = [json.loads(l) for l in f if l.startswith("{")]
            names = sorted(r["name"] for r in records if r.get("k") == "pycode")
            stacks = [r for r in records if r.get("k") == "stack"]
            check(names == ["<module>", "case_nccl_free", "main"] and len(stacks) == 1,
                  f"{label}: Python frames read for the flush's stack alone: {names}, "
                  f"{len(stacks)} stacks")
            flush = [g for cl in rep["findings"]["classes"] if cl["class"] == "opportunistic-flush"
                     for g in cl["groups"]]
            c("nccl-free")
            got = [(f["function"], f["line"]) for g in flush for f in py_frames(g["stack"])[:1]]
            check(got == [("case_nccl_free", m["flush-call"])],
                  f"{label}: the flush names the Python line that asked for it: {got}")
            # The flush's call site (the finding's state and the summary's sites) names the same
            # Python caller by function, file and line, not a native frame at a made-up offset.
            want = f" <- case_nccl_free ({script}:{m['flush-call']})"
            sites = [r["state"]["site"] for r in records
                     if r.get("k") == "finding" and r.get("class") == "opportunistic-flush"]
            sites += [x["site"] for r in records if r.get("k") == "summary"
                      for x in r.get("transport", {}).get("sites", [])]
            check(sites and all(x.endswith(want) for x in sites),
                  f"{label}: flush sites {sites}, want each to end with {want!r}")
    # A crash: the crash record's stack has the Python frames, the exit status is the signal's.
    log = os.path.join(tmp, f"crash-{it.version}-{int(it.shared)}.log")
    env = sanitizer_env(env, it, crash=True)
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--"] + it.cmd + [script, "crash"],
                       env=env, cwd=tmp, capture_output=True, text=True, timeout=120 * SLOW)
    plain = subprocess.run(it.cmd + [script, "crash"], env=env, cwd=tmp, capture_output=True,
                           text=True, timeout=120 * SLOW)
    label = f"{it.label} crash"
    check(plain.returncode == -11 and p.returncode in (-11, 139),
          f"{label}: SIGSEGV with and without the shim: {plain.returncode} {p.returncode}")
    rep = json.loads(subprocess.run([cg, "report", "--json", log], capture_output=True,
                                    text=True, timeout=120 * SLOW).stdout or "{}")
    crash = ((rep.get("logs") or [{}])[0].get("outcome") or {}).get("crash") or {}
    # Innermost: ctypes' own string_at (the standard library), then the script's frames.
    cpy = py_frames(crash.get("stack"))
    check(cpy and cpy[0]["function"] == "string_at" and cpy[0]["line"] > 0 and
          cpy[0]["file"].endswith("ctypes/__init__.py"), f"{label}: ctypes' frame first: {cpy[:1]}")
    expect(f"{label} stack", {"frames": cpy[1:]},
           [("crash_here", mark[("crash_here", "crash")]),
            ("case_crash", mark[("case_crash", "crash-call")])], script)
    # The C extension: the GIL held during the free, its own native frame above the Python ones,
    # and a native thread with no Python frames at all.
    if not it.build_extension(os.path.join(progs, "cmg_pyext.c")):
        return
    log, rep, groups = run_case(cg, it, script, "cext", env, tmp, None, [it.ext_dir])
    if rep is None:
        return
    label = f"{it.label} cext"
    with_py = [g for g in groups if py_frames(g["stack"])]
    without = [g for g in groups if not py_frames(g["stack"])]
    check(len(with_py) == 1 and len(without) == 1,
          f"{label}: one double free from Python, one from a native thread: {len(with_py)} "
          f"{len(without)}")
    if with_py:
        g = with_py[0]
        ex = g["example"]
        expect(f"{label} second free", g["stack"], [("ext_free", m["ext-call"]),
                                                    ("case_cext", mark[("case_cext", "second-call")])],
               script)
        expect(f"{label} first free", related(ex, "first free"),
               [("ext_free", m["ext-call"]), ("case_cext", mark[("case_cext", "first-call")])],
               script)
        expect(f"{label} allocation", related(ex, "allocation"), alloc("case_cext"), script)
        frames = g["stack"]["frames"]
        first_py = next(i for i, f in enumerate(frames) if f.get("kind") == "python")
        check(any("cmg_pyext" in (f.get("module") or "") for f in frames[:first_py]),
              f"{label}: the extension's native frame above the Python frames: {frames[:first_py]}")
    if without:
        frames = without[0]["stack"]["frames"]
        check(frames and all(f.get("kind") == "native" for f in frames),
              f"{label}: the native thread's stack is native frames only: {frames[:3]}")
    run_embed(cg, it, env, tmp, progs)
    # CUDA calls from a C atexit handler, after Py_FinalizeEx: native frames only, the exit status
    # the program's.
    log, rep, groups = run_case(cg, it, script, "exit", env, tmp, None, [it.ext_dir])
    if rep is not None:
        frames = groups[0]["stack"]["frames"] if len(groups) == 1 else []
        check(frames and all(f.get("kind") == "native" for f in frames) and
              any(f.get("function") == "double_free_at_exit" for f in frames),
              f"{it.label} exit: a double free after finalization, native frames only: "
              f"{len(groups)} groups {frames[:4]}")


def run_embed(cg, it, env, tmp, progs):
    """The interpreter embedded twice (Py_FinalizeEx, then Py_Initialize again), with the first
    life's thread-specific key taken by the program in between: each life's double free names
    its own Python frames (lines of the text each life runs)."""
    exe = it.build_embedding(os.path.join(progs, "cmg_embed.c"))
    if not exe:
        return
    env = sanitizer_env(env, it)
    log = os.path.join(tmp, f"embed-{it.version}.log")
    plain = subprocess.run([exe], env=env, cwd=tmp, capture_output=True, text=True, timeout=120 * SLOW)
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--", exe], env=env, cwd=tmp,
                       capture_output=True, text=True, timeout=120 * SLOW)
    label = f"{it.label} embed"
    check(plain.returncode == 0 and plain.stdout == "done embed\n" and p.returncode == 0 and
          p.stdout == "done embed\n",
          f"{label}: plain {plain.returncode} {plain.stderr[-300:]!r}, under the shim "
          f"{p.returncode} {p.stdout[-200:]!r} {p.stderr[-300:]!r}")
    r = subprocess.run([cg, "report", "--json", log], capture_output=True, text=True,
                       timeout=120 * SLOW)
    try:
        rep = json.loads(r.stdout)
    except json.JSONDecodeError:
        check(False, f"{label}: report --json: {r.stdout[:200]!r} {r.stderr[-300:]!r}")
        return
    got = []
    for c in rep["findings"]["classes"]:
        for g in c["groups"] if c["class"] == "double-free" else []:
            frames = lambda st: [(f["function"], f["line"], f["file"]) for f in py_frames(st)]
            got.append((g["count"], frames(g["stack"]), frames(related(g["example"], "first free")),
                        frames(related(g["example"], "allocation"))))
    want = [(1, [(fn, 3, "<string>"), ("<module>", 6, "<string>")],
             [(fn, 3, "<string>"), ("<module>", 5, "<string>")], [("<module>", 4, "<string>")])
            for fn in ("first_life", "second_life")]
    check(sorted(got) == want, f"{label}: each life's double free with its frames: {got}")


def run_refused(cg, it, launcher, script, env, tmp):
    """process_vm_readv refused by a seccomp filter: the reader reads nothing, says so once, and
    the finding is there with its native frames."""
    log = os.path.join(tmp, f"refused-{it.version}-{int(it.shared)}.log")
    cmd = [launcher] + it.cmd + [script, "ctypes"]
    e = sanitizer_env(env, it)
    plain = subprocess.run(cmd, env=e, cwd=tmp, capture_output=True, text=True, timeout=120 * SLOW)
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--"] + cmd, env=e, cwd=tmp,
                       capture_output=True, text=True, timeout=120 * SLOW)
    label = f"{it.label} process_vm_readv refused"
    check(plain.returncode == 0 and p.returncode == 0 and "done ctypes" in p.stdout,
          f"{label}: plain {plain.returncode} {plain.stderr[-300:]!r}, under the shim "
          f"{p.returncode} {p.stderr[-300:]!r}")
    with open(log, encoding="utf-8") as f:
        records = [json.loads(l) for l in f if l.startswith("{")]
    notes = [r["msg"] for r in records if r.get("k") == "note" and "frames are not read" in
             r.get("msg", "")]
    check(notes == ["CPython: its frames are not read (the kernel refuses process_vm_readv, so no "
                    "read could be checked); stacks show native frames only"] and
          not [r for r in records if r.get("k") == "pycode"],
          f"{label}: one note, nothing read: {notes}")
    rep = json.loads(subprocess.run([cg, "report", "--json", log], capture_output=True, text=True,
                                    timeout=60 * SLOW).stdout)
    groups = [g for c in rep["findings"]["classes"] if c["class"] == "double-free"
              for g in c["groups"]]
    check(len(groups) == 1 and groups[0]["stack"]["frames"] and
          all(f.get("kind") == "native" for f in groups[0]["stack"]["frames"]),
          f"{label}: the double free with native frames: {len(groups)}")


def run_fork(cg, exe, env, tmp):
    """A fork while another thread's first captured stack is inside the reader's look-up of the
    interpreter: the child's own stacks are captured (its double free names the fake frame), it
    exits, and the parent goes on."""
    log = os.path.join(tmp, "fake-fork.log")
    plain = subprocess.run([exe, "fork"], env=env, capture_output=True, text=True, timeout=120 * SLOW)
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--", exe, "fork"], env=env,
                       capture_output=True, text=True, timeout=120 * SLOW)
    label = "fake_python fork"
    # Without the shim the parent's thread has made CUDA ready before the fork, so the child's
    # calls fail as a forked child's do; under the shim the fork comes first.
    check(plain.returncode == 0 and plain.stdout.endswith("child: exit 0\n") and
          p.returncode == 0 and
          p.stdout == "child: malloc 0 free 0 free_again 0\nchild: exit 0\n",
          f"{label}: plain {plain.returncode} {plain.stdout!r}, under the shim {p.returncode} "
          f"{p.stdout!r} {p.stderr[-400:]!r}")
    child_logs = [f for f in os.listdir(tmp) if f.startswith("fake-fork.log.")]
    check(len(child_logs) == 1, f"{label}: one log of the child: {child_logs}")
    if len(child_logs) != 1:
        return
    rep = json.loads(subprocess.run([cg, "report", "--json", os.path.join(tmp, child_logs[0])],
                                    capture_output=True, text=True, timeout=60 * SLOW).stdout)
    groups = [g for c in rep["findings"]["classes"] if c["class"] == "double-free"
              for g in c["groups"]]
    py = [(f["function"], f["file"], f["line"]) for g in groups for f in py_frames(g["stack"])]
    check(len(groups) == 1 and py == [("fake_fn", "fake.py", 8)],
          f"{label}: the child's double free with its Python frame: {len(groups)} {py}")


def run_fake(cg, exe, env, tmp):
    run_fork(cg, exe, env, tmp)
    for mode in ("future", "garbage", "cycle"):
        log = os.path.join(tmp, f"fake-{mode}.log")
        plain = subprocess.run([exe, mode], env=env, capture_output=True, text=True, timeout=60 * SLOW)
        p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--", exe, mode], env=env,
                           capture_output=True, text=True, timeout=60 * SLOW)
        label = f"fake_python {mode}"
        check(plain.returncode == 0 and plain.stdout == "malloc 0 free 0 free_again 1\n" and
              p.returncode == 0 and p.stdout == "malloc 0 free 0 free_again 0\n",
              f"{label}: plain {plain.returncode} {plain.stdout!r}, under the shim {p.returncode} "
              f"{p.stdout!r} {p.stderr[-400:]!r}")
        with open(log, encoding="utf-8") as f:
            records = [json.loads(l) for l in f if l.startswith("{")]
        notes = [r["msg"] for r in records if r.get("k") == "note" and "frames are not read" in
                 r.get("msg", "")]
        rep = json.loads(subprocess.run([cg, "report", "--json", log], capture_output=True,
                                        text=True, timeout=60 * SLOW).stdout)
        groups = [g for c in rep["findings"]["classes"] if c["class"] == "double-free"
                  for g in c["groups"]]
        check(len(groups) == 1, f"{label}: one double free: {len(groups)}")
        if not groups:
            continue
        frames = groups[0]["stack"]["frames"]
        native = [f for f in frames if f.get("kind") == "native"]
        py = py_frames(groups[0]["stack"])
        marker = [f.get("python_end") for f in frames if f.get("kind") == "marker"]
        check(native and any("fake_python" in (f.get("module") or "") for f in native),
              f"{label}: the native frames stay: {frames[:3]}")
        if mode == "future":
            check(notes == ["CPython 3.15.0: its frames are not read (no frame layout is known "
                            "for this version (known: 3.10 to 3.14)); stacks show native frames "
                            "only"] and not py and not marker,
                  f"{label}: one note, native frames only: {notes} {py} {marker}")
        elif mode == "garbage":
            check(not notes and not py and marker == ["unreadable"],
                  f"{label}: the unreadable frame ends the Python part: {py} {marker} {notes}")
        else:
            check(len(py) == 64 and {(f["function"], f["file"], f["line"]) for f in py} ==
                  {("fake_fn", "fake.py", 8)} and marker == ["truncated"],
                  f"{label}: the looping chain is cut at 64 frames: {len(py)} {py[:1]} {marker}")


if __name__ == "__main__":
    main()
