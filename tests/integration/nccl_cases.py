# SPDX-License-Identifier: Apache-2.0
# The cases of what NCCL holds (tests/programs/nccl_hold_cases.cpp, docs/nccl.md): memory freed
# while registered, in a window or bound to a multicast object; communicators ended twice,
# suspended twice, resumed while running, torn down while suspended; peer memory an abort leaves
# mapped. Each misuse has a fixed variant with no finding. run_case.py runs them (table format and
# harness there); check() adds what each finding must say.
S = "CUDA_SUCCESS"
NET_ENV = {"FAKENCCL_NET_SHARED": str(4 << 20)}
MC_ENV = {"FAKECUDA_MULTICAST": "1"}
REG = {"init": "0", "alloc": "0", "register": "0", "free": "0", "deregister": "0", "destroy": "0"}
SEG = {"init": "0", "register": "0", "shrink.unmap": S, "shrink.release": S,
       "deregister_end": "0", "destroy": "0"}
MC = {"supported": "1", "mc.create": S, "mc.add_device": S, "mc.bind": S, "free.unmap": S,
      "free.release": S, "free.addrfree": S, "mc.unbind": S, "mc.release": S}
SUSPEND = {"init": "0", "bytes_before": "1", "stats.suspendable": "0 2097152", "suspend": "0",
           "stats.suspended": "0 1", "resume": "0", "stats.resumed": "0 0", "all_reduce": "0",
           "result_ok": "1", "destroy": "0", "bytes_after": "1"}


# The communicator's address the program prints (check() reads it): the heap's, not the same in
# the two runs.
COMM_VARIES = ("comm",)


def _c(args, base, findings, shim=None, env=None, real=False, varies=()):
    return dict(prog="nccl_hold_cases", args=args, base=base, shim=shim or {}, env=env or {},
                findings=findings, real=real, varies=varies)


CASES = {
    # Registration (NCCL 2.28.9 src/register/register.cc): runs on the real NCCL too.
    "reg-free": _c(["register-free"], dict(REG, bytes_ok="1"), [("free-registered", "forward")],
                   real=True),
    "reg-ok": _c(["register-ok"], dict(REG, bytes_ok="1"), [], real=True),
    "reg-segment": _c(["register-segment"], SEG, [("free-registered", "forward")], real=True),
    "reg-segment-ok": _c(["register-segment-ok"], dict(SEG, deregister="0", reregister="0"), [],
                         real=True),
    "reg-cudafree": _c(["register-cudafree"],
                       {"init": "0", "register": "0", "free": "cudaSuccess", "deregister": "0",
                        "destroy": "0"}, [("free-registered", "forward")], real=True),
    "reg-cudafree-ok": _c(["register-cudafree-ok"],
                          {"init": "0", "register": "0", "free": "cudaSuccess",
                           "deregister": "0", "destroy": "0"}, [], real=True),
    # Windows (2.28.9 src/dev_runtime.cc).
    "window-free": _c(["window-free"],
                      {"init": "0", "alloc": "0", "window": "0", "bytes_ok": "1", "free": "0",
                       "window_deregister": "0", "destroy": "0"},
                      [("free-registered", "forward")], real=True),
    "window-ok": _c(["window-ok"],
                    {"init": "0", "alloc": "0", "window": "0", "bytes_ok": "1",
                     "window_deregister": "0", "free": "0", "destroy": "0"}, [], real=True),
    # The program's own second unmap of a whole reservation it put in a window: still caught (NCCL's
    # own whole-range unmap at destroy is not, docs/nccl.md).
    "window-double-unmap": _c(["window-double-unmap"],
                              {"init": "0", "window": "0", "bytes_ok": "1",
                               "window_deregister": "0", "unmap": S, "unmap_again": S,
                               "destroy": "0", "release": S, "addrfree": S},
                              [("unmap-unmapped", "skip")], real=True),
    # Multicast objects (cuda.h 13.0): the program skips (77) on a device without multicast.
    "bind-mem": _c(["bind-mem"], MC, [("free-bound", "forward")], env=MC_ENV, real=True),
    "bind-mem-ok": _c(["bind-mem-ok"], MC, [], env=MC_ENV, real=True),
    "bind-addr": _c(["bind-addr"], MC, [("free-bound", "forward")], env=MC_ENV, real=True),
    "bind-addr-ok": _c(["bind-addr-ok"], MC, [], env=MC_ENV, real=True),
    # A communicator ended twice: without the shim NCCL reads the freed communicator (its magic
    # gone: ncclInvalidArgument here; on a real NCCL anything), so these run on the fake only.
    "comm-twice": _c(["destroy-twice"], {"init": "0", "destroy": "0", "again": "4"},
                     [("comm-ended", "skip")], shim={"again": "0"}, varies=COMM_VARIES),
    "comm-abort-after-destroy": _c(["abort-after-destroy"],
                                   {"init": "0", "destroy": "0", "again": "4"},
                                   [("comm-ended", "skip")], shim={"again": "0"},
                                   varies=COMM_VARIES),
    "comm-once": _c(["destroy-once"], {"init": "0", "destroy": "0"}, [], varies=COMM_VARIES),
    # Suspend and resume (2.29.7 src/mem_manager.cc; the real NCCL here is 2.28.9: fake only).
    "suspend-twice": _c(["suspend-twice"], dict(SUSPEND, suspend_again="5"),
                        [("comm-suspend", "forward")]),
    "resume-running": _c(["resume-running"], dict(SUSPEND, resume_running="5"),
                         [("comm-suspend", "forward")]),
    "destroy-suspended": _c(["destroy-suspended"], dict(SUSPEND, destroy_suspended="1"),
                            [("comm-suspend", "forward")]),
    "suspend-ok": _c(["suspend-ok"], SUSPEND, []),
    # Peer memory the NET proxy imports (NVIDIA/nccl#1968): reported at each abort.
    "abort-imports": _c(["abort-imports"], {"init": "0", "abort": "0"},
                        [("comm-import-mapped", "forward")] * 3, env=NET_ENV),
    "destroy-imports": _c(["destroy-imports"], {"init": "0", "destroy": "0"}, [], env=NET_ENV),
}


def check(name, recs, steps, expect):
    """What the findings of these cases say: the registration and its site, the right pointer."""
    if name not in CASES:
        return
    findings = [r for r in recs if r.get("k") == "finding"]
    nccl = [r for r in recs if r.get("k") == "nccl"]
    calls = {r["seq"]: r for r in recs if r.get("k") == "call"}
    by_seq = {r["seq"]: r for r in nccl}
    by_seq.update(calls)
    summary = next(r for r in recs if r.get("k") == "summary")
    for f in findings:
        if f["class"] in ("free-registered", "free-bound"):
            rel = f.get("related") or []
            expect(rel, f"{name}: {f['class']} names no registration")
            made = by_seq.get(rel[0]["seq"])
            want_api = {"reg": "ncclCommRegister", "win": "ncclCommWindowRegister",
                        "bin": ("cuMulticastBindMem" if "mem" in name else "cuMulticastBindAddr")}
            expect(made is not None and made["api"] == want_api[name[:3]],
                   f"{name}: related event {rel[0]} is {made}")
            held = f["state"]["holds"]
            if name.startswith("reg") or name.startswith("win"):
                reg = next(r for r in nccl if r["seq"] == rel[0]["seq"])
                expect(held["comm"] == reg["comm"] and held["va"] == reg["buff"],
                       f"{name}: the finding's registration {held} is not {reg}")
    if name.startswith("reg-segment") and findings:
        f = findings[0]
        expect(f["api"] == "cuMemUnmap" and f["state"]["holds"]["size"] == 4 * (2 << 20),
               f"{name}: the unmap of one page names the whole registration: {f}")
    if name in ("comm-twice", "comm-abort-after-destroy"):
        comm = steps["comm"]
        ends = [r for r in nccl if r["event"] in ("destroy", "abort")]
        expect(len(ends) == 2 and all(int(r["comm"], 16) == int(comm, 16) for r in ends),
               f"{name}: the nccl records do not name communicator {comm}: {ends}")
        f = findings[0]
        expect(int(f["state"]["comm"], 16) == int(comm, 16), f"{name}: finding names {f['state']}")
        first = calls.get(f["related"][0]["seq"]) or by_seq.get(f["related"][0]["seq"])
        expect(first and first["api"] == "ncclCommDestroy" and first["res"] == 0,
               f"{name}: the earlier end is not the first destroy: {first}")
        skipped = [c for c in calls.values() if c.get("skipped")]
        expect(len(skipped) == 1 and skipped[0]["api"] in ("ncclCommDestroy", "ncclCommAbort"),
               f"{name}: skipped calls {skipped}")
    if name.startswith("suspend") or name in ("resume-running", "destroy-suspended"):
        sus = [r for r in nccl if r["event"] == "suspend" and r["res"] == 0]
        expect(sus and sus[0].get("ranges") == 1 and sus[0].get("range_bytes") == 2 << 20,
               f"{name}: the suspend record does not carry NCCL's range put to sleep: {sus}")
        stats = [r for r in nccl if r["event"] == "memstats"]
        expect([(r["stat"], r["value"]) for r in stats] == [(0, 2 << 20), (1, 1), (1, 0)],
               f"{name}: memstats records {stats}")
    if name == "destroy-suspended":
        f = findings[0]
        expect(f["res"] == 1 and f["state"]["sleeping"][0]["size"] == 2 << 20,
               f"{name}: the teardown finding {f}")
    if name == "abort-imports":
        for f in findings:
            expect(f["bytes"] == 4 << 20 and f["api"] == "ncclCommAbort",
                   f"{name}: each abort leaves one 4 MiB import: {f}")
        aborts = [r for r in nccl if r["event"] == "abort"]
        expect([f["seq"] > a["seq"] for f, a in zip(findings, aborts)] == [True] * 3,
               f"{name}: the findings are not at the aborts")
        expect(summary["live"].get("vmm") == 3, f"{name}: live at exit {summary['live']}")
