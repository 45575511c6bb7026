#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# What is still resident (tests/programs/resident_cases.cpp): each case runs without the shim and
# with it on the fake CUDA stack; the program's own answers must be the same, and the log must hold
# the findings, snapshots and rows the case is about. `cumemguard report --json` must show them.
#
#   check_resident.py --build DIR CASE
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

MIB = 1 << 20
FORK_LEVELS = 32  # resident_cases.cpp fork_at_start
G = 2 * MIB  # the fake's granularity (real-driver.md D19)


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def run(cmd, env, timeout=120):
    timeout *= float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def steps_of(text):
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out.setdefault(parts[0], []).append(parts[1].strip())
    return out


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def snapshots(recs):
    """Snapshot records by id: the first part's fields, every part's rows, and the end's."""
    out = {}
    for r in recs:
        if r.get("k") != "snapshot":
            continue
        s = out.setdefault(r["id"], {"rows": [], "parts": 0})
        expect(r["part"] == s["parts"], f"snapshot {r['id']}: part {r['part']} after {s['parts']}")
        s["parts"] += 1
        if r["part"] == 0:
            s.update({k: v for k, v in r.items() if k not in ("rows", "part")})
        s["rows"] += r["rows"]
        if r.get("end"):
            s["end"] = r
    for i, s in out.items():
        expect("end" in s, f"snapshot {i} has no end part")
        expect(s["end"]["objects"] == sum(row[5] for row in s["rows"]),
               f"snapshot {i}: objects {s['end']['objects']} != rows' count")
    return [out[i] for i in sorted(out)]


def total(snap, kind=None, state=None, dev=None):
    return sum(r[6] for r in snap["rows"] if (kind is None or r[1] == kind) and
               (state is None or r[2] == state) and (dev is None or r[0] == dev))


def findings(recs):
    return sorted(r["class"] for r in recs if r.get("k") == "finding")


def report_json(build, log):
    exe = os.path.join(build, "tools", "cumemguard")
    rc, out, err = run([exe, "report", "--json", log], dict(os.environ))
    expect(rc in (0, 1), f"report --json: exit {rc}\n{err}")
    return json.loads(out)


# case -> (program arguments, environment for both runs, environment of the shim run)
CASES = {
    "graph-pool": (["graph-pool"], {}, {}),
    "graph-pool-fixed": (["graph-pool-fixed"], {}, {}),
    "wake-fail": (["wake-fail"], {}, {}),
    "wake-fail-fixed": (["wake-fail-fixed"], {}, {}),
    "busy-device-query": (["busy-device"], {"FAKECUDA_DEVICES": "2"},
                          {"CUMEMGUARD_BUSY_CHECK": "query"}),
    "busy-device-sync": (["busy-device"], {"FAKECUDA_DEVICES": "2"},
                         {"CUMEMGUARD_BUSY_CHECK": "sync"}),
    "busy-device-fixed": (["busy-device-fixed"], {"FAKECUDA_DEVICES": "2"},
                          {"CUMEMGUARD_BUSY_CHECK": "sync"}),
    "stray-device": (["stray-device"], {"FAKECUDA_DEVICES": "2", "RANK": "0"}, {}),
    "stray-device-fixed": (["stray-device-fixed"], {"FAKECUDA_DEVICES": "2", "RANK": "0"}, {}),
    "stray-comm": (["stray-comm"], {"FAKECUDA_DEVICES": "2"}, {}),
    "snapshot-api": (["snapshot-api"], {}, {}),
    "snapshot-signal": (["snapshot-signal", "@LOG@"], {}, {"CUMEMGUARD_SNAPSHOT_SIGNAL": "usr2"}),
    "snapshot-signal-off": (["snapshot-signal", "@LOG@"], {}, {}),
    "snapshot-limit": (["wake-fail-fixed"], {}, {"CUMEMGUARD_SNAPSHOTS": "1"}),
    "graph-owned": (["graph-owned"], {}, {}),
    "snapshot-fork": (["snapshot-fork", "@LOG@"], {}, {"CUMEMGUARD_SNAPSHOT_SIGNAL": "usr2"}),
    "fork-at-start": (["fork-at-start"], {}, {"CUMEMGUARD_SNAPSHOT_SIGNAL": "usr2"}),
    "nccl-destroy": (["nccl-destroy"], {}, {}),
    "nccl-suspend": (["nccl-suspend"], {}, {}),
    "nccl-suspend-fixed": (["nccl-suspend-fixed"], {}, {}),
}


def check(name, build, recs, log, plain, shim):
    found = findings(recs)
    snaps = snapshots(recs)
    by_label = {}
    for s in snaps:
        by_label.setdefault(s["label"], []).append(s)
    # The program's answers are the same with the shim, but for what only the shim answers.
    own = {"snapshot-api": {"snapshot_before", "snapshot_after"},
           "snapshot-signal": {"usr2_handled", "snapshot_seen"},
           "graph-owned": {"snapshot"},
           "snapshot-fork": {"usr2_handled", "child_snapshot_seen", "parent_snapshot_seen"},
           "fork-at-start": {f"level{k}_threads" for k in range(FORK_LEVELS)},
           }.get(name, set())
    for k in set(plain) | set(shim):
        if k not in own:
            expect(plain.get(k) == shim.get(k),
                   f"{k}: {plain.get(k)} without the shim, {shim.get(k)} with it")

    if name in ("graph-pool", "graph-pool-fixed"):
        expect(found == [], f"findings {found}")
        sleep = by_label["sleep"][0]
        expect(sleep["trigger"] == "sleep", f"trigger {sleep['trigger']}")
        blocks = 4 if name == "graph-pool" else 6
        expect(sleep["run"]["ranges"] == blocks and sleep["run"]["bytes"] == blocks * 2 * G,
               f"run {sleep['run']}")
        expect(total(sleep, "vmm", "asleep") == blocks * 2 * G, f"asleep rows {sleep['rows']}")
        expect(total(sleep, "vmm", "mapped") == 0, f"mapped rows {sleep['rows']}")
        resident_linear = total(sleep, "linear", "live", 0)
        if name == "graph-pool":
            expect(resident_linear == 2 * 2 * G, f"graph segments resident {resident_linear}")
            rep = report_json(build, log)
            res = rep["resident"]["snapshots"]
            s = next(x for x in res if x["label"] == "sleep")
            awake = s["not_asleep"]
            expect(awake["bytes"] == 2 * 2 * G, f"not_asleep {awake}")
            site = awake["sites"][0]
            expect(site["bytes"] == 2 * 2 * G and site["kind"] == "linear",
                   f"not_asleep site {site}")
            names = [f.get("function", "") for f in site["stack"]["frames"]]
            expect(any("graph_pool_segment" in n for n in names), f"site stack {names}")
            expect(site["creator"].endswith("resident_cases"), f"creator {site['creator']}")
        else:
            expect(resident_linear == 0, f"linear resident while asleep {resident_linear}")
            rep = report_json(build, log)
            s = next(x for x in rep["resident"]["snapshots"] if x["label"] == "sleep")
            expect(s["not_asleep"]["bytes"] == 0, f"not_asleep {s['not_asleep']}")
        wake = by_label["wake-up"][0]
        expect(wake["trigger"] == "wake-up" and not wake["run"].get("failed"), f"wake {wake}")
        expect(total(wake, "vmm", "mapped") == blocks * 2 * G, f"woken rows {wake['rows']}")

    elif name == "wake-fail":
        expect(shim.get("wake_up") == ["CUDA_ERROR_OUT_OF_MEMORY"], f"wake_up {shim}")
        expect(found == ["failed-wake", "free-mapped-va", "free-mapped-va", "stayed-mapped"],
               f"findings {found}")
        fw = next(r for r in recs if r.get("class") == "failed-wake")
        st = fw["state"]
        expect(st["failed_api"] == "cuMemCreate" and st["failed_res"] == 2, f"state {st}")
        expect(st["left_count"] == 2 and all(x["bytes"] == 2 * G for x in st["left"]),
               f"left {st['left']}")
        expect(fw["bytes"] == 2 * 2 * G, f"bytes {fw.get('bytes')}")
        rel = {x["what"]: x for x in fw["related"]}
        expect(rel["failed call"]["api"] == "cuMemCreate" and "stack" in rel["failed call"],
               f"related {fw['related']}")
        expect("CUDA_ERROR_OUT_OF_MEMORY" in fw["msg"], fw["msg"])
        sm = next(r for r in recs if r.get("class") == "stayed-mapped")
        expect(sm["state"]["stayed_count"] == 2 and sm["bytes"] == 2 * 2 * G, f"stayed {sm}")
        expect(sm["state"]["asleep_ranges"] == 1, f"stayed {sm['state']}")
        # The failed wake-up's snapshot, then the second sleep's: the 4 MiB still mapped.
        failed = by_label["wake-up (failed)"][0]
        expect(failed["run"]["failed"] is True, f"failed wake {failed['run']}")
        expect(total(failed, "vmm", "mapped") == 2 * 2 * G, f"failed wake rows {failed['rows']}")
        second = by_label["sleep"][1]
        expect(total(second, "vmm", "mapped") == 2 * 2 * G, f"second sleep {second['rows']}")
        rep = report_json(build, log)
        classes = {c["class"] for c in rep["findings"]["classes"]}
        expect({"failed-wake", "stayed-mapped"} <= classes, f"report classes {classes}")

    elif name == "wake-fail-fixed":
        expect(found == [], f"findings {found}")
        failed = by_label["wake-up (failed)"][0]
        expect(total(failed, "vmm", "mapped") == 0, f"rolled back, rows {failed['rows']}")
        expect(len(by_label["sleep"]) == 2, f"sleeps {[s['label'] for s in snaps]}")

    elif name in ("busy-device-query", "busy-device-sync"):
        expect(shim["device1_after_unmap"] == ["CUDA_ERROR_NOT_READY"], f"device 1 {shim}")
        expect(shim["current_device_after_unmap"] == ["1"], f"current device {shim}")
        expect(found == ["unmap-while-busy"], f"findings {found}")
        f = next(r for r in recs if r.get("class") == "unmap-while-busy")
        if name == "busy-device-sync":
            expect(f["state"]["check"] == "sync" and f["state"]["waited_ns"] >= 500_000_000,
                   f"state {f['state']}")

    elif name == "busy-device-fixed":
        expect(found == [], f"findings {found}")

    elif name == "stray-device":
        expect(found == ["stray-device"], f"findings {found}")
        f = next(r for r in recs if r.get("class") == "stray-device")
        expect(f["state"] == {"device": 0, "home": 1, "what": "context", "judged": "first-use"},
               f"state {f['state']}")
        expect("stack" in f, f"no stack: {f}")
        rep = report_json(build, log)
        grp = next(c for c in rep["findings"]["classes"] if c["class"] == "stray-device")["groups"][0]
        names = [x.get("function", "") for x in grp["stack"]["frames"]]
        expect(any("stray_device" in n for n in names), f"stack {names}")
    elif name == "stray-device-fixed":
        expect(found == [], f"findings {found}")
    elif name == "stray-comm":
        expect(found == ["stray-device"], f"findings {found}")
        f = next(r for r in recs if r.get("class") == "stray-device")
        expect(f["state"]["judged"] == "communicator" and f["state"]["device"] == 0 and
               f["state"]["home"] == 1, f"state {f['state']}")
        expect(f["api"] == "ncclCommInitRank", f"where {f['api']}")

    elif name == "snapshot-api":
        expect(shim["snapshot_before"] == ["1"] and shim["snapshot_after"] == ["2"], f"{shim}")
        expect(plain["snapshot_before"] == ["-1"], f"without the shim {plain}")
        before, after = by_label["before"][0], by_label["after"][0]
        expect(before["trigger"] == "api" and "stack" in before, f"before {before}")
        expect(total(before, "linear", "live") == 4 * MIB, f"before {before['rows']}")
        expect(total(after, "linear", "live") == 9 * MIB, f"after {after['rows']}")

    elif name == "snapshot-signal":
        expect(shim["usr2_handled"] == ["1"] and plain["usr2_handled"] == ["0"], f"{plain} {shim}")
        expect(shim["snapshot_seen"] == ["1"] and shim["went_on"] == ["1"], f"{shim}")
        sig = by_label["SIGUSR2"][0]
        expect(sig["trigger"] == "signal", f"signal {sig}")
        expect(total(sig, "linear", "live") == 2 * MIB, f"rows {sig['rows']}")
    elif name == "snapshot-signal-off":
        expect(shim["usr2_handled"] == ["0"], f"off by default, yet handled: {shim}")
        expect(not snaps, f"snapshots {snaps}")

    elif name == "graph-owned":
        expect(found == [], f"findings {found}")
        expect(shim["snapshot"] == ["1"], f"{shim}")
        snap = by_label["graphs"][0]
        allocs = [r for r in recs if r.get("k") == "call" and
                  r.get("api") in ("cudaMalloc", "cudaMallocAsync")]
        expect(len(allocs) == 3, f"allocations {allocs}")
        plain, pool, node = (r.get("stack", 0) for r in allocs)
        # [dev, kind, state, stack, graph, count, bytes]: the capture (1) owns the pool's block
        # and the launch's allocation; the plain block is no graph's.
        expect(sorted(snap["rows"]) == sorted([[0, "linear", "live", plain, 0, 1, MIB],
                                               [0, "linear", "live", pool, 1, 1, 2 * MIB],
                                               [0, "graph", "live", node, 1, 1, 4 * MIB]]),
               f"rows {snap['rows']}")
        rep = report_json(build, log)
        rs = next(x for x in rep["resident"]["snapshots"] if x["label"] == "graphs")
        got = sorted((x["kind"], x["bytes"], x["graph"]) for x in rs["sites"])
        expect(got == [("graph", 4 * MIB, 1), ("linear", MIB, None), ("linear", 2 * MIB, 1)],
               f"report sites {got}")
        text = run([os.path.join(build, "tools", "cumemguard"), "report", log], dict(os.environ))[1]
        expect(text.count("for a CUDA graph (capture 1)") == 2, f"text report {text[-3000:]}")
        page = log + ".html"
        rc, _, err = run([os.path.join(build, "tools", "cumemguard"), "report", "--html", page, log],
                         dict(os.environ))
        expect(rc in (0, 1), f"report --html: exit {rc} {err}")
        with open(page) as f:
            html = f.read()
        expect(html.count("for a CUDA graph (capture 1)") == 2, "html report: graph not shown")

    elif name == "snapshot-fork":
        expect(shim["usr2_handled"] == ["1"] and shim["child_status"] == ["0"] and
               shim["child_went_on"] == ["1"], f"{shim}")
        # Under ThreadSanitizer a forked child of a threaded parent cannot start a thread (the
        # runtime dies: "not supported"): the child's signal is counted, not taken (snapshot.cpp).
        tsan = "tsan" in os.environ.get("CMG_PRELOAD_FIRST", "")
        expect(shim["child_snapshot_seen"] == (["0"] if tsan else ["1"]),
               f"the child's signal {'was' if tsan else 'was not'} taken: {shim}")
        expect(shim["parent_snapshot_seen"] == ["1"], f"{shim}")
        # The parent's log: its own snapshot alone, of its own 1 MiB.
        expect(len(snaps) == 1 and snaps[0]["label"] == "SIGUSR2" and
               snaps[0]["trigger"] == "signal", f"parent's snapshots {snaps}")
        expect(total(snaps[0], "linear", "live") == MIB, f"parent's rows {snaps[0]['rows']}")
        header = recs[0]
        children = [p for p in glob.glob(log + ".*") if not p.endswith(".status")]
        expect(len(children) == 1, f"child logs {children}")
        crecs = read_log(children[0])
        chead = crecs[0]
        expect(chead["pid"] != header["pid"], f"child header {chead}")
        csnaps = snapshots(crecs)
        if tsan:
            expect(csnaps == [], f"child's snapshots under ThreadSanitizer {csnaps}")
            return
        # The child's: nothing (its allocation was refused; the parent's memory is the parent's).
        expect(len(csnaps) == 1 and csnaps[0]["label"] == "SIGUSR2" and
               csnaps[0]["trigger"] == "signal",
               f"child's snapshots {csnaps}")
        expect(csnaps[0]["rows"] == [] and csnaps[0]["end"]["objects"] == 0,
               f"child's rows {csnaps[0]['rows']}")
        # Its log goes on after the snapshot: the refused allocation (the child ends with _exit,
        # so only what was written by then is there).
        errs = [r for r in crecs if r.get("k") == "cuda_error"]
        expect([(r["api"], r["res"]) for r in errs] == [("cuMemAlloc_v2", 3)], f"child's {errs}")
        rep = report_json(build, children[0])
        res = rep["resident"]["snapshots"]
        expect(len(res) == 1 and res[0]["resident_bytes"] == 0 and res[0]["label"] == "SIGUSR2",
               f"child's report {res}")

    elif name == "fork-at-start":
        # At every fork the forking process's shim threads were past their set-up: the log's
        # flusher and the snapshot thread, a forked child's own (started at the fork and at its
        # first record). Under ThreadSanitizer a forked child starts none (snapshot.cpp, eventlog.cpp).
        tsan = "tsan" in os.environ.get("CMG_PRELOAD_FIRST", "")
        # Where real-time priority may be taken (probed here: root in a container may lack
        # CAP_SYS_NICE), every fork meets starting threads and the case must have had it; where it
        # may not, the race is only sampled, and the case says so.
        probe = subprocess.run([sys.executable, "-c", "import os; os.sched_setscheduler(0, "
                                "os.SCHED_FIFO, os.sched_param(1))"], stderr=subprocess.DEVNULL)
        if probe.returncode == 0:
            expect(shim["fifo"] == ["1"], f"no real-time priority though it may be had: {shim}")
        else:
            print("fork-at-start: no real-time priority here; the forks only sample the race")
        for k in range(FORK_LEVELS - 1):
            want = "cmg-log-flush,cmg-snapshot" if k == 0 or not tsan else "-"
            expect(shim.get(f"level{k}_threads") == [want],
                   f"generation {k}'s threads at its fork: {shim.get(f'level{k}_threads')}, "
                   f"want {want}")
            expect(shim.get(f"level{k}_child_status") == ["0"], f"generation {k + 1}: {shim}")
        children = [p for p in glob.glob(log + ".*") if not p.endswith(".status")]
        expect(len(children) == FORK_LEVELS - 1, f"{len(children)} child logs")
        pids = {recs[0]["pid"]}
        for c in children:
            crecs = read_log(c)
            pids.add(crecs[0]["pid"])
            errs = [(r["api"], r["res"]) for r in crecs if r.get("k") == "cuda_error"]
            expect(errs == [("cuMemAlloc_v2", 3)], f"{c}: {errs}")
        expect(len(pids) == FORK_LEVELS, f"pids in the headers {sorted(pids)}")

    elif name == "snapshot-limit":
        expect(len(snaps) == 1, f"{len(snaps)} snapshots with CUMEMGUARD_SNAPSHOTS=1")
        notes = [r["msg"] for r in recs if r.get("k") == "note"]
        expect(any("CUMEMGUARD_SNAPSHOTS" in n for n in notes), f"notes {notes}")

    elif name == "nccl-destroy":
        expect(found == [], f"findings {found}")
        d = by_label["ncclCommDestroy"][0]
        a = by_label["ncclCommAbort"][0]
        expect(d["trigger"] == "destroy" and a["trigger"] == "destroy", f"{d} {a}")
        expect(total(d, "linear", "live") == MIB, f"destroy rows {d['rows']}")
    elif name in ("nccl-suspend", "nccl-suspend-fixed"):
        fixed = name.endswith("-fixed")
        expect(found == [], f"findings {found}")
        expect(shim["suspend"] == ["0"] and shim["resume"] == ["0"], f"{shim}")
        # One snapshot at the suspend, its unmaps the sleep that ended there (not a second one).
        sus = by_label.get("ncclCommSuspend", [])
        expect(len(sus) == 1 and sus[0]["trigger"] == "suspend", f"{[x['label'] for x in snaps]}")
        sus = sus[0]
        expect(sus["run"] == {"what": "sleep", "seq": sus["run"]["seq"], "tid": sus["run"]["tid"],
                              "ranges": 1, "bytes": G}, f"run {sus['run']}")
        idx = snaps.index(sus)
        expect(not any(x["label"] == "sleep" and x["after_seq"] == sus["after_seq"] for x in snaps),
               f"a sleep snapshot at the suspend too: {[x['label'] for x in snaps]}")
        # NCCL's proxy buffer asleep, its host copy live; the weights mapped (or asleep, fixed).
        expect(total(sus, "host", "live") == G, f"host copy {sus['rows']}")
        expect(total(sus, "vmm", "asleep") == (G + 2 * G if fixed else G), f"asleep {sus['rows']}")
        rep = report_json(build, log)
        rs = next(x for x in rep["resident"]["snapshots"] if x["label"] == "ncclCommSuspend")
        expect(rs["trigger"] == "suspend" and rs["not_asleep"] is not None, f"report {rs}")
        mine = [x for x in rs["not_asleep"]["sites"] if x["creator"] == "resident_cases"]
        if fixed:
            expect(mine == [], f"the program's memory did not sleep: {mine}")
            expect(any(x["creator"] == "resident_cases" and x["bytes"] == 2 * G
                       for x in rs["asleep_sites"]), f"asleep sites {rs['asleep_sites']}")
        else:
            expect(len(mine) == 1 and mine[0]["bytes"] == 2 * G and mine[0]["kind"] == "vmm" and
                   mine[0]["state"] == "mapped", f"the weights that stayed mapped: {mine}")
            names = [f.get("function", "") for f in mine[0]["stack"]["frames"]]
            expect(any("weights" in n for n in names), f"site stack {names}")
        # What the resume finds: its wake-up maps NCCL's buffer again, nothing of NCCL asleep.
        wake = snaps[idx + 1]
        expect(wake["trigger"] == "wake-up" and wake["run"]["ranges"] == 1 and
               wake["run"]["bytes"] == G and not wake["run"].get("failed"), f"after resume {wake}")
        expect(total(wake, "vmm", "asleep") == (2 * G if fixed else 0), f"asleep {wake['rows']}")
        text = run([os.path.join(build, "tools", "cumemguard"), "report", log], dict(os.environ))[1]
        expect("an NCCL suspend (ncclCommSuspend): 1 range, 2.0 MiB" in text and
               "did not go to sleep" in text, f"text report {text[:2000]}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case")
    a = ap.parse_args()
    args, env_both, env_shim = CASES[a.case]
    build = os.path.abspath(a.build)
    prog = os.path.join(build, "tests", "integration", "resident_cases")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUMEMGUARD_", "FAKECUDA_")) and k not in ("RANK", "LD_PRELOAD")}
    env["MALLOC_PERTURB_"] = "0"
    fake = os.path.join(build, "tests", "fakecuda")
    env["LD_LIBRARY_PATH"] = fake + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.update(env_both)
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    if first:
        env["LD_PRELOAD"] = first
    tmp = tempfile.mkdtemp(prefix=f"cmg-resident-{a.case}-")
    log = os.path.join(tmp, "resident.log")
    argv = [prog] + [log if x == "@LOG@" else x for x in args]
    try:
        rc, out, err = run(argv, env)
        if rc == 77:
            print(f"{a.case}: skipped by the program ({err.strip()})")
            return 77
        expect(rc == 0, f"without the shim: exit {rc}\n{err}")
        senv = dict(env)
        # CMG_TEST_SHIM: another build of the shim (an older commit's, to see a case fail there).
        shim = os.environ.get("CMG_TEST_SHIM") or os.path.join(build, "shim", "libcumemguard.so")
        senv["LD_PRELOAD"] = f"{first}:{shim}" if first else shim
        senv["CUMEMGUARD_LOG"] = log
        senv["CUMEMGUARD_STACKS"] = "16"
        senv.update(env_shim)
        rc2, out2, err2 = run(argv, senv)
        expect(rc2 == 0, f"with the shim: exit {rc2}\n{err2}")
        recs = read_log(log)
        expect(recs and recs[-1].get("k") == "end", f"log not complete: {recs[-1:]}")
        check(a.case, build, recs, log, steps_of(out), steps_of(out2))
    except Failure as e:
        print(f"FAIL {a.case}: {e}")
        print(f"(log kept in {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"ok {a.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
