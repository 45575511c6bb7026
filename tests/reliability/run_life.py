#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Process-life cases (tests/reliability/life_cases.cpp, dl_reload.cpp) run under the shim on the
# fake CUDA stack. Each checks the exit status against a run without the shim where that makes
# sense, the steps the program printed, and every log: whole JSON lines, a header, and an `end`
# record where the process ended normally (docs/reliability.md, "Process life").
import argparse
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Build, Failure, expect, logs_in, read_log, run_case, scale, steps,  # noqa: E402
                     stderr_lines, wait_until)


def sanitizer_signal_options(env):
    # A sanitizer installs its own SIGSEGV/SIGBUS/SIGFPE handlers at start, and the shim never
    # replaces a handler; for the crash cases the sanitizer leaves those signals alone.
    extra = "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0:handle_sigill=0"
    for k in ("ASAN_OPTIONS", "TSAN_OPTIONS", "UBSAN_OPTIONS"):
        env[k] = (env[k] + ":" if env.get(k) else "") + extra


def complete(path, recs):
    expect(recs and recs[0].get("cumemguard_log") == 1, f"{path}: no header")
    expect(recs[-1].get("k") == "end", f"{path}: does not end with `end` (last: {recs[-1]})")
    kinds = [r.get("k") for r in recs]
    expect(kinds.count("end") == 1, f"{path}: {kinds.count('end')} end records")
    expect("summary" in kinds, f"{path}: no summary")


def case_fork_locks(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "fork-locks"]
    rc, out, err = b.run(argv, b.env(shim=False), timeout=240)
    expect(rc == 0 and steps(out).get("children_ok") == "30", f"without shim: {rc} {out} {err}")
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p"),
                                     extra={"CUMEMGUARD_STACKS": "8"}), timeout=240)
    s = steps(out)
    expect(rc == 0, f"exit {rc}\n{err[-2000:]}")
    expect(s.get("children_hung") == "0", f"{s.get('children_hung')} children hung")
    expect(s.get("children_ok") == "30", f"children_ok {s.get('children_ok')}")
    expect(s.get("parent_failures") == "0", f"parent calls failed: {s.get('parent_failures')}")
    logs = logs_in(tmp)
    expect(len(logs) == 31, f"{len(logs)} logs, expected the parent's and 30 children's")
    recs = {p: read_log(p)[0] for p in logs}
    pids = {r[0]["pid"] for r in recs.values()}
    parent = [p for p, r in recs.items() if r[0]["ppid"] not in pids]
    expect(len(parent) == 1, f"cannot tell the parent's log among {len(recs)}")
    ppid = recs[parent[0]][0]["pid"]
    for p, r in recs.items():
        complete(p, r)
        if p != parent[0]:
            expect(r[0]["ppid"] == ppid, f"{p}: ppid {r[0]['ppid']}, expected {ppid}")
            calls = [x for x in r if x.get("k") == "call"]
            expect(calls, f"{p}: the child's calls are not in its own log")


def case_exec(b, tmp, how):
    argv = [b.prog("tests", "reliability", "life_cases"), how]
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")), timeout=120)
    s = steps(out)
    expect(rc == 0, f"exit {rc}\n{err[-2000:]}")
    expect(s.get("child_hung") == "0" and s.get("child_status") == "0",
           f"child: hung {s.get('child_hung')}, status {s.get('child_status')}")
    expect(s.get("parent_failures") == "0", f"parent calls failed: {s.get('parent_failures')}")
    logs = {p: read_log(p)[0] for p in logs_in(tmp)}
    expect(len(logs) == 2, f"{len(logs)} logs, expected the parent's and the child's")
    child = [p for p, r in logs.items() if r[0]["pid"] == int(s["child_pid"])]
    expect(len(child) == 1, f"no log of the child {s['child_pid']}")
    crec = logs[child[0]]
    expect(crec[0]["argv"][1:] == ["child-work"], f"child header argv {crec[0]['argv']}")
    for p, r in logs.items():
        complete(p, r)


def case_exec_fds(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "exec-fds"]
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")), timeout=60)
    expect(rc == 0, f"exit {rc}\n{err[-2000:]}")
    fds = [l for l in out.splitlines() if l.startswith("fd ")]
    expect(fds, f"the child listed no descriptors: {out}")
    leaked = [l for l in fds if tmp in l]
    expect(not leaked, f"the exec'd child inherited the parent's log: {leaked}")


def case_dl_reload(b, tmp):
    argv = [b.prog("tests", "reliability", "dl_reload")]
    rc0, out0, err0 = b.run(argv, b.env(shim=False), timeout=60)
    s0 = steps(out0)
    expect(rc0 == 0 and s0.get("second.failures") == "0", f"without shim: {rc0} {out0} {err0}")
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")), timeout=60)
    s = steps(out)
    expect(rc == 0, f"exit {rc} (without the shim: {rc0})\n{out}\n{err[-2000:]}")
    expect(s.get("first.failures") == "0" and s.get("second.failures") == "0",
           f"calls failed under the shim: {s}")
    # The shim pins libcuda once it holds pointers into it (docs/reliability.md): the library is
    # not unloaded under it, so no wrapper can ever call into an unmapped driver.
    expect(s.get("unloaded") == "0", f"libcuda was unloaded under the shim: {s}")
    (log,) = logs_in(tmp)
    recs = read_log(log)[0]
    complete(log, recs)
    # Both rounds went through the shim: the second round's lookups were wrapped too.
    creates = [r for r in recs if r.get("k") == "call" and r.get("api") == "cuMemCreate"]
    expect(len(creates) == 2, f"{len(creates)} cuMemCreate calls recorded, expected 2")


def case_static_dtor(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "static-dtor"]
    rc0, out0, _ = b.run(argv, b.env(shim=False), timeout=60)
    s0 = steps(out0)
    expect(rc0 == 0 and s0.get("late.free") == "0" and s0.get("late.double_free") == "1",
           f"without shim: {rc0} {s0}")
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")), timeout=60)
    s = steps(out)
    expect(rc == 0, f"exit {rc}\n{err[-2000:]}")
    want = {"late.free": "0", "late.double_free": "0", "late.unmap": "0", "late.release": "0",
            "late.addrfree": "0"}
    expect(all(s.get(k) == v for k, v in want.items()), f"late calls under the shim: {s}")
    (log,) = logs_in(tmp)
    recs = read_log(log)[0]
    complete(log, recs)
    # The frees from the destructor came before the summary: they are in the log, the double free
    # is a finding, and nothing they freed is reported as a leak.
    kinds = [r.get("k") for r in recs]
    last_call = max(i for i, k in enumerate(kinds) if k == "call")
    expect(last_call < kinds.index("summary"), "calls recorded after the exit summary")
    findings = [(r["class"], r["action"]) for r in recs if r.get("k") == "finding"]
    expect(findings == [("double-free", "skip")], f"findings {findings}")
    leaks = [r for r in recs if r.get("k") == "leak"]
    expect(not leaks, f"frees from a static destructor reported as leaks: {leaks}")


def case_library_dtor(b, tmp):
    argv = [b.prog("tests", "reliability", "late_free")]
    rc0, out0, _ = b.run(argv, b.env(shim=False), timeout=60)
    s0 = steps(out0)
    expect(rc0 == 0 and s0.get("lib.free") == "0" and s0.get("lib.double_free") == "1",
           f"without shim: {rc0} {s0}")
    # With a quarantine, the frees come after the exit handler that returned held frees to the
    # driver: nothing may be held any more (it would never be freed), the free goes through.
    for i, extra in enumerate([{}, {"CUMEMGUARD_QUARANTINE": "64M"}]):
        d = os.path.join(tmp, str(i))
        os.mkdir(d)
        rc, out, err = b.run(argv, b.env(log=os.path.join(d, "log.%p"), extra=extra), timeout=60)
        s = steps(out)
        expect(rc == 0, f"{extra}: exit {rc}\n{err[-2000:]}")
        expect(s.get("lib.free") == "0" and s.get("lib.double_free") == "0",
               f"{extra}: under the shim: {s}")
        (log,) = logs_in(d)
        recs = read_log(log)[0]
        complete(log, recs)
        # The summary waits for every library's destructor: the late frees are in the log before
        # it, the double free is a finding, and the freed allocation is not reported as a leak.
        kinds = [r.get("k") for r in recs]
        frees = [r for r in recs if r.get("k") == "call" and r.get("api") == "cudaFree"]
        expect(len(frees) == 2 and kinds.index("summary") > max(recs.index(f) for f in frees),
               f"{extra}: late frees logged: {len(frees)}, kinds {kinds}")
        expect(not any("held" in f.get("args", {}) or "held" in f for f in frees),
               f"{extra}: a free held back after exit began: {frees}")
        findings = [(r["class"], r["action"]) for r in recs if r.get("k") == "finding"]
        expect(findings == [("double-free", "skip")], f"{extra}: findings {findings}")
        leaks = [r for r in recs if r.get("k") == "leak"]
        expect(not leaks, f"{extra}: memory a library destructor freed reported as a leak: {leaks}")


def case_exit_thread(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "exit-thread"]
    for i in range(10):
        d = os.path.join(tmp, str(i))
        os.mkdir(d)
        rc, out, err = b.run(argv, b.env(log=os.path.join(d, "log.%p"),
                                         extra={"CUMEMGUARD_STACKS": "4"}), timeout=60)
        expect(rc == 0, f"run {i}: exit {rc}\n{err[-3000:]}")
        for p in logs_in(d):
            recs = read_log(p)[0]
            complete(p, recs)


def quick_exit_logs(tmp, want_children):
    """The logs of a parent and its children that ended with _exit()/_Exit(): each complete, the
    children's `end` marked `_exit`, each child's cudaMalloc in its own log (it was in the buffer
    that _exit() dropped), the parent's own end unmarked. Returns the logs by pid."""
    logs = {}
    for p in logs_in(tmp):
        recs = read_log(p)[0]
        complete(p, recs)
        logs[recs[0]["pid"]] = recs
    expect(len(logs) == want_children + 1,
           f"{len(logs)} logs, want the parent's and {want_children} children's")
    parents = [r for r in logs.values() if r[0]["ppid"] not in logs]
    expect(len(parents) == 1, f"cannot tell the parent among {sorted(logs)}")
    parent = parents[0]
    expect(not parent[-1].get("_exit"), f"parent's end {parent[-1]}")
    for pid, recs in logs.items():
        if recs is parent:
            continue
        expect(recs[-1].get("_exit") is True, f"child {pid}: end {recs[-1]}")
        calls = [r["api"] for r in recs if r.get("k") in ("call", "cuda_error")]
        expect(any(a.startswith("cudaMalloc") for a in calls), f"child {pid}: calls {calls}")
        # The writer that _exit uses reads no model (_exit may be called from a signal handler):
        # the counters and findings, no leak records, and the report says the leaks are not known.
        (summ,) = [r for r in recs if r.get("k") == "summary"]
        expect(summ.get("_exit") is True and "live" not in summ and
               summ["calls"].get("cudaMalloc") == 1, f"child {pid}: summary {summ}")
    return logs


def report_of(b, path):
    cg = b.prog("tools", "cumemguard")
    rc, out, err = b.run([cg, "report", path], b.env(shim=False))
    return rc, out


def case_quick_exit(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "quick-exit"]
    rc, out, err = b.run(argv, b.env(shim=False))
    plain = steps(out)
    rc2, out2, err2 = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")))
    s = steps(out2)
    expect(rc == 0 and rc2 == 0, f"exit {rc} without the shim, {rc2} with it\n{err2[-2000:]}")
    expect(plain == s and s == {"_exit_status": "5", "_Exit_status": "6", "vfork_status": "7",
                                "parent_after": "1"},
           f"without the shim {plain}, with it {s}")
    logs = quick_exit_logs(tmp, 2)
    child = next(p for p in logs_in(tmp) if read_log(p)[0][0]["ppid"] in logs)
    rc, text = report_of(b, child)
    expect(rc == 0 and "== Leaks at exit: not known: the process ended with _exit (no leak check)"
           in text and "TRUNCATED" not in text, f"report of {child}: {rc}\n{text[:1500]}")


def case_quick_exit_busy(b, tmp):
    # 20 runs: the records and `end` whole and last, the call records before them (the _exit
    # writer waits a moment for another thread's write instead of giving the buffer up at once).
    argv = [b.prog("tests", "reliability", "life_cases"), "quick-exit-busy"]
    for i in range(20):
        d = os.path.join(tmp, str(i))
        os.mkdir(d)
        rc, out, err = b.run(argv, b.env(log=os.path.join(d, "log.%p")), timeout=60)
        expect(rc == 0, f"run {i}: exit {rc}\n{err[-2000:]}")
        (p,) = logs_in(d)
        recs = read_log(p)[0]
        complete(p, recs)
        expect(recs[-1].get("_exit") is True, f"run {i}: end {recs[-1]}")
        calls = sum(1 for r in recs if r.get("k") == "call")
        expect(calls > 0, f"run {i}: no call records")


def case_quick_exit_python(b, tmp):
    # As users meet it: a Python parent whose forked worker calls CUDA and ends with os._exit, as
    # multiprocessing's workers end; with each interpreter here (a static and a shared libpython).
    script = os.path.join(tmp, "worker.py")
    with open(script, "w") as f:
        f.write("import ctypes, os\n"
                "rt = ctypes.CDLL('libcudart.so.13')\n"
                "p = ctypes.c_void_p()\n"
                "assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(4096)) == 0\n"
                "pid = os.fork()\n"
                "if pid == 0:\n"
                "    rt.cudaMalloc(ctypes.byref(ctypes.c_void_p()), ctypes.c_size_t(4096))\n"
                "    os._exit(3)\n"
                "_, st = os.waitpid(pid, 0)\n"
                "print('worker', os.waitstatus_to_exitcode(st))\n"
                "rt.cudaFree(p)\n")
    pythons = sorted({os.path.realpath(sys.executable)} |
                     ({"/usr/bin/python3"} if os.path.exists("/usr/bin/python3") else set()))
    for i, py in enumerate(pythons):
        d = os.path.join(tmp, str(i))
        os.mkdir(d)
        # Under a sanitizer the interpreter is not built with it: its runtime is preloaded first,
        # without the shim too (the fake CUDA stack is instrumented), and CPython's own leaks at
        # exit are not this case's (every other sanitized test checks the shim's).
        extra = {}
        if b.first:
            extra["LD_PRELOAD"] = b.first
            extra["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
        rc, out, err = b.run([py, script], b.env(shim=False, extra=extra))
        extra.pop("LD_PRELOAD", None)
        rc2, out2, err2 = b.run([py, script], b.env(log=os.path.join(d, "log.%p"), extra=extra))
        expect(rc == 0 and rc2 == 0 and out == out2 == "worker 3\n",
               f"{py}: {rc} {out!r} without the shim, {rc2} {out2!r} with it\n{err[-1500:]}\n{err2[-2000:]}")
        quick_exit_logs(d, 1)


def log_bytes(d):
    logs = logs_in(d)
    return os.path.getsize(logs[0]) if logs else 0


def case_kill(b, tmp, sig):
    # Killed while the writers write: once the log holds a first batch, several batches, many.
    argv = [b.prog("tests", "reliability", "life_cases"), "spin"]
    report = b.prog("tools", "cumemguard")
    for i, size in enumerate((64 << 10, 512 << 10, 4 << 20)):
        d = os.path.join(tmp, str(i))
        os.mkdir(d)
        p = subprocess.Popen(argv, env=b.env(log=os.path.join(d, "log.%p")),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = p.stdout.readline()
        expect(line.strip() == b"spinning", f"the writer did not start: {line!r}")
        try:
            wait_until(lambda: log_bytes(d) >= size, f"the log did not reach {size} bytes")
        except Failure:
            p.kill()
            p.wait()
            raise
        p.send_signal(sig)
        try:
            p.wait(timeout=30 * scale())
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failure(f"did not die of signal {sig} within 30 s")
        expect(p.returncode == -sig, f"exit {p.returncode}, expected death by signal {sig}")
        (log,) = logs_in(d)
        recs, cut = read_log(log, allow_cut_last=True)
        expect(recs and recs[0].get("cumemguard_log") == 1, f"{log}: no header")
        expect(not any(r.get("k") == "end" for r in recs), f"{log}: an end record after a kill")
        # The reader takes it as a truncated log, not as an unreadable one.
        rc, out, err = b.run([report, "report", "--no-symbolize", log], b.env(shim=False))
        expect(rc in (0, 1), f"cumemguard report on the killed log: exit {rc}\n{err}")
        expect("truncated" in (out + err).lower() or "cut off" in (out + err).lower(),
               f"the report does not say the log was cut off:\n{out[:1500]}")


def case_kill_idle(b, tmp):
    # Killed after one call and nothing since: no later write has flushed the log's buffer, so the
    # header is there only because it went to disk when the log was opened.
    argv = [b.prog("tests", "reliability", "life_cases"), "idle"]
    p = subprocess.Popen(argv, env=b.env(log=os.path.join(tmp, "log.%p")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    line = p.stdout.readline()
    expect(line.strip() == b"idle", f"the program did not start: {line!r}")
    p.kill()
    p.wait(timeout=30 * scale())
    expect(p.returncode == -signal.SIGKILL, f"exit {p.returncode}, expected death by SIGKILL")
    (log,) = logs_in(tmp)
    recs, _ = read_log(log, allow_cut_last=True)
    expect(recs and recs[0].get("cumemguard_log") == 1 and recs[0].get("pid") == p.pid,
           f"{log}: no header of pid {p.pid}: {recs[:1]}")
    rc, out, err = b.run([b.prog("tools", "cumemguard"), "report", "--no-symbolize", log],
                         b.env(shim=False))
    # Killed, and not running any more: not a clean log (1, said; it was 0).
    expect(rc == 1 and "TRUNCATED" in out and "ended without its end record (killed?)" in out,
           f"cumemguard report on the killed log: exit {rc}\n{out[:1500]}{err}")


def case_kill_idle_calls(b, tmp, sig):
    # About 2,000 calls, then quiet: killed 2 s later, the log holds every call, written by the
    # log's flusher within a second though no later record came (no flush cost per call).
    argv = [b.prog("tests", "reliability", "life_cases"), "idle-calls"]
    p = subprocess.Popen(argv, env=b.env(log=os.path.join(tmp, "log.%p")),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = b""
    while not out.endswith(b"idle\n"):
        line = p.stdout.readline()
        if not line:
            break
        out += line
    expect(out.endswith(b"idle\n"), f"the program did not reach its idle point: {out!r}")
    s = steps(out.decode())
    expect(s.get("failures") == "0", f"calls failed: {s}")
    # The flusher writes the quiet buffer out with no later record to push it: wait for the log
    # to hold every call (the process makes no more), then kill.
    want = int(s["calls"])

    def call_records():
        logs = logs_in(tmp)
        return len([r for r in read_log(logs[0], allow_cut_last=True)[0]
                    if r.get("k") == "call"]) if logs else 0
    try:
        wait_until(lambda: call_records() >= want, f"the log did not get all {want} calls")
    except Failure:
        p.kill()
        p.wait()
        raise
    p.send_signal(sig)
    p.wait(timeout=30 * scale())
    expect(p.returncode == -sig, f"exit {p.returncode}, expected death by signal {sig}")
    (log,) = logs_in(tmp)
    recs, _ = read_log(log, allow_cut_last=True)
    calls = [r for r in recs if r.get("k") == "call"]
    expect(len(calls) == int(s["calls"]),
           f"{len(calls)} call records in the log, the program made {s['calls']} calls")
    expect([r["seq"] for r in calls] == list(range(1, len(calls) + 1)), "call records missing")


def check_crash_record(recs, out, case, want_sig):
    """The crash context: one `crash` record before the summary, naming the signal, the faulting
    thread and address, with the stack of that thread whose every address has its module."""
    crashes = [r for r in recs if r.get("k") == "crash"]
    expect(len(crashes) == 1, f"{len(crashes)} crash records")
    c = crashes[0]
    kinds = [r.get("k") for r in recs]
    expect(kinds[-3:] == ["crash", "summary", "end"], f"the log ends {kinds[-3:]}")
    names = {signal.SIGSEGV: "SIGSEGV", signal.SIGABRT: "SIGABRT"}
    expect(c["signal"] == want_sig and c["signal_name"] == names[want_sig], f"crash record {c}")
    s = steps(out)
    if want_sig == signal.SIGSEGV:
        expect(c.get("tid") == int(s["fault_tid"]), f"crash tid {c.get('tid')}, faulted in {s}")
        expect(c.get("addr") == hex(int(s["fault_addr"])), f"crash addr {c.get('addr')}, {s}")
    else:
        expect("addr" not in c, f"an address for {names[want_sig]}: {c}")
    stack = [r for r in recs[:recs.index(c)] if r.get("k") == "stack" and r["id"] == c.get("stack")]
    expect(len(stack) == 1 and len(stack[0]["pcs"]) >= 2, f"no stack record for {c}")
    mods = [r for r in recs[:recs.index(stack[0])] if r.get("k") == "module"]
    def module_of(pc):
        pc = int(pc, 16)
        for m in mods:
            if int(m["base"], 16) <= pc < int(m["base"], 16) + m["size"]:
                return m["path"]
        return None
    where = [module_of(pc) for pc in stack[0]["pcs"]]
    expect(all(where), f"addresses without a module record: {list(zip(stack[0]['pcs'], where))}")
    first_program = next(i for i, w in enumerate(where) if w.endswith("/life_cases"))
    # SIGSEGV: the faulting instruction itself (in the program); SIGABRT: raise/abort in libc.
    expect(first_program == 0 if want_sig == signal.SIGSEGV else first_program > 0,
           f"the stack does not start where the signal came from: {where}")


def case_crash(b, tmp, case, want_sig, own=False, off=False):
    argv = [b.prog("tests", "reliability", "life_cases"), case]
    base_env = b.env(shim=False)
    sanitizer_signal_options(base_env)
    rc0, out0, _ = b.run(argv, base_env, timeout=60)
    extra = {"CUMEMGUARD_SUMMARY": "1"}
    if off:
        extra["CUMEMGUARD_CRASH_SUMMARY"] = "0"
    env = b.env(log=os.path.join(tmp, "log.%p"), extra=extra)
    sanitizer_signal_options(env)
    rc, out, err = b.run(argv, env, timeout=60)
    expect(rc == rc0, f"exit {rc} under the shim, {rc0} without it\n{err[-2000:]}")
    (log,) = logs_in(tmp)
    recs, _ = read_log(log, allow_cut_last=True)
    ends = [r for r in recs if r.get("k") == "end"]
    if own:
        # The program's handler ends the process with _exit(3): no crash summary (no crash
        # record, no signal), the records of an _exit instead (the last ones were lost before).
        crashes = [r for r in recs if r.get("k") == "crash" or "signal" in r]
        expect(not crashes and len(ends) == 1 and ends[0].get("_exit") is True and
               recs[-1] is ends[0], f"own handler then _exit: {crashes} {ends}")
    if off:
        expect(not ends, f"the shim wrote a crash summary it should not have: {ends}")
    if own or off:
        if own:
            expect("own handler" in out, f"the program's own handler did not run: {out}")
        if case == "handler-first":
            expect(steps(out).get("handler_kept") == "1", f"the program's handler was replaced: {out}")
        return
    expect(rc == -want_sig, f"exit {rc}, expected death by signal {want_sig}")
    expect(len(ends) == 1 and ends[0].get("signal") == want_sig and recs[-1] is ends[0],
           f"the log does not end with the crash's end record: {recs[-3:]}")
    summ = [r for r in recs if r.get("k") == "summary"]
    expect(len(summ) == 1, f"{len(summ)} summary records")
    expect(summ[0]["calls"].get("cudaMalloc", 0) >= 2 and
           summ[0]["findings"].get("double-free") == 1,
           f"the crash summary lacks the counters: {summ[0]}")
    rows = {(r["dev"], r["mem"]): r for r in summ[0]["bytes"]}
    # The 3 MiB the program leaked, plus whatever the busy threads had in flight.
    cur = rows.get((0, "linear"), {}).get("current", 0)
    expect(cur == 3 << 20 if case != "crash-thread" else cur >= 3 << 20,
           f"bytes live at the crash: {summ[0]['bytes']}")
    lines = [l for l in stderr_lines(err) if "killed by" in l]
    expect(len(lines) == 1, f"stderr crash line: {stderr_lines(err)}")
    check_crash_record(recs, out, case, want_sig)
    # The report reads a crashed log.
    rc2, out2, err2 = b.run([b.prog("tools", "cumemguard"), "report", "--no-symbolize", log],
                            b.env(shim=False))
    expect(rc2 in (0, 1), f"cumemguard report on the crashed log: exit {rc2}\n{err2}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    b = Build(a.build)
    tmp = tempfile.mkdtemp(prefix=f"cmg-life-{a.case}-")
    cases = {
        "fork-locks": lambda: case_fork_locks(b, tmp),
        "fork-exec": lambda: case_exec(b, tmp, "fork-exec"),
        "vfork-exec": lambda: case_exec(b, tmp, "vfork-exec"),
        "posix-spawn": lambda: case_exec(b, tmp, "posix-spawn"),
        "exec-fds": lambda: case_exec_fds(b, tmp),
        "dl-reload": lambda: case_dl_reload(b, tmp),
        "static-dtor": lambda: case_static_dtor(b, tmp),
        "library-dtor": lambda: case_library_dtor(b, tmp),
        "exit-thread": lambda: case_exit_thread(b, tmp),
        "quick-exit": lambda: case_quick_exit(b, tmp),
        "quick-exit-busy": lambda: case_quick_exit_busy(b, tmp),
        "quick-exit-python": lambda: case_quick_exit_python(b, tmp),
        "sigterm": lambda: case_kill(b, tmp, signal.SIGTERM),
        "sigkill": lambda: case_kill(b, tmp, signal.SIGKILL),
        "kill-idle": lambda: case_kill_idle(b, tmp),
        "kill-idle-calls": lambda: case_kill_idle_calls(b, tmp, signal.SIGKILL),
        "term-idle-calls": lambda: case_kill_idle_calls(b, tmp, signal.SIGTERM),
        "crash-segv": lambda: case_crash(b, tmp, "crash-segv", signal.SIGSEGV),
        "crash-abort": lambda: case_crash(b, tmp, "crash-abort", signal.SIGABRT),
        "crash-thread": lambda: case_crash(b, tmp, "crash-thread", signal.SIGSEGV),
        "crash-own-handler": lambda: case_crash(b, tmp, "crash-own-handler", 0, own=True),
        "handler-first": lambda: case_crash(b, tmp, "handler-first", 0, own=True),
        "crash-off": lambda: case_crash(b, tmp, "crash-segv", signal.SIGSEGV, off=True),
    }
    return run_case(a.case, cases[a.case], tmp)


if __name__ == "__main__":
    sys.exit(main())
