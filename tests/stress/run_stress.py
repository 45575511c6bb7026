#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs tests/stress/stress.cpp under the shim for a range of seeds, with random driver faults chosen
# by the seed, and checks the invariants of docs/reliability.md after every run:
#   * the process exited 0 within its time limit (the shim never crashed or hung the host);
#   * every status the caller got is the one the fake driver answered for that call on that thread,
#     except the documented guard-mode skips, which the log must account for one by one;
#   * the shim's model at exit (summary + leak records) equals the fake driver's own state;
#   * no descriptor and no thread was left behind;
#   * the event log is whole JSON lines and ends with its `end` record.
# A failing seed prints the command that reproduces it.
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# Errors the fake driver injects, by the kind of call (README: OUT_OF_MEMORY, INVALID_VALUE,
# NOT_PERMITTED). Frees, unmaps and releases that fail must leave the model as it was.
FAULT_APIS = [
    "cuMemAlloc:OOM", "cuMemFree:INVALID_VALUE", "cuMemHostAlloc:OOM", "cuMemAllocHost:OOM",
    "cuMemFreeHost:INVALID_VALUE", "cuMemAllocAsync:OOM", "cuMemFreeAsync:INVALID_VALUE",
    "cuMemCreate:OOM", "cuMemAddressReserve:OOM", "cuMemMap:INVALID_VALUE",
    "cuMemSetAccess:NOT_PERMITTED", "cuMemUnmap:INVALID_VALUE", "cuMemRelease:NOT_PERMITTED",
    "cuMemAddressFree:INVALID_VALUE", "cuMemRetainAllocationHandle:INVALID_VALUE",
    "cuMemExportToShareableHandle:NOT_PERMITTED", "cuMemImportFromShareableHandle:INVALID_VALUE",
    "cuIpcGetMemHandle:NOT_PERMITTED", "cuMemPoolTrimTo:INVALID_VALUE",
]
SKIP_CLASSES = {"double-release", "stale-release", "unmap-unmapped", "double-free"}


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def plan(seed, mode_arg):
    """Everything a seed decides: faults, shim options, threads, misuse. Deterministic."""
    rates = ["0", "0.02", "0.05", "0.1", "0.25"]
    env = {}
    rate = rates[seed % len(rates)]
    if rate != "0":
        # A different subset of the fault list for each seed (always at least three APIs).
        apis = [a for i, a in enumerate(FAULT_APIS) if (seed >> (i % 16)) & 1 or i % 7 == seed % 7]
        env.update({"FAKECUDA_FAIL_SEED": str(seed), "FAKECUDA_FAIL_RATE": rate,
                    "FAKECUDA_FAIL_APIS": ",".join(apis)})
    mode = mode_arg or ("report" if seed % 6 == 5 else "guard")
    env["CUMEMGUARD_MODE"] = mode
    if seed % 3 == 0:
        env["CUMEMGUARD_STACKS"] = "8"
    if seed % 4 == 1:
        env["FAKECUDA_HANDLE_REUSE"] = "0"
    # Every fourth seed is single-threaded: there the program also makes stale releases and frees
    # (stress.cpp explains why those stay on one thread).
    threads = 1 if seed % 4 == 3 else 8
    misuse = seed % 2 == 1 or seed % 4 == 0
    return env, mode, threads, misuse


def parse_out(text):
    vals, leaks, mism = {}, [], []
    for line in text.splitlines():
        parts = line.split(None, 1)
        if not parts:
            continue
        if parts[0] == "fd_leak":
            leaks.append(parts[1] if len(parts) > 1 else "")
        elif parts[0] == "mismatch":
            mism.append(line)
        elif len(parts) == 2:
            vals[parts[0]] = parts[1]
    return vals, leaks, mism


def read_log(path):
    recs = []
    with open(path, "rb") as f:
        data = f.read()
    expect(data.endswith(b"\n"), f"{path}: the log does not end with a whole line")
    for n, line in enumerate(data.split(b"\n")[:-1], 1):
        try:
            recs.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise Failure(f"{path}:{n}: not JSON ({e}): {line[:200]!r}")
    return recs


def check_run(seed, mode, vals, leaks, mism, recs, with_shim):
    num = lambda k: int(vals[k])
    expect(not mism, f"statuses changed:\n  " + "\n  ".join(mism[:20]))
    expect(num("mismatches") == 0, "mismatches reported")
    expect(not leaks and num("fds_leaked") == 0, f"descriptors left behind: {leaks}")
    t0, t1 = (int(x) for x in vals["threads"].split())
    expect(t0 == t1, f"threads before {t0}, after {t1}")
    if not with_shim:
        expect(num("skipped") == 0, "calls answered without the driver, without the shim")
        return
    expect(recs and recs[0].get("cumemguard_log") == 1, "no log header")
    expect(recs[-1].get("k") == "end", f"log does not end with `end`: {recs[-1]}")
    calls = [r for r in recs if r.get("k") == "call"]
    findings = [r for r in recs if r.get("k") == "finding"]
    summary = next((r for r in recs if r.get("k") == "summary"), None)
    expect(summary is not None, "no summary record")
    # Skips: the program saw exactly the calls the log marks skipped, each with its finding.
    skipped = [c for c in calls if c.get("skipped")]
    skip_findings = [f for f in findings if f.get("action") == "skip"]
    expect(len(skipped) == num("skipped"),
           f"program saw {num('skipped')} calls answered without the driver, log marks {len(skipped)}")
    expect(len(skip_findings) == len(skipped),
           f"{len(skipped)} skipped calls but {len(skip_findings)} skip findings")
    expect(all(f["class"] in SKIP_CLASSES for f in skip_findings),
           f"skip of a class guard never skips: {sorted({f['class'] for f in skip_findings})}")
    if mode == "report":
        expect(not skipped, f"report mode skipped {len(skipped)} calls")
    # Every call the program made was recorded, and the log's status is the caller's status.
    expect(all(c.get("res") == 0 for c in skipped), "a skipped call with an error status")
    # The model at exit equals the fake driver's own state.
    live = summary["live"]
    linear_live = sum(live.get(k, 0) for k in ("linear", "async", "managed"))
    leak = [r for r in recs if r.get("k") == "leak"]
    lsum = lambda whats: sum(r.get("size", 0) for r in leak if r.get("what") in whats)
    pairs = [
        ("linear allocations", linear_live, num("fake.linear_allocs")),
        ("linear bytes", lsum({"linear", "async", "managed"}), num("fake.linear_bytes")),
        ("host allocations", live.get("host", 0), num("fake.host_allocs")),
        ("host bytes", lsum({"host"}), num("fake.host_bytes")),
        ("physical allocations", live.get("vmm", 0), num("fake.phys_allocs")),
        ("physical bytes", lsum({"vmm"}), num("fake.phys_bytes")),
        ("live handle values", live.get("handles", 0), num("fake.handle_values")),
        ("reservations", live.get("va", 0), num("fake.reservations")),
        ("reserved bytes", lsum({"va"}), num("fake.reserved_bytes")),
        ("mappings", sum(r.get("mappings", 0) for r in leak if r.get("what") == "vmm"),
         num("fake.mappings")),
    ]
    bad = [f"{what}: shim {s}, driver {d}" for what, s, d in pairs if s != d]
    expect(not bad, "model differs from the driver at exit:\n  " + "\n  ".join(bad))
    # The per-API call counts in the summary agree with the call records.
    counted = sum(summary["calls"].values())
    expect(counted >= num("calls"), f"summary counts {counted} calls, the program made {num('calls')}")


def run_one(build, prog, seed, ops, timeout, mode_arg, plain, keep):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("CUMEMGUARD_", "FAKECUDA_", "LD_PRELOAD")):
            del env[k]
    env["MALLOC_PERTURB_"] = "0"
    fake = os.path.join(build, "tests", "fakecuda")
    env["LD_LIBRARY_PATH"] = fake + (":" + os.environ["LD_LIBRARY_PATH"]
                                     if os.environ.get("LD_LIBRARY_PATH") else "")
    extra, mode, threads, misuse = plan(seed, mode_arg)
    env.update(extra)
    argv = [prog, str(seed), str(ops), str(threads)] + (["misuse"] if misuse else [])
    shim = os.path.join(build, "shim", "libcumemguard.so")
    runs = [False, True] if plain else [True]
    stats = {}
    for with_shim in runs:
        renv = dict(env)
        tmp = tempfile.mkdtemp(prefix=f"cmg-stress-{seed}-")
        if with_shim:
            # A sanitized build needs its runtime loaded before anything else (tools/dev sanitize).
            first = os.environ.get("CMG_PRELOAD_FIRST", "")
            renv["LD_PRELOAD"] = ":".join(p for p in (first, shim) if p)
            renv["CUMEMGUARD_LOG"] = os.path.join(tmp, "log.%p")
        else:
            for k in [k for k in renv if k.startswith("CUMEMGUARD_")]:
                del renv[k]
        repro = " ".join(f"{k}={v}" for k, v in sorted(renv.items())
                         if k.startswith(("CUMEMGUARD_", "FAKECUDA_", "LD_PRELOAD", "LD_LIBRARY"))) \
            + " " + " ".join(argv)
        label = f"seed {seed} ({'shim, ' + mode if with_shim else 'no shim'}, {threads} threads" \
                f"{', misuse' if misuse else ''}, faults {extra.get('FAKECUDA_FAIL_RATE', '0')})"
        try:
            try:
                p = subprocess.run(argv, env=renv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                raise Failure(f"no exit within {timeout} s: the process hung")
            expect(p.returncode == 0, f"exit status {p.returncode}\n{p.stderr[-3000:]}")
            vals, leaks, mism = parse_out(p.stdout)
            expect("fds_leaked" in vals, f"incomplete output\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            recs = None
            if with_shim:
                logs = [os.path.join(tmp, f) for f in os.listdir(tmp)]
                expect(len(logs) == 1, f"expected one log, found {logs}")
                recs = read_log(logs[0])
            check_run(seed, mode, vals, leaks, mism, recs, with_shim)
            if with_shim:
                stats = {k: int(vals[k]) for k in ("calls", "errors", "injected_total", "skipped")}
        except Failure as e:
            print(f"FAIL {label}: {e}\n  reproduce: {repro}")
            if keep:
                print(f"  kept: {tmp}")
            return None
        finally:
            if not keep:
                shutil.rmtree(tmp, ignore_errors=True)
    return stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--seeds", default="1:50", help="first:last seed, inclusive")
    ap.add_argument("--ops", type=int, default=60, help="operations per thread")
    ap.add_argument("--mode", choices=["guard", "report", "strict"], help="force one mode")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per run")
    ap.add_argument("--plain-every", type=int, default=10,
                    help="also run every Nth seed without the shim (0: never)")
    ap.add_argument("--keep", action="store_true", help="keep the logs of failing seeds")
    a = ap.parse_args()
    a.timeout = int(a.timeout * float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1")))
    build = os.path.abspath(a.build)
    prog = os.path.join(build, "tests", "stress", "stress")
    first, last = (int(x) for x in a.seeds.split(":"))
    totals = {"calls": 0, "errors": 0, "injected_total": 0, "skipped": 0}
    failed = []
    t0 = time.monotonic()
    for seed in range(first, last + 1):
        plain = a.plain_every > 0 and seed % a.plain_every == 0
        st = run_one(build, prog, seed, a.ops, a.timeout, a.mode, plain, a.keep)
        if st is None:
            failed.append(seed)
            continue
        for k in totals:
            totals[k] += st[k]
    n = last - first + 1
    print(f"seeds {first}..{last}: {n - len(failed)} of {n} passed in {time.monotonic() - t0:.1f} s; "
          f"calls {totals['calls']}, driver errors {totals['errors']} "
          f"(injected {totals['injected_total']}), guard skips {totals['skipped']}")
    if failed:
        print(f"failing seeds: {failed}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
