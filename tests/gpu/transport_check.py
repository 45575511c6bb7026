#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Checks one run of tests/gpu/transport.sh: the workload's own numbers (RESULT line) against the
# shim's log. Prints what it found and "ok"/"FAIL ..." per check; exits 1 when one failed.
#   transport_check.py BUILD_DIR RUN_DIR MODE
import glob
import json
import re
import os
import statistics
import subprocess
import sys

MS = 1_000_000


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    build, d, mode = sys.argv[1:4]
    problems = []

    def expect(cond, msg):
        print(("ok   " if cond else "FAIL ") + msg)
        if not cond:
            problems.append(msg)

    text = open(os.path.join(d, "run.txt")).read()
    result = None
    for line in text.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    expect(result is not None and "exit 0" in text, f"{mode}: the workload ran and exited 0")
    if result is None:
        print(text[-3000:])
        return 1
    expect(result["keep_intact"], f"{mode}: data written before the loop is intact")
    expect(result["w_max_err"] < 1e-9, f"{mode}: trained weights equal the CPU reference "
           f"(max error {result['w_max_err']:.3g})")
    med = statistics.median(result["flush_ms"])
    print(f"     {mode}: empty_cache per iteration (ms): {result['flush_ms']} median {med:.1f}")

    logs = glob.glob(os.path.join(d, "log.*"))
    recs, main_log = [], None
    for p in logs:
        r = load(p)
        if r and r[0].get("argv", [""])[-1] == mode:  # the workload's process, not a helper
            recs, main_log = r, p
    expect(bool(recs), f"{mode}: the workload's log is there ({len(logs)} logs)")
    if not recs:
        return 1
    findings = [r for r in recs if r.get("k") == "finding"]
    flushes = [f for f in findings if f["class"] == "opportunistic-flush"]
    others = sorted({f["class"] for f in findings} - {"opportunistic-flush"})
    calls = [r for r in recs if r.get("k") == "call"]
    nccl = [r for r in recs if r.get("k") == "nccl"]
    summary = next((r for r in recs if r.get("k") == "summary"), {})
    transport = summary.get("transport", {})
    init = next((r for r in nccl if r["event"] == "init"), None)
    expect(init is not None and init.get("suppressed") is True,
           f"{mode}: the NCCL init turned suppression on ({init})")
    expect(not others, f"{mode}: no finding of another class ({others})")
    for s in transport.get("sites", []):
        print(f"     site: {s['count']} x, {s['bytes']} bytes, blocked {s['blocked_ns'] / MS:.1f} ms, "
              f"deferred {s['deferred']}: {s['site']}")
    blocked = [f.get("blocked_ns", 0) for f in flushes]
    # The loop's own empty_cache is called from Python: its site names that Python function and
    # file (transport_workload.py), not a native frame of the interpreter.
    loop_sites = [s["site"] for s in transport.get("sites", []) if s["count"] >= result["iters"]]
    if mode in ("native", "defer"):
        expect(loop_sites and all(re.search(r" <- \w+ \(.*transport_workload\.py:\d+\)$", x)
                                  for x in loop_sites),
               f"{mode}: the loop's flush site names its Python caller ({loop_sites})")
    if mode == "native":
        expect(med >= 80, f"{mode}: the flush blocks while the device is busy (median {med:.1f} ms)")
        expect(len(flushes) >= result["iters"] and all(f["action"] == "forward" for f in flushes),
               f"{mode}: one finding or more per flush, forwarded ({len(flushes)})")
        expect(all("emptyCache" in f["state"]["flush_frame"] for f in flushes),
               f"{mode}: the flush frame is PyTorch's emptyCache "
               f"({sorted({f['state']['flush_frame'] for f in flushes})})")
        total_flush_ns = sum(result["flush_ms"]) * MS
        expect(sum(blocked) >= 0.5 * total_flush_ns and sum(blocked) <= 1.2 * total_flush_ns + 50 * MS,
               f"{mode}: blocked_ns of the findings ({sum(blocked) / MS:.0f} ms) accounts for the "
               f"flushes' time ({total_flush_ns / MS:.0f} ms)")
        rep = subprocess.run([os.path.join(build, "tools", "cumemguard"), "report", main_log],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with open(os.path.join(d, "report.txt"), "w") as f:
            f.write(rep.stdout)
        expect("opportunistic-flush" in rep.stdout and "emptyCache" in rep.stdout,
               f"{mode}: cumemguard report names the flush (report.txt)")
    if mode == "defer":
        deferred = [c for c in calls if c.get("deferred")]
        released = [c for c in calls if c.get("released_from") == "deferred"]
        expect(med < 30, f"{mode}: the flush no longer blocks (median {med:.1f} ms)")
        expect(len(flushes) >= result["iters"] and all(f["action"] == "defer" for f in flushes),
               f"{mode}: flushes held back ({len(flushes)} findings, {len(deferred)} held frees)")
        expect(result.get("big_ok") is True and result["big_bytes"] > result["free_before_big"],
               f"{mode}: an allocation of {result['big_bytes']} bytes (driver had "
               f"{result['free_before_big']} free) succeeded")
        big = [c for c in calls if c["api"] in ("cudaMalloc", "cuMemAlloc_v2") and
               c["args"].get("size", 0) >= result["big_bytes"]]
        expect(any(c["res"] == 0 and c["args"].get("retried_after_release") == 1 for c in big),
               f"{mode}: it was retried after the held frees were released ({big[:2]})")
        # Every held free went to the driver while the program ran, or is counted as held at exit
        # (the exit path makes no CUDA call: those go back with the process).
        at_exit = summary.get("held_at_exit", {}).get("deferred", {}).get("frees", 0)
        expect(len(released) + at_exit == len(deferred) and all(c["res"] == 0 for c in released),
               f"{mode}: every held free went to the driver or is held at exit ({len(released)} "
               f"released, {at_exit} held at exit, of {len(deferred)})")
    if mode == "ctypes":
        maybe = [c for c in calls if c["api"] == "cumemguard_maybe_empty_cache"]
        expect(result.get("before_ran") is True and result["ran"] == [False] * result["iters"],
               f"{mode}: the flush ran before NCCL and was declined after ({result['ran']})")
        expect([c["res"] for c in maybe] == [1] + [0] * result["iters"],
               f"{mode}: the log has the C API calls ({[c['res'] for c in maybe]})")
        expect(med < 30, f"{mode}: a declined flush does not block (median {med:.1f} ms)")
        expect(not flushes, f"{mode}: no opportunistic flush reached the driver ({len(flushes)})")
    if mode == "expandable":
        # docs/transport.md: PyTorch synchronizes the segment's stream before cuMemUnmap, which
        # itself does not wait; the shim sees no synchronizing free to report.
        expect(med >= 80, f"{mode}: empty_cache still blocks in PyTorch (median {med:.1f} ms)")
        expect(not flushes, f"{mode}: no finding: unmaps are not classified ({len(flushes)})")
        expect(any(c["api"] == "cuMemUnmap" for c in calls), f"{mode}: the unmaps were seen")
    if mode == "async":
        # cudaDeviceSynchronize() before cudaMemPoolTrimTo is PyTorch's; the trim itself is quick.
        trims = [f for f in flushes if f["api"] in ("cudaMemPoolTrimTo", "cuMemPoolTrimTo")]
        expect(med >= 80, f"{mode}: empty_cache still blocks in PyTorch (median {med:.1f} ms)")
        expect(len(trims) >= result["iters"] and
               all("CudaMallocAsyncAllocator::emptyCache" in f["state"]["flush_frame"] for f in trims),
               f"{mode}: each trim is an opportunistic flush ({len(trims)})")
        expect(max((f.get("blocked_ns", 0) for f in trims), default=0) < 20 * MS,
               f"{mode}: the trims themselves do not wait for the device")
    print(f"{mode}: {'ok' if not problems else 'FAIL (' + str(len(problems)) + ')'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
