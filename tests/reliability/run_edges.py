#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# A hostile host (docs/reliability.md, "The shim's edges"): a daemon that closes and reuses the
# shim's descriptors, a SIGTERM handler that calls exit() while threads allocate (and churn the
# heap), exit() from two threads at once, a host that closes its standard descriptors and reuses
# the numbers, a fork() while an import waits on a stopped exporter, another user flooding the
# broker, an exporter that changes its user after exporting; a run without a CUDA driver; and the
# records that must be there afterwards (cuda_error). Each case
# asserts the values the program prints and what the logs hold.
import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (Build, Failure, expect, logs_in, read_log, run_case, scale, steps,  # noqa: E402
                     stderr_lines)


def ipc(b, tmp, case, timeout=120, extra=None):
    env = b.env(log=os.path.join(tmp, "log.%p"), extra={"CUMEMGUARD_IPC": "bridge", **(extra or {})})
    rc, out, err = b.run([b.prog("tests", "integration", "ipc_bridge"), case], env,
                         timeout=timeout, cwd=tmp)
    if rc == 77:
        print(f"{case}: {err.strip()}")
        raise SystemExit(77)
    expect(rc == 0, f"{case}: exit {rc}\n{out}\n{err[-3000:]}")
    logs = {p: read_log(p)[0] for p in logs_in(tmp)}
    for p, recs in logs.items():
        expect(recs and recs[-1].get("k") == "end", f"{p} does not end with `end`")
    return steps(out), logs, err


def own_log(logs, pid_is_main=True):
    """The log of the test's main process (the one whose parent is not another logged process)."""
    pids = {r[0]["pid"] for r in logs.values()}
    main = [p for p, r in logs.items() if r[0]["ppid"] not in pids]
    expect(len(main) == 1, f"cannot tell the main process's log among {list(logs)}")
    return logs[main[0]]


def notes(recs, word):
    return [r["msg"] for r in recs if r.get("k") == "note" and word in r.get("msg", "")]


def case_fd_reuse(b, tmp):
    s, logs, _ = ipc(b, tmp, "fd-reuse")
    want = {"export": "CUDA_SUCCESS", "found_shim_fds": "1", "shim_fds_high": "1",
            "old_address_refused": "1", "broker_threads_after_close": "0", "host_accepted": "20",
            "double_free": "cudaSuccess", "calls_failed": "0", "host_file_intact": "1",
            "host_fds_intact": "1", "export_again": "CUDA_SUCCESS", "imp.open": "CUDA_SUCCESS",
            "imp.pattern_ok": "1", "importer_exit": "0"}
    got = {k: s.get(k) for k in want}
    expect(got == want, f"fd-reuse: {got}\n   expected {want}")
    with open(os.path.join(tmp, "host-file"), "rb") as f:
        expect(f.read() == b"the host's own file\n", "the host's file has bytes of the shim's")
    recs = own_log(logs)
    # The log went on after the host took its number: the 200 pairs and the double free are in it.
    mallocs = [r for r in recs if r.get("k") == "call" and r.get("api") == "cudaMalloc"]
    expect(len(mallocs) == 201, f"{len(mallocs)} cudaMalloc records, expected 201")
    expect([r["class"] for r in recs if r.get("k") == "finding"] == ["double-free"],
           "the double free after the close is not in the log")
    expect(len(notes(recs, "was opened again")) == 1, f"no note of the reopened log: {notes(recs, '')}")
    expect(len(notes(recs, "the broker stopped")) == 1, f"no note of the stopped broker")


def case_fork_stall(b, tmp):
    s, _, _ = ipc(b, tmp, "fork-stall", timeout=90)
    want = {"exporter_stopped": "1", "opener_waiting": "1",
            "fork_returned_while_open_pending": "1", "fork_child_exit": "0",
            "open": "cudaSuccess", "pattern_ok": "1", "close": "cudaSuccess", "exporter_exit": "0"}
    got = {k: s.get(k) for k in want}
    expect(got == want, f"fork-stall: {got}\n   expected {want}")


def case_flood(b, tmp):
    s, logs, err = ipc(b, tmp, "flood")
    attempts, denied = int(s.get("flood_attempts", 0)), int(s.get("flood_denied", -1))
    # Every connection is refused; a few may see the refusal as a reset instead of the answer (the
    # broker closes at once), none gets a descriptor.
    expect(s.get("flood_fds") == "0", f"flood: descriptors handed to another user: {s}")
    expect(attempts >= 100 and attempts - 10 <= denied <= attempts,
           f"flood: {denied} of {attempts} connections answered with status 4")
    recs = own_log(logs)
    one_by_one = notes(recs, "ipc bridge: refused a connection")
    counted = [int(m.group(1)) for n in notes(recs, "more connections refused")
               for m in [re.search(r"(\d+) more connections refused", n)]]
    # Eight refusals one by one, then at most one count a second (2.5 s of flooding) and the rest
    # at exit: every refusal is counted, in a bounded number of lines.
    expect(len(one_by_one) == 8, f"{len(one_by_one)} single refusal notes, expected 8")
    expect(1 <= len(counted) <= 5, f"{len(counted)} count notes: {counted}")
    totals = [int(t) for t in re.findall(r"\((\d+) in all", " ".join(notes(recs, "in all")))]
    expect(totals and denied <= totals[-1] <= attempts,
           f"the last count says {totals[-1:]} in all, of {attempts} connections ({denied} answered)")
    expect(8 + sum(counted) == totals[-1], f"the notes count {8 + sum(counted)} of {totals[-1]}")
    loud = [l for l in stderr_lines(err) if "refused" in l]
    expect(len(loud) <= 10, f"{len(loud)} refusal lines on stderr")


def case_uid_change(b, tmp):
    s, logs, _ = ipc(b, tmp, "uid-change")
    want = {"export": "CUDA_SUCCESS", "dropped": "1", "raw_status": "4", "raw_fds": "0"}
    got = {k: s.get(k) for k in want}
    expect(got == want, f"uid-change: {got}\n   expected {want}")
    recs = own_log(logs)
    expect(len(notes(recs, "changed its effective user from uid 0 to uid 65534")) == 1,
           "the user change is not said once")


def older_shim(b):
    """The launcher runs the shim of its own build; CMG_TEST_SHIM (an older build) is named to it."""
    return {"CUMEMGUARD_SHIM_PATH": b.shim} if os.environ.get("CMG_TEST_SHIM") else {}


def exit_runs(b, tmp, case, runs, launcher=False, shim=True, extra=None, timeout=30, args=(),
              from_signal=True):
    """Runs exit_cases CASE `runs` times, 4 at a time, and checks each run: exit 0 (as without the
    shim) within the time limit, no allocation on the exiting thread (exit_alloc.h aborts with
    "exit-alloc:" on stderr), and with the shim one log ending with one summary and `end`, the
    exit summary on stderr. Returns the failures and the logs."""
    argv = [b.prog("tests", "reliability", "exit_cases"), case] + list(args)
    logs = []

    def one(i):
        how = 'run' if launcher else 'preload' if shim else 'plain'
        d = os.path.join(tmp, f"{case}-{how}-{''.join(args)}{i}")
        os.mkdir(d)
        log = os.path.join(d, "log.%p")
        env = b.env(shim=shim and not launcher, log=log if shim and not launcher else None,
                    extra=dict({"CUMEMGUARD_SUMMARY": "1"} if shim else {}, **(extra or {})))
        # The program's own handler calls exit() from a signal: that is what is tested, not ours.
        env["TSAN_OPTIONS"] = env.get("TSAN_OPTIONS", "") + ":report_signal_unsafe=0"
        if from_signal:
            # LeakSanitizer's check at the end of the process locks every region of the runtime's
            # allocator; when the signal interrupted a malloc or free of the program's own (or of
            # any library), the exiting thread holds one of them and waits for itself forever:
            # measured in 2 of 40 churning runs, both stopped in the program's own free(), with
            # or without the shim. Leaks are checked by every other sanitized test.
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_leaks=0"
        cmd = argv
        if launcher:
            cmd = [b.prog("tools", "cumemguard"), "run", "--log", log, "--"] + argv
            env.pop("LD_PRELOAD", None)
            if b.first:
                env["LD_PRELOAD"] = b.first
            env.update(older_shim(b))
        # A session of its own: a run that hangs is killed with every process it started (under
        # `cumemguard run` the program is the launcher's child and holds the stderr pipe).
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             cwd=d, start_new_session=True)
        try:
            _, err = p.communicate(timeout=timeout * scale())
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            return f"run {i}: hung at exit (killed after {timeout * scale():.0f} s)"
        err = err.decode(errors="replace")
        if "exit-alloc:" in err:
            at = err.index("exit-alloc:")
            return f"run {i}: allocated after exit began\n{err[at:at + 3000]}"
        if p.returncode != 0:
            return f"run {i}: exit {p.returncode}\n{err[-2000:]}"
        if not shim:
            return None
        found = logs_in(d)
        if len(found) != 1:
            return f"run {i}: logs {found}"
        recs = read_log(found[0])[0]
        kinds = [r.get("k") for r in recs]
        if kinds[-1] != "end" or kinds.count("summary") != 1 or kinds.count("end") != 1:
            return f"run {i}: the log ends {kinds[-3:]} ({kinds.count('summary')} summaries)"
        if "summary for pid" not in err:
            return f"run {i}: no exit summary on stderr\n{err[-1000:]}"
        logs.append(found[0])
        return None

    with ThreadPoolExecutor(max_workers=4) as ex:
        bad = [r for r in ex.map(one, range(runs)) if r]
    return bad, logs


def case_exit_alloc_check(b, tmp):
    # The exit cases' check counts the shim's allocations only (exit_alloc.h: the innermost frame
    # outside the program, the loader and the shim's own libraries decides; on the H200 libcudart's
    # destructors free after exit began with or without the shim). An armed thread's CUDA calls
    # through the shim allocate in its model: the first allocation aborts, named as the shim's,
    # with the shim's frames on the stack. Without the shim the same calls allocate in the fake's
    # libraries only: they pass, all 512 succeed, and were counted as another library's.
    argv = [b.prog("tests", "reliability", "exit_cases"), "armed-calls"]
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")))
    at = err.find("exit-alloc:")
    expect(rc == -signal.SIGABRT and at >= 0, f"with the shim: exit {rc}, stderr\n{err[-2000:]}")
    head = err[at:].splitlines()
    expect(head[0].startswith("exit-alloc: ") and head[0].endswith(
        "by the shim on a thread that began exit; called from:"), f"first line {head[0]!r}")
    expect(any("libcumemguard.so" in line for line in head[1:]),
           "no frame of the shim in the stack:\n" + "\n".join(head[:30]))
    expect("calls_ok" not in out, f"the calls went on after the shim allocated: {out!r}")
    rc, out, err = b.run(argv, b.env(shim=False))
    got = steps(out)
    expect(rc == 0 and "exit-alloc:" not in err and got.get("calls_ok") == "512"
           and got.get("others") == "1",
           f"without the shim: exit {rc}, {got}, stderr\n{err[-2000:]}")


def case_exit_signal(b, tmp):
    # A SIGTERM handler that calls exit() on a thread interrupted inside the shim (its log's lock
    # is held much of the time: every round writes a finding through). The handler arms the test
    # allocator first: an allocation on that thread after exit began aborts instead of hanging one
    # run in twenty on a lock the interrupted thread holds. Forty runs, sanitized or not.
    bad, _ = exit_runs(b, tmp, "sigterm-exit", 40)
    expect(not bad, "\n".join(bad[:5]))
    # The same program without the shim: it ends the same way, and allocates nothing after exit
    # began either (the test allocator's check holds for the program itself).
    bad, _ = exit_runs(b, tmp, "sigterm-exit", 8, shim=False)
    expect(not bad, "without the shim: " + "\n".join(bad[:5]))


def case_exit_signal_churn(b, tmp):
    # The same while four threads churn heap blocks of 1 to 64 KiB (each malloc and free takes the
    # allocator's lock), linear memory with double frees and VMM cycles; under `cumemguard run`
    # (the debugging profile: stacks, the quarantine holds frees) and under a plain LD_PRELOAD.
    bad, logs = exit_runs(b, tmp, "sigterm-churn", 40, launcher=True)
    expect(not bad, "under cumemguard run: " + "\n".join(bad[:5]))
    # What the quarantine still held at exit stays held (no CUDA call on the exit path) and is
    # counted in the summary; or, when the signal interrupted the exiting thread inside the
    # quarantine's lock, a note says they were not counted.
    # (A run the signal reached before its first free was held has nothing to count.)
    for p in logs:
        recs = read_log(p)[0]
        holds = [r for r in recs if r.get("k") == "call" and
                 r.get("args", {}).get("held") == "quarantine"]
        held = next(r for r in recs if r.get("k") == "summary").get("held_at_exit", {})
        uncounted = [r for r in recs if r.get("k") == "note" and
                     "the held frees stayed locked" in r.get("msg", "")]
        expect(not holds or held.get("quarantine", {}).get("frees", 0) > 0 or len(uncounted) == 1,
               f"{p}: {len(holds)} frees held, none held at exit ({held}) and no note why")
    # Under LD_PRELOAD the double frees are suppressed by a rule: the summary's suppression lines
    # are written at exit too.
    rules = os.path.join(tmp, "rules.supp")
    with open(rules, "w") as f:
        f.write("double-free:*exit_cases*\n")
    bad, logs = exit_runs(b, tmp, "sigterm-churn", 40, extra={"CUMEMGUARD_SUPPRESSIONS": rules})
    expect(not bad, "under LD_PRELOAD: " + "\n".join(bad[:5]))
    for p in logs[:3]:
        summary = next(r for r in read_log(p)[0] if r.get("k") == "summary")
        expect(summary.get("suppressed") and summary["transport"]["suppressed"] is True,
               f"{p}: the summary has no suppressions or transport: {summary}")
    bad, _ = exit_runs(b, tmp, "sigterm-churn", 40, shim=False)
    expect(not bad, "without the shim: " + "\n".join(bad[:5]))


def case_exit_two_threads(b, tmp):
    # Two threads call exit() at once while two others make calls: every log has its summary and
    # `end`, and the report reads it whole. Forty runs as the host does it, twenty more with the
    # test allocator armed on both exiting threads (the second one's wait allocates nothing).
    bad, logs = exit_runs(b, tmp, "exit-two", 40, from_signal=False)
    expect(not bad, "\n".join(bad[:5]))
    bad, _ = exit_runs(b, tmp, "exit-two", 20, args=("armed",), from_signal=False)
    expect(not bad, "armed: " + "\n".join(bad[:5]))
    bad, _ = exit_runs(b, tmp, "exit-two", 8, shim=False, args=("armed",),
                          from_signal=False)
    expect(not bad, "without the shim: " + "\n".join(bad[:5]))
    for log in logs:
        rc, out, err = b.run([b.prog("tools", "cumemguard"), "report", "--no-symbolize", log],
                             b.env(shim=False))
        expect(rc == 0 and "truncated" not in (out + err).lower() and "cudaMalloc" in out,
               f"report of {log}: exit {rc}\n{out[:1500]}{err}")


def case_closed_stdio(b, tmp):
    # The host closes 0, 1 and 2 and opens its own files, which get those numbers (before its first
    # CUDA call or after it); then a finding and a warning. Not a byte of the shim's may land in
    # the host's files; the finding, the warning and the summary still reach the stderr the
    # process started with (under `cumemguard run`: the launcher's).
    argv = [b.prog("tests", "reliability", "exit_cases"), "closed-stdio"]
    plain = os.path.join(tmp, "plain")
    os.mkdir(plain)
    rc, _, err = b.run(argv + ["after", plain], b.env(shim=False))
    expect(rc == 0, f"without the shim: exit {rc}\n{err}")
    with open(os.path.join(plain, "host-out")) as f:
        plain_steps = steps(f.read())
    for when in ("before", "after"):
        for launcher in (False, True):
            d = os.path.join(tmp, f"{when}-{'run' if launcher else 'preload'}")
            os.mkdir(d)
            log = os.path.join(d, "log.%p")
            extra = {"CUMEMGUARD_WARN_LIMIT": "1"}
            if launcher:
                env = b.env(shim=False, extra=dict(extra, **older_shim(b)))
                if b.first:
                    env["LD_PRELOAD"] = b.first
                cmd = [b.prog("tools", "cumemguard"), "run", "--log", log, "--"] + argv
            else:
                env = b.env(log=log, extra=dict(extra, CUMEMGUARD_SUMMARY="1"))
                cmd = argv
            rc, _, err = b.run(cmd + [when, d], env)
            what = f"{when}, {'run' if launcher else 'LD_PRELOAD'}"
            expect(rc == 0, f"{what}: exit {rc}\n{err}")
            files = {}
            for name in ("host-in", "host-out", "host-err"):
                with open(os.path.join(d, name), "rb") as f:
                    files[name] = f.read()
            expect(files["host-in"] == b"", f"{what}: host-in holds {files['host-in'][:200]!r}")
            expect(files["host-err"] == b"the host's own line\n",
                   f"{what}: host-err holds {files['host-err'][:300]!r}")
            got = steps(files["host-out"].decode(errors="replace"))
            expect(b"cumemguard" not in files["host-out"] and
                   {k: got.get(k) for k in ("malloc", "free", "own_line")} ==
                   {k: plain_steps.get(k) for k in ("malloc", "free", "own_line")},
                   f"{what}: host-out {files['host-out'][:300]!r}, without the shim {plain_steps}")
            lines = stderr_lines(err)
            expect(any("double-free in cudaFree" in l for l in lines) and
                   any("further findings go only to the log" in l for l in lines) and
                   "summary for pid" in err, f"{what}: stderr:\n{err[-3000:]}")
            (log_path,) = [p for p in logs_in(d)]
            recs = read_log(log_path)[0]
            expect(recs[-1].get("k") == "end", f"{what}: {log_path} does not end with `end`")


def case_no_driver(b, tmp):
    # The real CUDA runtime without a driver (the toolkit's lib directory on the library path, the
    # fake stack not): every call returns 35. The summary says so once, with the likely cause and
    # the fake stack's path, claims nothing about a device, and the status is the program's.
    libdir = os.environ.get("CMG_CUDA_LIBDIR", "")
    expect(os.path.exists(os.path.join(libdir, "libcudart.so.13")),
           f"no real CUDA runtime in CMG_CUDA_LIBDIR={libdir!r}")
    argv = [b.prog("tests", "integration", "suppress_cases"), "double"]

    def env_without_fake(**extra):
        env = b.env(shim=False, extra=dict(extra, **older_shim(b)))
        env["LD_LIBRARY_PATH"] = libdir
        if b.first:
            env["LD_PRELOAD"] = b.first
        return env

    rc0, out0, err0 = b.run(argv, env_without_fake())
    expect(steps(out0) == {"malloc": "35", "own_free": "35", "vendor_free": "35"},
           f"without the shim: exit {rc0}\n{out0}{err0}")
    log = os.path.join(tmp, "log.%p")
    rc, out, err = b.run([b.prog("tools", "cumemguard"), "run", "--log", log, "--"] + argv,
                         env_without_fake())
    expect(rc == rc0 and out == out0, f"under the shim: exit {rc} (without: {rc0})\n{out}{err}")
    fake = os.path.join(b.root, "tests", "fakecuda")
    line = [l for l in err.splitlines() if l.startswith("  cuda: ")]
    want = ("  cuda: every call failed (3 calls) with 35 (cudaErrorInsufficientDriver): the runtime "
            "found no CUDA driver (libcuda.so.1 is not on the library path), or one older than "
            "itself; on a machine without a GPU, run with the fake CUDA stack of this build: "
            f"LD_LIBRARY_PATH={fake}")
    expect(line == [want], f"the summary's line: {line}\n   expected {[want]}\n{err}")
    expect("device's memory" not in err and "  quarantine: auto, never sized (nothing was held)\n"
           in err, f"the summary speaks of a device:\n{err}")
    (log_path,) = logs_in(tmp)
    summary = next(r for r in read_log(log_path)[0] if r.get("k") == "summary")
    got = summary.get("every_call_failed", {})
    expect({k: got.get(k) for k in ("calls", "res", "name", "fake_cuda")} ==
           {"calls": 3, "res": 35, "name": "cudaErrorInsufficientDriver", "fake_cuda": fake},
           f"the summary record: {got}")
    # One call that worked: no such line (the fake stack answers every call).
    rc, out, err = b.run([b.prog("tools", "cumemguard"), "run", "--no-log", "--"] + argv,
                         dict(b.env(shim=False), **({"LD_PRELOAD": b.first} if b.first else {})))
    expect(rc == 0 and "  cuda: " not in err and "every call failed" not in err,
           f"with the fake stack: exit {rc}\n{err}")


def case_cuda_error(b, tmp):
    argv = [b.prog("tests", "reliability", "life_cases"), "errors"]
    env = b.env(log=os.path.join(tmp, "log.%p"),
                extra={"FAKECUDA_FAIL": "cuMemAlloc:2+:OOM,cuMemFree:1:700",
                       "CUMEMGUARD_STACKS": "4"})
    rc, out, err = b.run(argv, env)
    s = steps(out)
    want = {"alloc1": "0", "alloc2": "2", "alloc3": "2", "free1": "700", "free2": "0",
            "rt_free": "1"}
    expect(rc == 0 and {k: s.get(k) for k in want} == want, f"errors: exit {rc}, {s}\n{err}")
    (log,) = logs_in(tmp)
    recs = read_log(log)[0]
    errs = [r for r in recs if r.get("k") == "cuda_error"]
    got = [(r["api"], r["res"], r.get("name"), r["sticky"]) for r in errs]
    expect(got == [("cuMemAlloc_v2", 2, "CUDA_ERROR_OUT_OF_MEMORY", False),
                   ("cuMemFree_v2", 700, "CUDA_ERROR_ILLEGAL_ADDRESS", True),
                   ("cudaFree", 1, "cudaErrorInvalidValue", False)],
           f"cuda_error records: {got}")
    calls = {r["seq"]: r for r in recs if r.get("k") == "call"}
    stacks = {r["id"] for r in recs if r.get("k") == "stack"}
    for e in errs:
        c = calls.get(e["seq"])
        expect(c and c["api"] == e["api"] and c["res"] == e["res"] and c["tid"] == e["tid"],
               f"{e}: not the seq of its call ({c})")
        expect(e.get("stack") in stacks and e["stack"] == c.get("stack"), f"{e}: no stack")
        expect(recs.index(e) < recs.index(c), f"{e}: written after its call's record")


def case_oom_host(b, tmp):
    # Issue: a host that exhausted its memory and handles malloc returning NULL was aborted with
    # SIGABRT from cudaMalloc (std::bad_alloc left the hook). Every call must answer what it
    # answers without the shim, the shim must say so once, and every later call is forwarded.
    argv = [b.prog("tests", "reliability", "oom_host")]
    rc0, out0, err0 = b.run(argv, b.env(shim=False))
    expect(rc0 == 0, f"without the shim: exit {rc0}\n{err0}")
    base = steps(out0)
    expect(base.get("shim_allocations_refused") == "0", f"without the shim: {base}")
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")))
    expect(rc == 0, f"with the shim: exit {rc}\n{err[-3000:]}")
    got = steps(out)
    refused = int(got.pop("shim_allocations_refused", "0"))
    base.pop("shim_allocations_refused")
    expect(refused > 0, "no allocation of the shim's was refused: the test did not test")
    expect(got == base, f"statuses {got}\n    without the shim {base}")
    want = {"malloc_failures": "0", "free_failures": "0", "double_free": "1", "cuMemAlloc": "0",
            "release_again": "1", "addrfree": "0"}
    expect({k: base.get(k) for k in want} == want, f"the program's own results {base}")
    said = [l for l in stderr_lines(err) if "inside the shim failed" in l]
    expect(len(said) == 1 and "the call went to the driver unchanged" in said[0],
           f"not said exactly once: {stderr_lines(err)}")
    (log,) = logs_in(tmp)
    recs = read_log(log)[0]
    expect(recs[-1].get("k") == "end", "the log does not end with `end`")
    # After the failure the shim answers nothing itself: the double free reached the driver.
    skipped = [r for r in recs if r.get("k") == "call" and r.get("skipped")]
    expect(not skipped, f"calls answered without the driver after the failure: {skipped[:3]}")


def case_env_race(b, tmp):
    # The legacy-IPC diagnosis of VMM memory reads PyTorch's allocator setting while another thread
    # sets variables: every export must be refused as without the shim (section 2), each with its
    # finding, and nothing read from an array setenv freed (AddressSanitizer says so).
    argv = [b.prog("tests", "reliability", "env_race")]
    rc0, out0, err0 = b.run(argv, b.env(shim=False))
    expect(rc0 == 0, f"without the shim: exit {rc0}\n{err0}")
    rc, out, err = b.run(argv, b.env(log=os.path.join(tmp, "log.%p")), timeout=120)
    expect(rc == 0, f"with the shim: exit {rc}\n{err[-3000:]}")
    expect(steps(out) == steps(out0) == {"exports": "3000", "refused": "3000"},
           f"with the shim {steps(out)}, without {steps(out0)}")
    (log,) = logs_in(tmp)
    recs = read_log(log)[0]
    ipc = [r for r in recs if r.get("k") == "finding" and r.get("class") == "ipc-vmm"]
    expect(len(ipc) == 3000, f"{len(ipc)} ipc-vmm findings, expected 3000")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    b = Build(a.build)
    tmp = tempfile.mkdtemp(prefix=f"cmg-edges-{a.case}-")
    cases = {
        "fd-reuse": case_fd_reuse,
        "fork-stall": case_fork_stall,
        "flood": case_flood,
        "uid-change": case_uid_change,
        "exit-alloc-check": case_exit_alloc_check,
        "exit-signal": case_exit_signal,
        "exit-signal-churn": case_exit_signal_churn,
        "exit-two-threads": case_exit_two_threads,
        "closed-stdio": case_closed_stdio,
        "no-driver": case_no_driver,
        "cuda-error": case_cuda_error,
        "oom-host": case_oom_host,
        "env-race": case_env_race,
    }
    return run_case(a.case, lambda: cases[a.case](b, tmp), tmp)


if __name__ == "__main__":
    sys.exit(main())
