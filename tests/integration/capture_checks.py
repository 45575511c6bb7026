# SPDX-License-Identifier: Apache-2.0
# The stream-capture cases of run_case.py (tests/programs/capture_cases.cpp): each finding's failing
# program and its fixed variant with no finding, graph allocations freed and launched again, and the
# shim's own work around an open capture. `check` asserts what the findings, call records, leaks and
# notes of each say; the same table runs on the real driver (`real`).
import json
import os
import subprocess
import tempfile

S = "CUDA_SUCCESS"
RS = "cudaSuccess"
UNSUPPORTED, INVALIDATED = "cudaErrorStreamCaptureUnsupported", "cudaErrorStreamCaptureInvalidated"
MIB = 1 << 20

UNSAFE_FREE = {"free_in_capture": UNSUPPORTED, "end": INVALIDATED, "graph": "null",
               "free_after": RS}
UNSAFE_FINDINGS = [("capture-unsafe", "forward"), ("capture-failed", "forward")]
GRAPH_OWNED = {"alloc_node": RS, "launch1": RS, "free1": RS, "launch2": RS, "free2": RS,
               "launch3": RS, "free3": RS, "free_again": "cudaErrorInvalidValue"}
GRAPH_MEMORY = {"pool_malloc": RS, "capture_malloc_async": RS, "capture_tmp_async": RS,
                "capture_free_async": RS, "end": RS, "launch1": RS, "free1": RS, "launch2": RS}

CASES = {
    # capture-unsafe: a synchronous free inside a global-mode capture of the same thread.
    "unsafe-free": dict(prog="capture_cases", args=["unsafe-free"], real=True, base=UNSAFE_FREE,
                        shim={}, findings=UNSAFE_FINDINGS),
    "unsafe-free-fixed": dict(prog="capture_cases", args=["unsafe-free-fixed"], real=True,
                              base={"free_before": RS, "end": RS, "graph": "graph",
                                    "free_in_capture": None},
                              shim={}, findings=[]),
    # The same through a static runtime: only the driver's hooks see it (cuGetProcAddress routes).
    "unsafe-free-static": dict(prog="capture_cases_static", args=["unsafe-free"], base=UNSAFE_FREE,
                               shim={}, findings=UNSAFE_FINDINGS),
    # capture-unsafe on another thread than the capture's; fixed: a thread-local capture.
    "unsafe-other-thread": dict(prog="capture_cases", args=["unsafe-other-thread"], real=True,
                                base={"other_thread_malloc": UNSUPPORTED, "end": INVALIDATED,
                                      "graph": "null"},
                                shim={}, findings=UNSAFE_FINDINGS),
    "unsafe-other-thread-fixed": dict(prog="capture_cases", args=["unsafe-other-thread-fixed"],
                                      real=True,
                                      base={"other_thread_malloc": RS, "end": RS, "graph": "graph"},
                                      shim={}, findings=[]),
    # The driver API's capture and cuMemAlloc.
    "unsafe-driver": dict(prog="capture_cases", args=["driver-unsafe"], real=True,
                          base={"alloc_in_capture": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
                                "end": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "graph": "null"},
                          shim={}, findings=UNSAFE_FINDINGS),
    # capture-failed: an invalidated capture whose pool allocation is still live.
    "capture-failed": dict(prog="capture_cases", args=["failed"], real=True,
                           base={"pool_malloc": RS, "query": UNSUPPORTED, "end": INVALIDATED,
                                 "graph": "null", "pool_free": RS},
                           shim={}, findings=[("capture-failed", "forward")]),
    "capture-failed-fixed": dict(prog="capture_cases", args=["failed-fixed"], real=True,
                                 base={"pool_malloc": RS, "query": None, "end": RS,
                                       "graph": "graph", "instantiate": RS, "launch": RS,
                                       "pool_free": RS},
                                 shim={}, findings=[]),
    # free-kind-mismatch, both ways, and their fixed variants.
    "kind-sync-of-async": dict(prog="capture_cases", args=["kind-sync-of-async"], real=True,
                               base={"free": RS}, shim={},
                               findings=[("free-kind-mismatch", "forward")]),
    "kind-sync-of-async-fixed": dict(prog="capture_cases", args=["kind-sync-of-async-fixed"],
                                     real=True, base={"sync": RS, "free": RS}, shim={},
                                     findings=[]),
    "kind-async-of-sync": dict(prog="capture_cases", args=["kind-async-of-sync"], real=True,
                               base={"free_async": RS}, shim={},
                               findings=[("free-kind-mismatch", "forward")]),
    "kind-async-of-sync-fixed": dict(prog="capture_cases", args=["kind-async-of-sync-fixed"],
                                     real=True, base={"sync": RS, "free_async": RS}, shim={},
                                     findings=[]),
    # Graph allocations: a freed linear address handed out again by a graph allocation node, freed
    # after every launch; only the free the driver refuses is a double free.
    "graph-owned": dict(prog="capture_cases", args=["graph-owned"], real=True, base=GRAPH_OWNED,
                        shim={}, findings=[("double-free", "forward")]),
    "graph-owned-static": dict(prog="capture_cases_static", args=["graph-owned"], base=GRAPH_OWNED,
                               shim={}, findings=[("double-free", "forward")]),
    "graph-memory": dict(prog="capture_cases", args=["graph-memory"], real=True,
                         base=dict(GRAPH_MEMORY, free2=RS, pool_free=RS), shim={}, findings=[]),
    "graph-leak": dict(prog="capture_cases", args=["graph-leak"], real=True,
                       base=dict(GRAPH_MEMORY, free2=None, pool_free=None), shim={}, findings=[]),
    # The quarantine holds memory a VMM allocation inside a capture needs: released before the
    # capture begins, never inside it (issue of the reliability list: a correct capture invalidated).
    "quarantine-capture": dict(prog="capture_cases", args=["quarantine-capture"], real=True,
                               env={"FAKECUDA_DEVICE_MEMORY": "64M"},
                               shim_env={"CUMEMGUARD_QUARANTINE": "48M"},
                               base={"free_before": RS, "create_in_capture": S, "end": RS,
                                     "graph": "graph", "release": S},
                               shim={}, findings=[]),
    # The busy check's query of the legacy stream would invalidate a blocking stream's capture.
    "busy-in-capture": dict(prog="capture_cases", args=["busy-in-capture"], real=True,
                            shim_env={"CUMEMGUARD_BUSY_CHECK": "query"},
                            base={"unmap_in_capture": S, "end": RS, "graph": "graph",
                                  "release": S, "address_free": S},
                            shim={}, findings=[]),
    # A mode that is no enumerator: refused by both exchanges and changes nothing (fake only: the
    # real driver's status for it is not documented).
    "exchange-invalid": dict(prog="capture_cases", args=["exchange-invalid"],
                             base={"exchange_invalid": "cudaErrorInvalidValue",
                                   "cu_exchange_invalid": "CUDA_ERROR_INVALID_VALUE",
                                   "value_after": "7", "exchange_relaxed": RS, "previous": "0",
                                   "relaxed_malloc": RS, "end": RS, "graph": "graph",
                                   "free_after": RS},
                             shim={}, findings=[]),
}

CASE_NAMES = tuple(CASES)


def check(name, recs, steps, expect, real, build, log_path):
    """What each case's log says beyond the statuses and the findings' classes."""
    calls = [r for r in recs if r.get("k") == "call"]
    by_seq = {r["seq"]: r for r in calls}
    findings = [r for r in recs if r.get("k") == "finding"]
    summary = next(r for r in recs if r.get("k") == "summary")
    leaks = [r for r in recs if r.get("k") == "leak"]
    notes = [r["msg"] for r in recs if r.get("k") == "note"]
    begins = [c for c in calls if "BeginCapture" in c["api"]]
    ends = [c for c in calls if "EndCapture" in c["api"]]
    by_class = {}
    for f in findings:
        by_class.setdefault(f["class"], []).append(f)
    rows = {(b["dev"], b["mem"]): b for b in summary["bytes"]}

    def related(f, what):
        return next((r for r in f.get("related", []) if r["what"] == what), None)

    if name in ("unsafe-free", "unsafe-free-static", "unsafe-other-thread", "unsafe-driver"):
        u = by_class["capture-unsafe"][0]
        st = u["state"]
        begin = related(u, "capture begin")
        expect(begin and "BeginCapture" in by_seq[begin["seq"]]["api"],
               f"{name}: the capture's begin is not named: {u.get('related')}")
        expect(begin.get("stack") is not None, f"{name}: the begin site has no stack: {begin}")
        expect(st["capture"] == 1 and st["mode"] == "global" and st["capture_tid"] == begin["tid"],
               f"{name}: capture state {st}")
        own = name != "unsafe-other-thread"
        expect(st["own_thread"] is own and ("on this thread" in u["msg"]) is own,
               f"{name}: which thread: {st} / {u['msg']}")
        expect(u["res"] == 900 and u["action"] == "forward" and "stack" in u,
               f"{name}: finding {u}")
        failed = by_class["capture-failed"][0]
        inv = related(failed, "invalidated by")
        expect(inv and inv["seq"] == u["call_seq"],
               f"{name}: capture-failed does not name the call that invalidated it: {failed}")
        expect(failed["res"] in (901,) and failed["state"]["live_allocs"] == 0,
               f"{name}: capture-failed {failed}")
        expect(begins and begins[0]["args"]["capture"] == 1 and begins[0]["args"]["mode"] ==
               "global", f"{name}: begin record {begins}")
        expect(ends and ends[-1]["args"]["capture"] == 1 and ends[-1]["res"] == 901,
               f"{name}: end record {ends}")
        if name == "unsafe-free-static":
            expect(begins[0]["api"] == "cuStreamBeginCapture_v2", f"{name}: {begins[0]['api']}")
    if name.endswith("-fixed") and name.startswith("unsafe"):
        expect(ends and ends[-1]["res"] == 0 and ends[-1]["args"].get("graph"),
               f"{name}: end record {ends}")
    if name == "capture-failed":
        f = by_class["capture-failed"][0]
        st = f["state"]
        expect(st["live_allocs"] == 1 and st["live_bytes"] == 2 * MIB and f["bytes"] == 2 * MIB,
               f"{name}: what is still live: {st}")
        alloc = related(f, "allocation")
        expect(alloc and by_seq[alloc["seq"]]["api"] == "cudaMalloc" and
               by_seq[alloc["seq"]]["args"].get("capture") == 1,
               f"{name}: the pool allocation is not named: {f.get('related')}")
        expect(related(f, "invalidated by") is None,
               f"{name}: the query is no hooked call, yet an invalidating call is named")
        expect("1 allocation made for it (2097152 bytes) are still live" in f["msg"],
               f"{name}: {f['msg']}")
    if name in ("capture-failed-fixed", "capture-failed"):
        pool = next(c for c in calls if c["api"] == "cudaMalloc")
        expect(pool["args"].get("capture") == 1 and pool.get("mem") == "graph",
               f"{name}: the pool allocation is not the graph's: {pool}")
        expect(rows.get((0, "graph"), {}).get("total") == 2 * MIB and
               rows[(0, "graph")]["current"] == 0, f"{name}: bytes {summary['bytes']}")
    if name.startswith("kind-") and not name.endswith("-fixed"):
        f = by_class["free-kind-mismatch"][0]
        sync_of_async = name == "kind-sync-of-async"
        expect(f["state"]["direction"] == ("sync-free-of-stream-ordered" if sync_of_async
                                           else "stream-ordered-free-of-sync"),
               f"{name}: {f['state']}")
        alloc = related(f, "allocation")
        expect(alloc and by_seq[alloc["seq"]]["api"] ==
               ("cudaMallocAsync" if sync_of_async else "cudaMalloc"), f"{name}: {f}")
        expect(f["res"] == 0 and f["bytes"] == MIB, f"{name}: {f}")
    if name.startswith("graph-owned"):
        if not real:
            expect(steps.get("reused") == "1",
                   f"{name}: the fake did not hand the freed address to the graph: {steps}")
        frees = [c for c in calls if c["api"] in ("cudaFree", "cudaFreeAsync", "cuMemFree_v2",
                                                   "cuMemFreeAsync")]
        expect(not any(c.get("skipped") for c in frees), f"{name}: a free was skipped: {frees}")
        f = by_class["double-free"][0]
        expect(f["res"] != 0 and "a graph allocation" in f["msg"] and
               related(f, "allocation node"), f"{name}: {f}")
    if name in ("graph-memory", "graph-leak"):
        node = [c for c in calls if c["api"] == "cudaMallocAsync"]
        expect(len(node) == 2 and all(c["args"].get("graph_alloc") == 1 and
                                       c["args"].get("capture") == 1 for c in node),
               f"{name}: captured allocations {node}")
        launches = [c for c in calls if c["api"] == "cudaGraphLaunch"]
        expect([c.get("delta", 0) for c in launches] == [4 * MIB, 4 * MIB],
               f"{name}: the launches' graph memory {launches}")
        g = rows.get((0, "graph"), {})
        expect(g.get("peak", 0) >= 7 * MIB, f"{name}: graph bytes {summary['bytes']}")
        if name == "graph-memory":
            expect(g.get("current") == 0 and not leaks, f"{name}: {g} {leaks}")
        else:
            kinds = sorted((l["what"], l["size"], l.get("capture")) for l in leaks)
            expect(kinds == [("graph", 4 * MIB, 1), ("linear", 3 * MIB, 1)],
                   f"{name}: leak records {leaks}")
            expect(g.get("current") == 7 * MIB, f"{name}: graph bytes {g}")
            out = subprocess.run([os.path.join(build, "tools", "cumemguard"), "report", log_path],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout
            expect("graph" in out and "capture 1" in out, f"{name}: report:\n{out}")
            with tempfile.TemporaryDirectory(prefix="cmg-trace-") as tdir:
                trace = os.path.join(tdir, "trace.json")
                subprocess.run([os.path.join(build, "tools", "cumemguard"), "report", "--trace",
                                trace, log_path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, check=False)
                with open(trace) as fh:
                    events = json.load(fh)
            events = events["traceEvents"] if isinstance(events, dict) else events
            spans = [e for e in events if e.get("name", "").startswith("capture 1")]
            expect(spans and spans[0].get("dur", 0) > 0 and spans[0]["ph"] == "X",
                   f"{name}: no capture interval in the trace: {spans}")
    if name == "quarantine-capture":
        b = begins[0]
        expect(b["args"].get("released_held") == 40 * MIB,
               f"{name}: the held free was not released before the capture: {b}")
        create = next(c for c in calls if c["api"] == "cuMemCreate")
        expect(create["res"] == 0 and "retried_after_release" not in create["args"],
               f"{name}: {create}")
        released = [c for c in calls if c.get("released_from") == "quarantine"]
        expect(len(released) == 1 and released[0]["ts"] <= b["ts"] + b["dur"],
               f"{name}: {released}")
    if name == "exchange-invalid":
        ex = [c for c in calls if "ThreadExchangeStreamCaptureMode" in c["api"]]
        expect([(c["api"], c["res"], c["args"].get("mode"), c["args"].get("previous"))
                for c in ex] ==
               [("cudaThreadExchangeStreamCaptureMode", 1, None, None),
                ("cuThreadExchangeStreamCaptureMode", 1, None, None),
                ("cudaThreadExchangeStreamCaptureMode", 0, "relaxed", "global"),
                ("cudaThreadExchangeStreamCaptureMode", 0, "global", "relaxed")],
               f"{name}: exchange records {ex}")
        m = next(c for c in calls if c["api"] == "cudaMalloc")
        expect(m["res"] == 0 and m["args"].get("capture") == 1, f"{name}: {m}")
    if name == "busy-in-capture":
        expect(any("busy check is skipped while stream capture 1" in n for n in notes),
               f"{name}: notes {notes}")
