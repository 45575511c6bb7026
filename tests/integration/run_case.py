#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs one test program case without and with the shim and checks what the caller got (driver and
# runtime statuses), the findings the shim logged (class, action, related events) and the log
# itself. The same table serves the fake stack (CI) and the real driver (--real, on the GPU machine).
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import capture_checks
import nccl_cases  # what NCCL holds: registrations, windows, suspend, teardown

S, IV, OOM = "CUDA_SUCCESS", "CUDA_ERROR_INVALID_VALUE", "CUDA_ERROR_OUT_OF_MEMORY"
RS, RIV = "cudaSuccess", "cudaErrorInvalidValue"


class Err(str):
    """A refusal whose exact code is the fake's (compared exactly there); on the real driver, whose
    code for it was not measured (real-driver.md), any error."""


# The oracle. Without the shim, each step must be what `base` says (the driver's own answers,
# real-driver.md). With the shim, each step must be exactly what the same program got without the
# shim in this run, except the steps `shim` declares (what the shim changes, None: absent) and the
# steps `varies` names (measurements, such as how long a call blocked, which case_specific and
# check_flushes judge). A step only one run printed is a difference too. "n/a" (an observation
# only the fake driver can make) is accepted on the real driver only.

# Each case: program, argv, extra env; `base` = what the caller gets without the shim (the
# driver's own answers, real-driver.md); `shim` = what changes with the shim in guard mode;
# `findings` = the exact multiset of (class, action) the shim logs; `real` = also run on the GPU;
# `shim_env` = options for the run with the shim.
P17_ENV = {"FAKENCCL_COLL_NS": "300000000"}
P17_BASE = {"pre.released": "1", "init": "0", "all_reduce": "0", "result_ok": "1", "destroy": "0",
            "flush.released": "3", "sticky.released": "1", "release_errors": "0",
            "flush_symbol_dynamic": "0"}
# How long P17's frees blocked, in ms: judged by check_flushes (the deferred flushes return at once).
P17_TIMES = ("flush.min_ms", "flush.max_ms", "intentional.min_ms", "intentional.max_ms",
             "sticky.flush_ms")
MS200 = 200_000_000  # generous margins for a loaded machine: the device is busy 300 ms

CASES = {
    "P01": dict(prog="vmm_cases", args=["P01"], real=True,
                base={"sleep.unmap": S, "sleep.release": S, "free.unmap": S, "free.release": IV,
                      "free.addrfree": S, "next.create": S},
                shim={"free.release": S},
                findings=[("unmap-unmapped", "skip"), ("double-release", "skip")]),
    "P02": dict(prog="vmm_cases", args=["P02"], real=True,
                base={"b.reused_value": "1", "sleep.unmap": S, "sleep.release": S,
                      "free.unmap": S, "free.release": S, "free.addrfree": S, "b.read": S,
                      "b.value": "0x5a", "b.unmap": S, "b.release": IV, "b.addrfree": S},
                shim={"b.release": S},
                findings=[("unmap-unmapped", "skip"), ("stale-release", "skip")]),
    "P03": dict(prog="vmm_cases", args=["P03"], real=True,
                base={"pass1.unmap": S, "pass1.release": S, "pass2.unmap": S,
                      "pass2.release": IV, "addrfree": S},
                shim={"pass2.release": S},
                findings=[("unmap-unmapped", "skip"), ("double-release", "skip")]),
    "P04": dict(prog="vmm_cases", args=["P04"], real=True,
                base={"wake.map": IV, "cleanup.release_new": S, "cleanup.unmap": S,
                      "cleanup.release": S, "cleanup.addrfree": S},
                shim={}, findings=[("map-over-mapped", "forward")]),
    "P05": dict(prog="vmm_cases", args=["P05"],
                base={"wake.create2": OOM, "cleanup.release1": S, "teardown.unmap": S,
                      "teardown.release1": IV, "teardown.addrfree": S},
                shim={"teardown.release1": S},
                findings=[("unmap-unmapped", "skip"), ("double-release", "skip")]),
    "P06": dict(prog="vmm_cases", args=["P06"],
                base={"map0": S, "map1": IV, "teardown.unmap_all": IV, "cleanup.unmap0": S,
                      "cleanup.addrfree": S},
                shim={}, findings=[("partial-unmap", "forward")]),
    "P07": dict(prog="vmm_cases", args=["P07"],
                base={"sleep.unmap": IV, "sleep.release": S, "wake.map": IV,
                      "cleanup.release_new": S, "cleanup.unmap": S, "cleanup.addrfree": S},
                shim={}, findings=[("map-over-mapped", "forward")]),
    "P08": dict(prog="vmm_cases", args=["P08"], env={"FAKECUDA_HANDLE_REUSE": "0"},
                base={"pause.unmap": S, "pause.release": S, "resume.same_value": "0",
                      "resume.map": S, "owner.unmap": S, "owner.release": IV,
                      "layer.release": S, "owner.addrfree": S},
                shim={"owner.release": S},
                findings=[("stale-release", "skip")]),
    "P09": dict(prog="vmm_cases", args=["P09"],
                base={"map0": S, "create1": OOM, "addrfree_mapped": IV, "cleanup.unmap0": S,
                      "cleanup.release0": S, "cleanup.addrfree": S},
                shim={}, findings=[("free-mapped-va", "forward")]),
    "P10": dict(prog="vmm_cases", args=["P10"], real=True,
                base={"device.create": S, "device.map": S, "device.access": S,
                      "device.release_at_once": S, "device.retain": S, "device.unmap": S,
                      "device.release_retained": S, "device.addrfree": S,
                      "thread.ctx_get_device": "CUDA_ERROR_INVALID_CONTEXT",
                      "host.create": S, "host.map": S, "host.release_at_once": S,
                      "host.retain": S, "host.unmap": S, "host.release_retained": S,
                      "host.addrfree": S},
                shim={}, findings=[]),
    "P31": dict(prog="vmm_cases", args=["P31"],
                base={"wake.create": OOM, "wake.map": IV, "wake.access": IV,
                      "cleanup.addrfree": S},
                shim={}, findings=[]),
    "sleep-error": dict(prog="sleep_alloc", args=["error"], real=True,
                        base={"error.wake_up_weights": IV, "wake_ok": "0", "b_intact": "0"},
                        shim={"error.wake_up_weights": None, "error.teardown": None,
                              "wake_ok": "1", "b_intact": "1"},
                        findings=[("unmap-unmapped", "skip"), ("double-release", "skip")]),
    # On the real driver B's wake-up may or may not get A's old value (D18: reuse is likely, not
    # certain); variants() adjusts the expectations to what this run's driver did.
    "sleep-aba": dict(prog="sleep_alloc", args=["aba"], real=True,
                      base={"wake_ok": "1", "b_took_a_value": "1", "b_handle_live": "0",
                            "b_intact": "1", "second_cycle_ok": "0", "b_intact_after": "0",
                            "teardown_error": "1"},
                      shim={"b_handle_live": "1", "second_cycle_ok": "1",
                            "b_intact_after": "1", "teardown_error": "0",
                            "error.wake_up_weights": None, "error.teardown": None},
                      findings=[("unmap-unmapped", "skip"), ("stale-release", "skip")]),
    "sleep-cycles": dict(prog="sleep_alloc", args=["cycles"], real=True,
                         base={}, shim={"errors": "0", "bad_bytes": "0",
                                        "error.free_while_asleep": None}, findings=None),
    # Another preloaded allocator (torch_memory_saver-style), before or after the shim.
    "tms-forward-shim-first": dict(prog="tms_cases", args=["forward"], preload="libtmslike.so",
                                   order="shim-first", real=True,
                                   base={"malloc_failures": "0", "free_failures": "0"},
                                   shim={}, findings=[]),
    "tms-forward-shim-last": dict(prog="tms_cases", args=["forward"], preload="libtmslike.so",
                                  order="shim-last", real=True,
                                  base={"malloc_failures": "0", "free_failures": "0"},
                                  shim={}, findings=[]),
    "tms-vmm-shim-first": dict(prog="tms_cases", args=["vmm"], preload="libtmslike.so",
                               order="shim-first", env={"TMSLIKE_VMM": "1"}, real=True,
                               base={"malloc_failures": "0", "resume_failures": "0",
                                     "free_failures": "0"}, shim={}, findings=[]),
    "tms-vmm-shim-last": dict(prog="tms_cases", args=["vmm"], preload="libtmslike.so",
                              order="shim-last", env={"TMSLIKE_VMM": "1"}, real=True,
                              base={"malloc_failures": "0", "resume_failures": "0",
                                    "free_failures": "0"}, shim={}, findings=[]),
    # With the shim preloaded its own exports are in the process (and nothing else of CUDA).
    "edge-nocuda": dict(prog="edge_nocuda", args=["nocuda"], nolog=True, real=True,
                        base={"cuda_present": "0", "gpa_present": "0"},
                        shim={"cuda_present": "1", "gpa_present": "1"}, findings=[]),
    # The v1 (32-bit) cuMemAlloc must come back unwrapped: the _v2 wrapper has another ABI.
    "edge-gpa": dict(prog="edge_cases", args=["gpa"], nolog=True, real=True,
                     base={"v1_status": "0", "v1_in": "libcuda", "v2_in": "libcuda",
                           "create_in": "libcuda", "v1_differs": "1"},
                     shim={"v2_in": "shim", "create_in": "shim"}, findings=[]),
    "edge-extension": dict(prog="edge_cases", args=["extension"],
                           base={"ext_alloc_free": "0"}, shim={}, findings=[]),
    "fork-stacks": dict(prog="runtime_cases", args=["fork"], real=True,
                        shim_env={"CUMEMGUARD_STACKS": "32"},
                        base={"children_ok": "20", "free": RS}, shim={}, findings=[]),
    # Memory unmapped while the device still has work queued (the sleep "200 lie"): the query
    # (the debugging profile's default) sees the busy default stream, the synchronising check
    # waits and says for how long; the guard profile checks nothing (its cost, performance.md).
    "busy-query": dict(prog="vmm_cases", args=["busy"], shim_env={"CUMEMGUARD_BUSY_CHECK": "query"},
                       base={"sleep.unmap": S, "sleep.release": S, "sync": S, "free.addrfree": S},
                       shim={}, findings=[("unmap-while-busy", "forward")]),
    "busy-debug": dict(prog="vmm_cases", args=["busy"], shim_env={"CUMEMGUARD_PROFILE": "debug"},
                       base={"sleep.unmap": S, "sleep.release": S, "sync": S, "free.addrfree": S},
                       shim={}, findings=[("unmap-while-busy", "forward")]),
    "busy-guard": dict(prog="vmm_cases", args=["busy"],
                       base={"sleep.unmap": S, "sleep.release": S, "sync": S, "free.addrfree": S},
                       shim={}, findings=[]),
    "busy-sync": dict(prog="vmm_cases", args=["busy"], shim_env={"CUMEMGUARD_BUSY_CHECK": "sync"},
                      base={"sleep.unmap": S, "sleep.release": S, "sync": S, "free.addrfree": S},
                      shim={}, findings=[("unmap-while-busy", "forward")]),
    "busy-off": dict(prog="vmm_cases", args=["busy"], shim_env={"CUMEMGUARD_BUSY_CHECK": "off"},
                     base={"sleep.unmap": S, "sleep.release": S, "sync": S, "free.addrfree": S},
                     shim={}, findings=[]),
    "wakefail": dict(prog="vmm_cases", args=["wakefail"],
                     base={"sleep.unmap": S, "sleep.release": S, "wake.same_value": "1",
                           "wake.map": OOM, "cleanup.unmap": S, "cleanup.release": S,
                           "cleanup.addrfree": S},
                     shim={}, findings=[("unmap-unmapped", "skip")]),
    # P28: an allocation that fails with out-of-memory inside a hook reaches the caller with the
    # driver's code, the process goes on and exits 0 (no quarantine, so nothing to retry with).
    "P28": dict(prog="runtime_cases", args=["oom_retry"],
                base={"malloc_after_oom": "cudaErrorMemoryAllocation",
                      "last_error": "cudaErrorMemoryAllocation"},
                shim={}, findings=[]),
    "oom-retry": dict(prog="runtime_cases", args=["oom_retry"],
                      shim_env={"CUMEMGUARD_QUARANTINE": "16M"},
                      base={"malloc_after_oom": "cudaErrorMemoryAllocation",
                            "last_error": "cudaErrorMemoryAllocation"},
                      shim={"malloc_after_oom": RS, "last_error": RS}, findings=[]),
    "basic": dict(prog="runtime_cases", args=["basic"], real=True,
                  base={"malloc": RS, "memset": RS, "malloc_host": RS, "free": RS,
                        "free_host": RS, "free_null": RS},
                  shim={}, findings=[]),
    "basic-static": dict(prog="runtime_cases_static", real_prog="runtime_cases_static_real",
                         args=["basic"], real=True,
                         base={"malloc": RS, "memset": RS, "malloc_host": RS, "free": RS,
                               "free_host": RS, "free_null": RS},
                         shim={}, findings=[]),
    "P29": dict(prog="runtime_cases", args=["P29"], real=True,
                base={"first_free": RS, "second_free": RIV, "last_error": RIV},
                shim={"second_free": RS, "last_error": RS},
                findings=[("double-free", "skip")]),
    "P29-static": dict(prog="runtime_cases_static", real_prog="runtime_cases_static_real",
                       args=["P29"], real=True,
                       base={"first_free": RS, "second_free": RIV, "last_error": RIV},
                       shim={"second_free": RS, "last_error": RS},
                       findings=[("double-free", "skip")]),
    "P29-report": dict(prog="runtime_cases", args=["P29"], real=True,
                       shim_env={"CUMEMGUARD_MODE": "report"},
                       base={"first_free": RS, "second_free": RIV, "last_error": RIV},
                       shim={}, findings=[("double-free", "forward")]),
    # Report mode with a quarantine: the held first free happens when the second is forwarded, so
    # the caller sees what it would without the shim, and the quarantine never frees it again.
    "P29-report-quarantine": dict(prog="runtime_cases", args=["P29"], real=True,
                                  shim_env={"CUMEMGUARD_MODE": "report",
                                            "CUMEMGUARD_QUARANTINE": "16M"},
                                  base={"first_free": RS, "second_free": RIV, "last_error": RIV},
                                  shim={}, findings=[("double-free", "forward")]),
    "P30": dict(prog="runtime_cases", args=["P30"], real=True,
                base={"reused": "1", "stale_free": RS, "owner_free": RIV},
                shim={"owner_free": RS},
                findings=[("double-free", "skip")]),
    "P30-quarantine": dict(prog="runtime_cases", args=["P30"], real=True,
                           shim_env={"CUMEMGUARD_QUARANTINE": "16M"},
                           base={"reused": "1", "stale_free": RS, "owner_free": RIV},
                           # p is held, so the driver hands out another address and the stale
                           # free is caught as what it is.
                           shim={"reused": "0", "owner_free": RS},
                           findings=[("double-free", "skip")]),
    "invalid": dict(prog="runtime_cases", args=["invalid"], real=True,
                    base={"interior": Err(RIV), "host_to_cudaFree": Err(RIV),
                          "device_to_cudaFreeHost": Err(RIV), "never_allocated": Err(RIV)},
                    shim={}, findings=[("invalid-free", "forward")] * 4),
    "host_double": dict(prog="runtime_cases", args=["host_double"], real=True,
                        base={"first_free": RS, "second_free": Err(RIV)},
                        shim={"second_free": RS}, findings=[("double-free", "skip")]),
    # Stream-ordered memory may be re-allocated by a graph launch the shim does not see, so a
    # second cudaFreeAsync is forwarded and reported only because the driver refuses it.
    "async_double": dict(prog="runtime_cases", args=["async_double"], real=True,
                         base={"first_free": RS, "second_free": Err(RIV)},
                         shim={}, findings=[("double-free", "forward")]),
    "driver_double": dict(prog="runtime_cases", args=["driver_double"], real=True,
                          base={"first_free": S, "second_free": IV},
                          shim={"second_free": S}, findings=[("double-free", "skip")]),
    "leak": dict(prog="runtime_cases", args=["leak"], real=True, base={"leaked": RS}, shim={},
                 findings=[]),
    "threads": dict(prog="runtime_cases", args=["threads"], real=True,
                    base={"failures": "0", "calls": "8000"}, shim={}, findings=[]),
    # Forks while the other threads sit idle: a sanitized build leak-checks what the children
    # inherit from the shim (the stack-walk caches of threads that stayed in the parent).
    "fork-quiet": dict(prog="runtime_cases", args=["fork-quiet"], real=True,
                       shim_env={"CUMEMGUARD_STACKS": "16"},
                       base={"children_ok": "5", "free": RS}, shim={}, findings=[]),
    "fork": dict(prog="runtime_cases", args=["fork"], real=True,
                 base={"children_ok": "20", "free": RS}, shim={}, findings=[]),
    # Lookups only: no memory call, so the shim stays silent and writes no log (nolog).
    "gpa": dict(prog="gpa_cases", args=[], real=True, nolog=True,
                base={"p23.dlsym_gpa": "libcuda", "p23.gpa_11030_status": "0",
                      "p23.gpa_12000_status": "0", "p23.self_11030": "libcuda",
                      "p23.self_12000": "libcuda", "p23.self_differ": "1",
                      "p23.cuinit": "libcuda", "p23.later_lookup_cuMemCreate": "libcuda",
                      "p23.cuMemCreate_10020_same": "1",
                      "p24.allocasync_legacy": "libcuda", "p24.allocasync_ptsz": "libcuda",
                      "p24.allocasync_differ": "1", "p24.ctxsync_differ": "1",
                      "p24.ctxsync_2000": "libcuda", "p24.ctxcreate_differ": "1",
                      "p24.ipcopen_4010": "libcuda", "p24.ipcopen_11000": "libcuda",
                      "p24.ipcopen_differ": "1", "p24.memalloc_3020": "libcuda",
                      "p24.missing_status": "0", "p24.missing_ptr": "null",
                      "p24.missing_symstatus": "1", "p25.dlsym_cuInit": "libcuda",
                      "p25.dlsym_cuMemUnmap": "libcuda", "rt.entry_point_status": "0",
                      "rt.entry_point_cuMemMap": "libcuda", "rtld_next.probe": "nextbase"},
                shim={"p23.dlsym_gpa": "shim", "p23.self_11030": "shim",
                      "p23.self_12000": "shim", "p23.later_lookup_cuMemCreate": "shim",
                      "p24.allocasync_legacy": "shim", "p24.allocasync_ptsz": "shim",
                      "p24.ipcopen_4010": "shim", "p24.ipcopen_11000": "shim",
                      "p24.memalloc_3020": "shim", "p25.dlsym_cuMemUnmap": "shim",
                      "rt.entry_point_cuMemMap": "shim"},
                findings=[]),
    "nccl-plt": dict(prog="nccl_cases", args=["plt"], real=True,
                     base={"plt.get_id": "0", "plt.init": "0", "plt.split": "0",
                           "plt.all_reduce": "0", "plt.result_ok": "1",
                           "plt.destroy_child": "0", "plt.destroy": "0"},
                     shim={}, findings=[]),
    "nccl-ctypes": dict(prog="nccl_cases", args=["ctypes"], real=True,
                        base={"ctypes.init_from": "nccl", "ctypes.get_id": "0",
                              "ctypes.init": "0", "ctypes.all_reduce": "0",
                              "ctypes.result_ok": "1", "ctypes.destroy": "0"},
                        shim={"ctypes.init_from": "shim"}, findings=[]),
    # Transport-aware cleanup (docs/transport.md). Each collective holds the fake device 300 ms.
    "P17": dict(prog="flush_cases", args=["p17"], real=True, env=P17_ENV, varies=P17_TIMES,
                base=P17_BASE, shim={}, findings=[("opportunistic-flush", "forward")] * 4),
    "P17-defer": dict(prog="flush_cases", args=["p17"], real=True, env=P17_ENV, varies=P17_TIMES,
                      shim_env={"CUMEMGUARD_OPPORTUNISTIC": "defer"},
                      base=P17_BASE, shim={}, findings=[("opportunistic-flush", "defer")] * 4),
    "P18": dict(prog="flush_cases", args=["p18"], env={"FAKECUDA_DEVICE_MEMORY": "96M"},
                shim_env={"CUMEMGUARD_OPPORTUNISTIC": "defer"},
                base={"init": "0", "flush1.released": "3", "big_alloc": "cudaSuccess",
                      "flush2.released": "2", "linear_bytes_before_release": "0",
                      "release_deferred": "absent", "linear_bytes_after_release": "0",
                      "flush3.released": "1", "destroy": "0"},
                shim={"linear_bytes_before_release": str(48 << 20),
                      "release_deferred": str(48 << 20)},
                findings=[("opportunistic-flush", "defer")] * 6),
    # The third 24 MiB free of the first flush would take the held bytes past 50 MiB.
    "P18-limit": dict(prog="flush_cases", args=["p18"], env={"FAKECUDA_DEVICE_MEMORY": "96M"},
                      shim_env={"CUMEMGUARD_OPPORTUNISTIC": "defer",
                                "CUMEMGUARD_DEFER_LIMIT": "50M"},
                      base={"init": "0", "flush1.released": "3", "big_alloc": "cudaSuccess",
                            "flush2.released": "2", "linear_bytes_after_release": "0",
                            "flush3.released": "1", "destroy": "0"},
                      shim={"linear_bytes_before_release": str(48 << 20),
                            "release_deferred": str(48 << 20)},
                      findings=[("opportunistic-flush", "defer")] * 5 +
                               [("opportunistic-flush", "forward")]),
    "P19": dict(prog="flush_cases", args=["p19"], env={"FAKECUDA_DEVICE_MEMORY": "96M"},
                shim_env={"CUMEMGUARD_OPPORTUNISTIC": "defer"},
                base={"init": "0", "oom_path.result": "cudaSuccess", "oom_path.released": "3",
                      "oom_path.cached_bytes": "0", "flush.released": "1",
                      "intentional.freed_now": "1", "vmm.create": S, "vmm.release": S,
                      "flush2.released": "2", "nccl_init2": "0", "destroy2": "0",
                      "destroy": "0", "release_errors": "0"},
                shim={}, findings=[("opportunistic-flush", "defer")] * 3),
    "sticky-failed": dict(prog="flush_cases", args=["sticky-failed"],
                          env={"FAKECUDA_FAIL": "cuMemCreate:1:OOM"},
                          base={"pre.released": "1", "init": "1", "flush.released": "1",
                                "flush_ms_at_least_200": "1"},
                          shim={}, findings=[("opportunistic-flush", "forward")]),
    "nonblocking": dict(prog="flush_cases", args=["nonblocking"], real=True,
                        base={"get_id": "0", "init": "7", "flush.released": "1", "async": "0",
                              "destroy": "0"},
                        shim={}, findings=[("opportunistic-flush", "forward")]),
    "trim": dict(prog="flush_cases", args=["trim"], real=True,
                 base={"init": "0", "trim": "cudaSuccess", "destroy": "0"},
                 shim={}, findings=[("opportunistic-flush", "forward")]),
    "trim-defer": dict(prog="flush_cases", args=["trim"], real=True,
                       shim_env={"CUMEMGUARD_OPPORTUNISTIC": "defer"},
                       base={"init": "0", "trim": "cudaSuccess", "destroy": "0"},
                       shim={}, findings=[("opportunistic-flush", "skip")]),
    # A suspended communicator is not live for suppression (the cleanup contract with vLLM's sleep mode).
    "suspend-flush": dict(prog="flush_cases", args=["suspend"],
                          base={"capi": "absent", "init": "0", "live.released": "1", "suspend": "0",
                                "suspended.released": "1", "resume": "0",
                                "resumed.released": "1", "destroy": "0"},
                          shim={"capi": "present", "suspended.ran": "1", "resumed.ran": "0"},
                          findings=[("opportunistic-flush", "forward")] * 2),
    "capi-race": dict(prog="flush_cases", args=["capi-race"], real=True,
                      base={"capi": "absent"},
                      shim={"capi": "present", "before.suppressed": "0", "init": "0",
                            "race.ran": "1", "race.released": "1", "race.saw_init_enter": "1",
                            "race.init_returned_during_flush": "0", "race.init_after_flush": "1",
                            "after.ran": "0",
                            "after.callback_calls": "0", "after.suppressed": "1", "destroy": "0",
                            "after_destroy.suppressed": "1"},
                      findings=[]),
    "capi-ctypes": dict(script="capi_ctypes.py", args=[], real=True,
                        base={"api": "absent", "before.suppressed": "0", "before.ran": "1",
                              "before.callback_calls": "1", "flush.free": "0", "suppressed": "0",
                              "after.ran": "1", "after.callback_calls": "2",
                              "release_deferred": "absent", "intentional.free": None},
                        shim={"api": "present", "suppressed": "1", "after.ran": "0",
                              "after.callback_calls": "1", "release_deferred": "0",
                              "intentional.free": "0"},
                        findings=[]),

    # Legacy IPC on VMM memory (bug-patterns.md P11-P16) and the bridge. The importer is the
    # exporter's child; its steps start with "imp." and its findings are `child_findings`.
    "P11": dict(prog="ipc_bridge", args=["P11"], real=True,
                base={"base_is_reservation": "1", "export": RIV, "driver_export_calls": "1",
                      "bridge_handle": "0"},
                shim={}, findings=[("ipc-vmm", "forward")]),
    "P11-torch": dict(prog="ipc_bridge", args=["P11"], real=True,
                      env={"PYTORCH_ALLOC_CONF":
                           "garbage_collection_threshold:0.8,expandable_segments:True"},
                      base={"export": RIV}, shim={}, findings=[("ipc-vmm", "forward")]),
    "P11-deny": dict(prog="ipc_bridge", args=["P11"], real=True,
                     shim_env={"CUMEMGUARD_IPC": "deny"},
                     base={"export": RIV, "driver_export_calls": "1"},
                     shim={"driver_export_calls": "0"}, findings=[("ipc-vmm", "skip")]),
    "P11-bridge": dict(prog="ipc_bridge", args=["P11"], real=True, bridge=True,
                       base={"export": RIV, "bridge_handle": "0", "imp.open": None},
                       shim={"export": RS, "driver_export_calls": "0", "bridge_handle": "1",
                             "imp.open": RS, "imp.read": S, "imp.pattern_ok": "1",
                             "imp.reserved_bytes": str(2 * 2 << 20), "imp.close": RS,
                             "imp.reserved_after": "0", "imp.mappings_after": "0",
                             "imp.fd_delta": "0", "importer_exit": "0"},
                       findings=[], child_findings=[]),
    # The peer runs without the shim: its driver refuses the bridge's bytes, and the exporter's
    # summary names the export nobody opened.
    "ipc-one-sided": dict(prog="ipc_bridge", args=["one-sided"], real=True, bridge=True,
                          base={"export": RIV, "bridge_handle": "0", "imp.open": None},
                          shim={"driver_export_calls": "0", "export": RS, "bridge_handle": "1", "imp.open": Err(RIV),
                                "importer_exit": "0"},
                          findings=[], child_findings=None),
    "P12": dict(prog="ipc_bridge", args=["P12"], real=True,
                base={"base_is_reservation": "0", "export": RIV}, shim={},
                findings=[("ipc-vmm", "forward")]),
    "P12-bridge": dict(prog="ipc_bridge", args=["P12"], real=True, bridge=True,
                       base={"export": RIV},
                       shim={"bridge_handle": "1", "driver_export_calls": "0", "imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 * 2 << 20), "export": RS, "imp.open": RS, "imp.pattern_ok": "1",
                             "imp.close": RS, "importer_exit": "0"},
                       findings=[], child_findings=[]),
    "P13": dict(prog="ipc_bridge", args=["P13"], real=True, bridge=True,
                base={"export": RIV},
                shim={"imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "export": RS, "imp.seccomp_installed": "1", "imp.pidfd_open_blocked": "1",
                      "imp.pidfd_getfd_blocked": "1", "imp.open": RS, "imp.pattern_ok": "1",
                      "imp.reserved_bytes": str(3 * 2 << 20), "imp.close": RS,
                      "importer_exit": "0"},
                findings=[], child_findings=[]),
    "P14": dict(prog="ipc_bridge", args=["P14"], real=True, bridge=True,
                base={"export1": IV, "export2": IV, "imp.open": None},
                shim={"imp.after_close1.read": S, "imp.read": S, "imp.reserved_bytes": str(2 * 2 << 20), "export1": S, "export2": S, "handles_equal": "1", "imp.open": S,
                      "imp.handles_equal": "1", "imp.open2": S, "imp.same_ptr": "1",
                      "imp.pattern_ok": "1", "imp.close1": S, "imp.after_close1.pattern_ok": "1",
                      "imp.close": S, "imp.close_again": Err(IV), "imp.reserved_after": "0",
                      "imp.mappings_after": "0", "imp.fd_delta": "0", "exp.fd_delta": "0",
                      "importer_exit": "0"},
                findings=[], child_findings=[]),
    "P15": dict(prog="ipc_bridge", args=["P15"], real=True, bridge=True,
                base={"create_fabric": "CUDA_ERROR_NOT_PERMITTED", "create_posix": S,
                      "export": RIV},
                shim={"imp.close": RS, "imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 << 20), "export": RS, "imp.open": RS, "imp.pattern_ok": "1", "importer_exit": "0"},
                findings=[], child_findings=[]),
    "P15-accept": dict(prog="ipc_bridge", args=["P15"], bridge=True,
                       env={"FAKECUDA_FABRIC": "accept"},
                       base={"create_fabric": S, "export_fabric_fd": IV, "export": RIV},
                       shim={"imp.close": RS, "imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 << 20), "export": RS, "imp.open": RS, "imp.pattern_ok": "1",
                             "importer_exit": "0"},
                       findings=[], child_findings=[]),
    "P15-report": dict(prog="ipc_bridge", args=["P15"], env={"FAKECUDA_FABRIC": "accept"},
                       base={"create_fabric": S, "export_fabric_fd": IV, "export": RIV},
                       shim={}, findings=[("ipc-vmm", "forward")]),
    "P15-host": dict(prog="ipc_bridge", args=["P15-host"], bridge=True,
                     base={"create_host": S, "export": RIV}, shim={},
                     findings=[("ipc-vmm", "forward")]),
    "P16": dict(prog="ipc_bridge", args=["P16"], real=True, bridge=True,
                base={"export": RIV, "legacy.export": RS, "imp.j1.open": RS,
                      "imp.j1.pattern_ok": "1", "legacy.free": RS, "imp.j1.close": RS},
                shim={"imp.after_free.read": S, "imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 * 2 << 20), "export": RS, "imp.open": RS, "imp.pattern_ok": "1", "free.unmap0": S,
                      "free.release0": S, "free.unmap1": S, "free.release1": S,
                      "imp.after_free.pattern_ok": "1", "imp.close": RS, "importer_exit": "0"},
                findings=[("free-exported", "forward")], child_findings=[]),
    "ipc-multi": dict(prog="ipc_bridge", args=["multi"], real=True, bridge=True,
                      base={"export": IV},
                      shim={"imp.fd_delta": "0", "imp.mappings_after": "0", "imp.page4.read": S, "imp.read": S, "export": S, "imp.open": S, "imp.reserved_bytes": str(4 * 2 << 20),
                            "imp.pattern_ok": "1", "imp.gap_read": Err(IV),
                            "imp.page4.pattern_ok": "1", "imp.close": S,
                            "imp.reserved_after": "0", "importer_exit": "0"},
                      findings=[], child_findings=[]),
    "ipc-forged": dict(prog="ipc_bridge", args=["forged"], real=True, bridge=True,
                       base={"export": IV},
                       shim={"imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 << 20), "export": S, "imp.bad_check": IV, "imp.truncated": IV,
                             "imp.bad_nonce": "CUDA_ERROR_INVALID_HANDLE",
                             "imp.unknown_export": "CUDA_ERROR_INVALID_HANDLE",
                             "imp.wrong_tag": "CUDA_ERROR_MAP_FAILED",
                             "imp.same_process": "CUDA_ERROR_INVALID_CONTEXT",
                             "imp.not_ours": Err(IV), "imp.hostile_short": "1",
                             "imp.hostile_with_fd": "1", "imp.hostile_magic": "1",
                             "imp.hostile_op": "1", "imp.hostile_big": "1", "imp.open": S,
                             "imp.pattern_ok": "1", "imp.close": S, "imp.fd_delta": "0",
                             "importer_exit": "0"},
                       findings=[], child_findings=[("ipc-vmm", "skip")] * 6),
    "ipc-exited": dict(prog="ipc_bridge", args=["exited"], real=True, bridge=True,
                       # without the shim the handles are all zero: the driver refuses them
                       base={"open": Err(IV)},
                       shim={"after_exit.read": S, "read": S, "open": S, "pattern_ok": "1", "exporter_exit": "0",
                             "after_exit.pattern_ok": "1", "close": S,
                             "open_after_exit_drv": "CUDA_ERROR_MAP_FAILED",
                             "open_after_exit_rt": "cudaErrorMapBufferObjectFailed"},
                       findings=[("ipc-vmm", "skip")] * 2, child_findings=[]),
    "ipc-peer-uid": dict(prog="ipc_bridge", args=["peer-uid"], real=True, bridge=True,
                         base={"export": IV},
                         shim={"export": S, "imp.open": "cudaErrorMapBufferObjectFailed",
                               "imp.raw_status": "4", "importer_exit": "0"},
                         findings=[]),
    "ipc-fork": dict(prog="ipc_bridge", args=["fork"], real=True, bridge=True,
                     base={"export": IV, "child.listener_found": "0"},
                     shim={"imp.close": S, "imp.fd_delta": "0", "imp.mappings_after": "0", "imp.read": S, "imp.reserved_after": "0", "imp.reserved_bytes": str(2 << 20), "export": S, "child.listener_found": "1", "child.holds_listener": "0",
                           "child_exit": "0", "imp.open": S, "imp.pattern_ok": "1",
                           "importer_exit": "0"},
                     findings=[], child_findings=[]),
    # Found by tests/stress (docs/reliability.md): a handle value issued again on this thread by an
    # import or a retain, right after a no-op unmap of the range it backed before, was taken for
    # the stale release of the pairing rule, and its legitimate release was swallowed (leaked).
    "import-pairing": dict(prog="regress_cases", args=["import-pairing"],
                           base={"noop_unmap": S, "value_reused": "1", "fresh_release": S,
                                 "fresh_live_after": "0"},
                           shim={}, findings=[("unmap-unmapped", "skip")]),
    "retain-pairing": dict(prog="regress_cases", args=["retain-pairing"],
                           base={"noop_unmap": S, "value_reused": "1", "fresh_release": S,
                                 "fresh_live_after": "0"},
                           shim={}, findings=[("unmap-unmapped", "skip")]),
    "ipc-deny": dict(prog="regress_cases", args=["ipc-deny"], shim_env={"CUMEMGUARD_IPC": "deny"},
                     base={"ipc_get": IV}, shim={}, findings=[("ipc-vmm", "skip")]),
    # An address or handle value issued again through a path the shim does not see (a library
    # holding the driver's own entry point), then freed by the program: forwarded, and the driver
    # frees the memory; the double free after it is still skipped. Not re-issued (the real driver
    # usually does, D18): variants().
    "unseen-linear": dict(prog="unseen_cases", args=["linear"], real=True,
                          base={"live_before": "0", "first_free": S, "unseen_alloc": S,
                                "reused": "1", "live_unseen": str(1 << 20), "reissued_free": S,
                                "live_after": "0", "double_free": IV},
                          shim={"double_free": S},
                          findings=[("unseen-reissue", "forward"), ("double-free", "skip")]),
    "unseen-linear-report": dict(prog="unseen_cases", args=["linear"], real=True,
                                 shim_env={"CUMEMGUARD_MODE": "report"},
                                 base={"reused": "1", "reissued_free": S, "live_after": "0",
                                       "double_free": IV},
                                 shim={},
                                 findings=[("unseen-reissue", "forward"),
                                           ("double-free", "forward")]),
    "unseen-runtime": dict(prog="unseen_cases", args=["runtime"], real=True,
                           base={"live_before": str(1 << 20), "first_free": RS, "unseen_alloc": S,
                                 "reused": "1", "reissued_free": RS, "live_after": "0",
                                 "double_free": RIV, "last_error": RIV},
                           shim={"double_free": RS, "last_error": RS},
                           findings=[("unseen-reissue", "forward"), ("double-free", "skip")]),
    "unseen-handle": dict(prog="unseen_cases", args=["handle"], real=True,
                          base={"live_before": "0", "first_release": S, "unseen_create": S,
                                "reused": "1", "live_unseen": "1", "reissued_release": S,
                                "live_after": "0", "double_release": IV},
                          # The driver cannot tell a released handle value from a live one
                          # (real-driver.md D23): the release of the value issued again unseen
                          # is skipped as a double release, and its memory stays live (a leak,
                          # docs/limitations.md); the linear twin forwards it (unseen-linear).
                          shim={"reissued_release": S, "live_after": "1", "double_release": S},
                          findings=[("double-release", "skip"), ("double-release", "skip")]),
    # Strict mode aborts at findings, not at an unseen re-issue: the program's call is legitimate.
    # Whether the value was issued again is read from the shim's own log (strict_reuse()): the
    # run without the shim may differ from the run with it on the real driver (docs/gpu/run-6.txt:
    # reused without the shim, not with it). Not re-issued, strict mode aborts at the second
    # release of the fresh value (release-unknown: the shim never saw it created):
    # unseen-handle-strict-fresh on the fake, told not to reuse values.
    "unseen-handle-strict": dict(prog="unseen_cases", args=["handle"], real=True,
                                 shim_env={"CUMEMGUARD_MODE": "strict",
                                           "CUMEMGUARD_ACTION_DOUBLE_RELEASE": "forward"},
                                 base={"reused": "1", "reissued_release": S, "live_after": "0",
                                       "double_release": IV},
                                 shim={},
                                 findings=[("unseen-reissue", "forward"),
                                           ("double-release", "forward")],
                                 strict_reuse=True),
    "unseen-handle-strict-fresh": dict(prog="unseen_cases", args=["handle"],
                                       env={"FAKECUDA_HANDLE_REUSE": "0"},
                                       shim_env={"CUMEMGUARD_MODE": "strict",
                                                 "CUMEMGUARD_ACTION_DOUBLE_RELEASE": "forward"},
                                       base={"reused": "0", "reissued_release": S,
                                             "live_after": "0", "double_release": IV},
                                       shim={}, findings=[("release-unknown", "abort")],
                                       strict_reuse=False),
}


CASES.update(capture_checks.CASES)
CASES.update(nccl_cases.CASES)


def parse_steps(text):
    steps = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            steps[parts[0]] = parts[1].strip()
    return steps


def read_log(path):
    """Every line must be valid JSON; returns the records."""
    recs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise AssertionError(f"{path}:{n}: not JSON ({e}): {line[:200]!r}")
    return recs


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def compare_steps(got, want, label, real, exact=False, varies=()):
    """`exact`: every step printed must be one of `want` (or vary)."""
    for k, v in want.items():
        if k in varies:
            continue
        if v is None:
            expect(k not in got, f"{label}: step {k} should not appear; got {got.get(k)!r}")
            continue
        expect(k in got, f"{label}: step {k} missing; got {got}")
        if got[k] == "n/a" and v != "n/a":
            expect(real, f"{label}: {k} = n/a on the fake driver, which can always observe it")
            continue
        if isinstance(v, Err) and real:
            expect(got[k] not in (S, RS), f"{label}: {k} should fail, got {got[k]}")
        else:
            expect(got[k] == v, f"{label}: {k} = {got[k]}, expected {v}")
    if exact:
        extra = sorted(k for k in got if k not in want and k not in varies)
        expect(not extra, f"{label}: steps the run without the shim did not print: "
               f"{ {k: got[k] for k in extra} }")


def run(cmd, env, timeout=120):
    # A sanitized build runs several times slower (tools/dev sanitize sets the multiplier).
    timeout *= float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check_log_basics(recs, path):
    expect(recs, f"{path}: empty log")
    expect(recs[0].get("cumemguard_log") == 1, f"{path}: first line is not a format-1 header")
    expect(recs[-1].get("k") == "end", f"{path}: no end record (last: {recs[-1]})")
    kinds = [r.get("k") for r in recs]
    expect("summary" in kinds, f"{path}: no summary record")


def check_flushes(name, recs, steps, shim_steps, real, build, log_path):
    """P17-P19, sticky, trims and the C API: findings with their blocked time, bytes, call site and
    what suppressed them; frees held and released; intentional frees never held."""
    calls = [r for r in recs if r.get("k") == "call"]
    findings = [r for r in recs if r.get("k") == "finding"]
    summary = next(r for r in recs if r.get("k") == "summary")
    transport = summary["transport"]
    nccl = [r for r in recs if r.get("k") == "nccl"]
    init = next((r for r in nccl if r["event"] == "init"), None)
    deferred = [c for c in calls if c.get("deferred")]
    released = [c for c in calls if c.get("released_from") == "deferred"]
    flush_frees = [c for c in calls if c["api"] == "cudaFree" and c["args"].get("size") in
                   (8 << 20, 24 << 20, 45 << 20, 48 << 20)]
    for f in findings:
        st = f["state"]
        expect("emptyCache" in st["flush_frame"], f"{name}: flush frame {st['flush_frame']!r}")
        expect(" <- " in st["site"], f"{name}: site {st['site']!r}")
        expect("stack" in f, f"{name}: finding without a stack: {f}")
        rel = {r["what"]: r for r in f.get("related", [])}
        if init is not None:
            expect(rel.get("suppressed from", {}).get("seq") == init["seq"],
                   f"{name}: 'suppressed from' does not name the NCCL init: {f.get('related')}")
    if name in ("P17", "P17-defer"):
        expect(init and init.get("suppressed") is True, f"{name}: init record {init}")
        for f in findings:
            expect(f["bytes"] == 8 << 20, f"{name}: bytes {f.get('bytes')}")
            expect("NativeCachingAllocator::emptyCache" in f["state"]["flush_frame"],
                   f"{name}: flush frame {f['state']['flush_frame']}")
            # The call site is the program's call into the caching library (p17 in flush_cases).
            expect(f["state"]["site"].endswith("(flush_cases)") and "p17" in f["state"]["site"],
                   f"{name}: site {f['state']['site']}")
        expect([f["state"]["live"] for f in findings] == [1, 1, 1, 0],
               f"{name}: live communicators at each flush {[f['state']['live'] for f in findings]}")
        expect("sticky" in findings[-1]["msg"], f"{name}: {findings[-1]['msg']}")
        # The flush before NCCL started is a plain free.
        first = flush_frees[0]
        expect(first["seq"] < init["seq"] and not first.get("deferred"), f"{name}: first free {first}")
        # Two call sites: the flush in the training loop (3 times) and the one after teardown.
        sites = sorted(transport["sites"], key=lambda x: -x["count"])
        expect(len(sites) == 2 and [x["count"] for x in sites] == [3, 1] and
               sites[0]["bytes"] == 3 * (8 << 20) and sites[0]["stack"] == findings[0]["stack"],
               f"{name}: sites {sites}")
        expect(transport["suppressed"] is True and transport["live"] == 0 and
               transport["communicators_created"] == 1, f"{name}: transport {transport}")
        if name == "P17":
            expect(not deferred, f"{name}: frees held in report mode")
            if not real:
                blocked = [f.get("blocked_ns", 0) for f in findings]
                expect(all(b >= MS200 for b in blocked), f"{name}: blocked {blocked}")
                expect(sites[0]["blocked_ns"] >= 3 * MS200 and sites[0]["max_blocked_ns"] >= MS200,
                       f"{name}: site {sites[0]}")
                expect(int(shim_steps["flush.min_ms"]) >= 200 and
                       int(shim_steps["intentional.max_ms"]) < 100, f"{name}: steps {shim_steps}")
            # The report shows the local flush frame by name, its bytes and the blocked time.
            rep = subprocess.run([os.path.join(build, "tools", "cumemguard"), "report", log_path],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            out = rep.stdout
            expect("opportunistic-flush: 4 findings at 2 stacks" in out and
                   "NativeCachingAllocator::emptyCache" in out and "blocked" in out,
                   f"{name}: report output:\n{out}")
        else:
            expect(len(deferred) == 4 and all(c["args"]["size"] == 8 << 20 for c in deferred),
                   f"{name}: deferred calls {deferred}")
            # Nothing went back before exit, and the exit path makes no CUDA call: all four are
            # still held at exit, counted in the summary, and go back with the process.
            expect(not released and summary.get("held_at_exit", {}).get("deferred") ==
                   {"frees": 4, "bytes": 4 * (8 << 20)},
                   f"{name}: released {released}, held at exit {summary.get('held_at_exit')}")
            expect(transport["deferred_released_bytes"] == 0 and
                   [x["deferred"] for x in sites] == [3, 1], f"{name}: transport {transport}")
            if not real:
                # The flushes returned at once; the program's own frees went to the driver and
                # waited for the collective: they were not held.
                expect(int(shim_steps["flush.max_ms"]) < 100 and
                       int(shim_steps["intentional.min_ms"]) >= 200, f"{name}: steps {shim_steps}")
            mine = [c for c in calls if c["api"] == "cudaFree" and c["args"].get("size") == 1 << 20]
            expect(len(mine) == 3 and not any(c.get("deferred") for c in mine),
                   f"{name}: intentional frees {mine}")
    if name == "P18":
        big = next(c for c in calls if c["api"] == "cudaMalloc" and c["args"].get("size") == 48 << 20)
        expect(big["res"] == 0 and big["args"].get("retried_after_release") == 1,
               f"{name}: the 48 MiB allocation {big}")
        at_oom = [c for c in released if big["ts"] <= c["ts"] <= big["ts"] + big["dur"]]
        expect(len(at_oom) == 3, f"{name}: released during the failed allocation: {at_oom}")
        req = next(c for c in calls if c["api"] == "cumemguard_release_deferred")
        expect(req["args"]["bytes"] == 48 << 20, f"{name}: release request {req}")
        # Three at the out-of-memory retry, two on request; the last one is held at exit.
        expect(len(released) == 5 and len(deferred) == 6 and
               summary.get("held_at_exit", {}).get("deferred") == {"frees": 1, "bytes": 24 << 20},
               f"{name}: deferred {len(deferred)}, released {len(released)}, held at exit "
               f"{summary.get('held_at_exit')}")
        expect(transport["deferred_released_bytes"] == 5 * (24 << 20), f"{name}: {transport}")
    if name == "P18-limit":
        fwd = [f for f in findings if f["action"] == "forward"]
        expect(len(fwd) == 1 and fwd[0]["state"]["over_limit"] is True and
               "CUMEMGUARD_DEFER_LIMIT" in fwd[0]["msg"] and fwd[0]["state"]["held_bytes"] == 48 << 20,
               f"{name}: the free past the limit {fwd}")
        fwd_call = next(c for c in calls if c["seq"] == fwd[0]["call_seq"])
        expect(fwd_call["res"] == 0 and not fwd_call.get("deferred") and
               fwd_call.get("delta") == -(24 << 20), f"{name}: its call {fwd_call}")
        notes = [r for r in recs if r.get("k") == "note" and "CUMEMGUARD_DEFER_LIMIT" in r["msg"]]
        expect(len(notes) == 1 and notes[0]["level"] == "warning", f"{name}: warnings {notes}")
        expect(len(deferred) == 5 and len(released) == 4 and
               summary.get("held_at_exit", {}).get("deferred") == {"frees": 1, "bytes": 24 << 20},
               f"{name}: deferred {len(deferred)}, released {len(released)}, held at exit "
               f"{summary.get('held_at_exit')}")
    if name == "P19":
        # The OOM path's frees (inside DeviceCachingAllocator::malloc) went through at once.
        oom = [c for c in calls if c["api"] == "cudaFree" and c["args"].get("size") == 24 << 20]
        expect(len(oom) == 3 and not any(c.get("deferred") for c in oom), f"{name}: {oom}")
        create = next(c for c in calls if c["api"] == "cuMemCreate" and c["args"].get("size") == 64 << 20)
        expect(create["res"] == 0 and create["args"].get("retried_after_release") == 1,
               f"{name}: cuMemCreate {create}")
        expect(len(deferred) == 3 and len(released) == 3, f"{name}: deferred {deferred}")
        inits = [r for r in nccl if r["event"] == "init"]
        expect(len(inits) == 2 and inits[1]["res"] == 0, f"{name}: inits {inits}")
        # NCCL's buffer for the second communicator was allocated after the held frees went back.
        expect(all(c["ts"] >= inits[1]["ts"] for c in released[-2:]), f"{name}: {released}")
    if name == "sticky-failed":
        expect(init["res"] == 1 and init.get("suppressed") is True and init["live"] == 0,
               f"{name}: init {init}")
        f = findings[0]
        expect(f.get("blocked_ns", 0) >= MS200 and "sticky" in f["msg"] and f["state"]["live"] == 0,
               f"{name}: finding {f}")
        expect(transport["communicators_created"] == 0, f"{name}: {transport}")
    if name == "nonblocking":
        expect(init["res"] == 7 and init["live"] == 1 and init.get("suppressed") is True,
               f"{name}: the in-progress init {init}")
        expect(findings[0]["state"]["live"] == 1, f"{name}: {findings[0]}")
        destroy = next(r for r in nccl if r["event"] == "destroy")
        expect(destroy["live"] == 0 and destroy["comm"] == init["comm"], f"{name}: {destroy}")
    if name in ("trim", "trim-defer"):
        f = findings[0]
        expect(f["api"] == "cudaMemPoolTrimTo" and f["state"]["target"] == "trim" and
               "CudaMallocAsyncAllocator::emptyCache" in f["state"]["flush_frame"],
               f"{name}: finding {f}")
        trims = [c for c in calls if c["api"] == "cudaMemPoolTrimTo"]
        expect(len(trims) == 1 and bool(trims[0].get("skipped")) == (name == "trim-defer"),
               f"{name}: trim calls {trims}")
    if name == "capi-race":
        maybe = [c for c in calls if c["api"] == "cumemguard_maybe_empty_cache"]
        expect([c["res"] for c in maybe] == [1, 0], f"{name}: {maybe}")
        expect(transport["flush_requests"] == {"ran": 1, "declined": 1}, f"{name}: {transport}")
    if name == "capi-ctypes":
        sup = [r for r in nccl if r["event"] == "suppress"]
        expect(len(sup) == 1 and sup[0].get("suppressed") is True and
               sup[0]["api"] == "cumemguard_suppress_opportunistic_cleanup", f"{name}: {sup}")
        maybe = [c for c in calls if c["api"] == "cumemguard_maybe_empty_cache"]
        expect([c["res"] for c in maybe] == [1, 0], f"{name}: {maybe}")
        expect(transport["suppressed_by"]["api"] == "cumemguard_suppress_opportunistic_cleanup",
               f"{name}: {transport}")


FLUSH_CASES = ("P17", "P17-defer", "P18", "P18-limit", "P19", "sticky-failed", "nonblocking",
               "suspend-flush",
               "trim", "trim-defer", "capi-race", "capi-ctypes")


def case_specific(name, recs, steps):
    calls = [r for r in recs if r.get("k") == "call"]
    summary = next(r for r in recs if r.get("k") == "summary")
    findings = [r for r in recs if r.get("k") == "finding"]
    by_seq = {r["seq"]: r for r in calls}
    if name in ("P01", "P03", "P05"):
        dr = next(f for f in findings if f["class"] == "double-release")
        first = next(r for r in dr["related"] if r["what"] == "first release")
        expect(by_seq[first["seq"]]["api"] == "cuMemRelease" and by_seq[first["seq"]]["res"] == 0,
               f"{name}: 'first release' does not name the earlier successful cuMemRelease")
        uu = next(f for f in findings if f["class"] == "unmap-unmapped")
        if name != "P05":
            sleep = next(r for r in uu["related"] if r["what"].startswith("earlier unmap"))
            expect(by_seq[sleep["seq"]]["api"] == "cuMemUnmap",
                   f"{name}: the sleep-time unmap is not named")
        else:
            expect(uu["state"]["state"] == "reserved, never mapped",
                   f"{name}: state of the never-mapped range: {uu['state']}")
        skipped = [c for c in calls if c.get("skipped")]
        expect(len(skipped) == 2, f"{name}: expected 2 skipped calls, got {len(skipped)}")
        expect(summary["live"].get("vmm", 0) == 0 and summary["live"].get("va", 0) == 0,
               f"{name}: objects live at exit: {summary['live']}")
    if name == "P02" and steps.get("b.reused_value") == "1":
        st = next(f for f in findings if f["class"] == "stale-release")
        whats = [r["what"] for r in st["related"]]
        expect("sleep-time unmap" in whats and "re-issue of the value" in whats,
               f"P02: related events {whats}")
        expect(summary["live"].get("vmm", 0) == 0, f"P02: live vmm at exit {summary['live']}")
    if name == "P06":
        f = findings[0]
        rng = f["state"]["range"]
        expect(rng[0]["mapped"] is True and rng[-1]["mapped"] is False,
               f"P06: mapped pieces not listed: {rng}")
    if name == "ipc-deny":
        ipc = next(c for c in calls if c["api"] == "cuIpcGetMemHandle")
        expect(ipc.get("skipped") is True and ipc["res"] == 1, f"ipc-deny: call record {ipc}")
    if name == "P10":
        expect(summary["live"].get("vmm", 0) == 0 and summary["live"].get("handles", 0) == 0,
               f"P10: live at exit {summary['live']}")
        creates = [c for c in calls if c["api"] == "cuMemCreate" and c["res"] == 0]
        expect(any(c["dev"] == -1 for c in creates), "P10: the host-located allocation is not "
               "accounted as host memory")
    if name == "P31":
        seq = [(c["api"], c["res"]) for c in calls if c["api"] in
               ("cuMemCreate", "cuMemMap", "cuMemSetAccess")]
        expect(seq == [("cuMemCreate", 2), ("cuMemMap", 1), ("cuMemSetAccess", 1)],
               f"P31: the failing chain in the log is {seq}")
        failing = [c for c in calls if c["api"] in ("cuMemMap", "cuMemSetAccess")]
        expect(all(c.get("va_state") == "reserved, never mapped" for c in failing),
               f"P31: the range's state is not recorded: {failing}")
    if name.startswith("tms-vmm"):
        creates = summary["calls"].get("cuMemCreate", 0)
        expect(creates >= 6 * 21, f"{name}: {creates} cuMemCreate seen (allocator's VMM calls)")
        live = summary["live"]
        expect(live.get("vmm", 0) == 0 and live.get("va", 0) == 0 and live.get("linear", 0) == 0,
               f"{name}: live at exit {live}")
    if name in ("busy-query", "busy-sync"):
        f = next(f for f in findings if f["class"] == "unmap-while-busy")
        expect(f["api"] == "cuMemUnmap" and f["state"]["dev"] == 0, f"{name}: {f}")
        expect(f["state"]["check"] == name[5:], f"{name}: check {f['state']}")
        mapping = next(r for r in f["related"] if r["what"] == "mapping")
        expect(by_seq[mapping["seq"]]["api"] == "cuMemMap", f"{name}: mapping {mapping}")
        waited = f["state"]["waited_ns"]
        if name == "busy-sync":
            # The shim waited for the queued work (about 300 ms) before the driver unmapped.
            expect(200_000_000 <= waited <= 3_000_000_000, f"{name}: waited {waited} ns")
        else:
            expect(waited == 0, f"{name}: waited {waited} ns")
    if (name.startswith("unseen-") and steps.get("reused") == "1" and
            any(f["class"] == "unseen-reissue" for f in findings)):
        # The free the driver performed is named with the earlier free the model knew of, and
        # nothing the program allocated through the shim is left. (The findings themselves are
        # compared exactly above: unseen-handle has none of this class.)
        f = next(f for f in findings if f["class"] == "unseen-reissue")
        earlier = [r for r in f["related"] if r["what"] in ("earlier free", "first release")]
        expect(earlier and by_seq[earlier[0]["seq"]]["res"] == 0 and
               by_seq[earlier[0]["seq"]]["api"] in ("cuMemFree_v2", "cudaFree", "cuMemRelease"),
               f"{name}: the earlier free is not named: {f['related']}")
        expect(f["res"] == 0 and f["state"]["driver"] == "live", f"{name}: {f}")
        expect("issued again through" in f["msg"], f"{name}: {f['msg']}")
        reissued = [c for c in calls if c["seq"] == f["call_seq"]]
        expect(reissued and not reissued[0].get("skipped") and reissued[0]["res"] == 0,
               f"{name}: the legitimate free's call record {reissued}")
        live = summary["live"]
        expect(live.get("linear", 0) == 0 and live.get("vmm", 0) == 0,
               f"{name}: live at exit {live}")
    if name == "wakefail":
        rel = [c for c in calls if c["api"] == "cuMemRelease"]
        expect(not rel[-1].get("skipped"), f"{name}: the legitimate release was skipped")
        expect(summary["live"].get("vmm", 0) == 0, f"{name}: leaked {summary['live']}")
    if name.startswith("sleep-"):
        # The skips leaked nothing: nothing is live in the model after teardown.
        live = summary["live"]
        expect(live.get("vmm", 0) == 0 and live.get("va", 0) == 0 and live.get("handles", 0) == 0,
               f"{name}: live at exit {live}")
        if name == "sleep-cycles":
            expect(int(steps.get("frees_while_asleep", "0")) > 0, f"{name}: no free while asleep")
            kinds = {f["class"] for f in findings}
            expect(kinds <= {"unmap-unmapped", "double-release"} and findings,
                   f"{name}: finding classes {kinds}")
    if name in ("basic", "basic-static"):
        names = summary["calls"]
        if name == "basic":
            # Recorded once, under the name the program called (the re-entry guard).
            expect(names.get("cudaMalloc") == 1 and "cuMemAlloc_v2" not in names,
                   f"basic: calls {names}")
            alloc = next(c for c in calls if c["api"] == "cudaMalloc")
            expect(alloc["args"]["size"] == 1 << 20 and alloc["delta"] == 1 << 20 and
                   alloc["mem"] == "linear" and alloc["dev"] == 0, f"basic: {alloc}")
        else:
            # Static cudart: seen through the driver layer only.
            expect(names.get("cuMemAlloc_v2", 0) >= 1 and "cudaMalloc" not in names,
                   f"basic-static: calls {names}")
        rows = {(b["dev"], b["mem"]): b for b in summary["bytes"]}
        expect(rows[(0, "linear")]["peak"] >= 1 << 20 and rows[(0, "linear")]["current"] == 0,
               f"{name}: bytes {summary['bytes']}")
        expect(rows[(-1, "host")]["total"] >= 4096, f"{name}: host bytes {summary['bytes']}")
    if name == "P30-quarantine":
        held = [c for c in calls if c["args"].get("held") == "quarantine"]
        released = [c for c in calls if c.get("released_from") == "quarantine"]
        # Both stay in the quarantine to the end: counted at exit, returned with the process (the
        # exit path makes no CUDA call).
        expect(len(held) == 2 and not released and
               summary.get("held_at_exit", {}).get("quarantine", {}).get("frees") == 2,
               f"{name}: held {len(held)}, released {len(released)}, held at exit "
               f"{summary.get('held_at_exit')} (expected 2, 0 and 2)")
    if name in ("P29", "P29-static", "P30", "P30-quarantine", "host_double", "async_double",
                "driver_double"):
        f = next(f for f in findings if f["class"] == "double-free")
        whats = {r["what"]: r for r in f["related"]}
        expect("allocation" in whats and "first free" in whats, f"{name}: related {whats}")
        expect(by_seq[whats["first free"]["seq"]]["res"] == 0, f"{name}: first free not named")
    if name == "leak":
        leaks = [r for r in recs if r.get("k") == "leak"]
        expect(any(l["what"] == "linear" and l["size"] == 3 << 20 for l in leaks),
               f"leak: leak records {leaks}")
    if name == "threads":
        expect(summary["calls"].get("cudaMalloc") == 4000,
               f"threads: cudaMalloc count {summary['calls'].get('cudaMalloc')}")
        expect(summary["live"].get("linear", 0) == 0, f"threads: live {summary['live']}")
    if name.startswith("nccl"):
        nccl = [r for r in recs if r.get("k") == "nccl"]
        inits = [r for r in nccl if r["event"] in ("init", "split")]
        destroys = [r for r in nccl if r["event"] == "destroy"]
        want = 2 if name == "nccl-plt" else 1
        expect(len(inits) == want and len(destroys) == want,
               f"{name}: nccl records {nccl}")
        expect(nccl[-1]["live"] == 0, f"{name}: communicators live at the end {nccl[-1]}")
        expect(inits[0].get("suppressed") is True, f"{name}: suppression not recorded at init")
        # NCCL's own memory traffic during init and destroy is recorded (not hidden behind the
        # NCCL hook), host-located allocations included, and none of it is a finding (P10).
        creates = [r for r in calls if r["api"] == "cuMemCreate" and r["res"] == 0]
        expect(len(creates) >= 2 and any(r["dev"] == -1 for r in creates),
               f"{name}: NCCL's cuMemCreate calls not recorded ({len(creates)})")
        expect(any(r["api"] == "cuMemRetainAllocationHandle" for r in calls),
               f"{name}: NCCL's retain not recorded")
        expect(summary["live"].get("vmm", 0) == 0, f"{name}: live vmm {summary['live']}")


def variants(name, c, steps, real):
    """Expectations for this run. The real driver re-issues a released handle value or address
    often but not always (real-driver.md D18: 47 of 50), so the value-reuse cases have a second
    variant there. The fake always re-issues the last released first: on it a case that did not
    reuse has tested nothing, and fails."""
    base, shim, findings = dict(c["base"]), dict(c["shim"]), c["findings"]
    if not real:
        return base, shim, findings
    if name == "P02" and steps.get("b.reused_value") == "0":
        # Not re-issued: the stale release is a plain double release.
        base.update({"b.reused_value": "0", "free.release": IV, "b.release": S})
        shim = {"free.release": S}
        findings = [("unmap-unmapped", "skip"), ("double-release", "skip")]
    if name == "sleep-aba" and steps.get("b_took_a_value") == "0":
        base = {"b_took_a_value": "0", "error.free_a": IV, "wake_ok": "1", "b_intact": "1",
                "second_cycle_ok": "1", "b_intact_after": "1", "teardown_error": "0"}
        shim = {"error.free_a": None}
        findings = [("unmap-unmapped", "skip"), ("double-release", "skip")]
    if name.startswith("unseen-") and steps.get("reused") == "0":
        # The driver handed out another address or value: the program's frees meet memory the
        # shim never saw, which it forwards; the second is refused and named as such.
        linear = "handle" not in name
        runtime = name == "unseen-runtime"
        ok, refused = (RS, RIV) if runtime else (S, IV)
        base = {"reused": "0", "reissued_free" if linear else "reissued_release": ok,
                "double_free" if linear else "double_release": refused}
        shim = {}
        findings = [("invalid-free" if linear else "release-unknown", "forward")]
    return base, shim, findings


def strict_reuse(name, c, tmp, real):
    """The strict unseen-handle cases: whether the handle value released first was issued again in
    the run with the shim, read from its log (the release after the first names the value the
    unseen create returned). On the fake the case says which it must be (the fake re-issues the
    last value released unless told not to): a run that did not do what the case tests fails."""
    logs = sorted(glob.glob(os.path.join(tmp, "log.*")))
    expect(len(logs) == 1, f"{name}: with shim: logs {logs}")
    recs = read_log(logs[0])
    calls = [r for r in recs if r.get("k") == "call"]
    create = [r for r in calls if r["api"] == "cuMemCreate"]
    rels = [r for r in calls if r["api"] == "cuMemRelease"]
    expect(len(create) == 1 and create[0]["res"] == 0 and len(rels) >= 2 and
           rels[0]["args"]["handle"] == create[0]["args"]["handle"] and rels[0]["res"] == 0,
           f"{name}: with shim: the create and the first release are not logged: {calls}")
    reused = rels[1]["args"]["handle"] == create[0]["args"]["handle"]
    if not real:
        want = c["strict_reuse"]
        expect(reused == want, f"{name}: the fake {'re-issued' if reused else 'did not re-issue'}"
               f" the released value {create[0]['args']['handle']} (the case needs it "
               f"{'re-issued' if want else 'fresh'}): it tested nothing")
    return reused, recs


def check_strict_fresh(name, rc, out, err, recs):
    """Strict mode, the value not issued again: the program's release of the fresh value goes to
    the driver (it succeeds, no finding: the driver holds it live); its second release of it is a
    release of a handle the shim never saw created (release-unknown), and strict mode aborts there
    with the finding logged and the log ended."""
    calls = [r for r in recs if r.get("k") == "call"]
    rels = [r for r in calls if r["api"] == "cuMemRelease"]
    fresh = rels[1]["args"]["handle"]
    expect(rc == -6, f"{name}: with shim: exit {rc}, expected -6 (strict mode's abort)\n{err}")
    expect("strict mode: aborting at the first finding" in err and
           f"release-unknown in cuMemRelease: cuMemRelease of handle {fresh}," in err,
           f"{name}: with shim: stderr\n{err}")
    expect(len(rels) == 2 and rels[1]["res"] == 0 and not rels[1].get("skipped"),
           f"{name}: with shim: the release of the fresh value {rels[1:]}")
    findings = [(f["class"], f["action"], f["args"]["handle"]) for f in recs
                if f.get("k") == "finding"]
    expect(findings == [("release-unknown", "abort", fresh)],
           f"{name}: with shim: findings {findings}, expected release-unknown of {fresh}, abort")
    f = next(f for f in recs if f.get("k") == "finding")
    expect(f["call_seq"] > rels[1]["seq"], f"{name}: the abort is not at the second release: {f}")
    expect(recs[-1].get("k") == "end" and recs[-1].get("aborted") is True,
           f"{name}: with shim: the log ends {recs[-1]}")
    # Nothing the program printed was lost but what its buffered stdout held at the abort.
    expect("double_release" not in out, f"{name}: with shim: the program went on: {out!r}")


def ipc_checks(name, recs, children):
    """The IPC cases: what the findings say, and how the bridge's calls are logged."""
    if not (name.startswith("P1") or name.startswith("ipc-")) or name in ("P10",):
        return
    findings = [r for r in recs if r.get("k") == "finding"]
    calls = [r for r in recs if r.get("k") == "call"]
    by_seq = {r["seq"]: r for r in calls}
    notes = [r["msg"] for r in recs if r.get("k") == "note"]
    ipc = [f for f in findings if f["class"] == "ipc-vmm"]
    if name in ("P11", "P11-torch", "P11-deny", "P12"):
        f = ipc[0]
        st = f["state"]
        expect(st["mapped_pages"] == 2 and st["mapped_bytes"] == 2 * (2 << 20) and
               st["handle_types"] == "POSIX_FD" and st["size"] == 4 * (2 << 20),
               f"{name}: reservation state {st}")
        expect(st["reservation"] == f["args"]["reservation"], f"{name}: {f['args']}")
        res = next(r for r in f["related"] if r["what"] == "reservation")
        expect(by_seq[res["seq"]]["api"] == "cuMemAddressReserve", f"{name}: related {res}")
        expect("CUMEMGUARD_IPC=bridge" in f["msg"], f"{name}: no way out named: {f['msg']}")
        if name == "P11-torch":
            expect(st.get("torch_var") == "PYTORCH_ALLOC_CONF" and
                   st.get("torch_token") == "expandable_segments:True",
                   f"{name}: PyTorch's variable and token not named: {st}")
            expect("PYTORCH_ALLOC_CONF has 'expandable_segments:True'" in f["msg"] and
                   "expandable_segments:False" in f["msg"], f"{name}: {f['msg']}")
        else:
            expect("torch_var" not in st and "PyTorch" not in f["msg"],
                   f"{name}: PyTorch named without its variable set: {f['msg']}")
        if name == "P11-deny":
            expect(f["res"] == 1 and "CUMEMGUARD_IPC=deny" in f["msg"], f"{name}: {f}")
            call = next(c for c in calls if c["api"] == "cudaIpcGetMemHandle")
            expect(call.get("skipped") is True, f"{name}: the denied call is not marked skipped")
    if name == "P15-report":
        st = ipc[0]["state"]
        expect(st["handle_types"] == "FABRIC" and "handle types FABRIC" in ipc[0]["msg"],
               f"{name}: the allocation's real handle types are not named: {st}")
    if name == "P15-host":
        st = ipc[0]["state"]
        expect(st["mode"] == "bridge" and "without POSIX_FD" in st.get("bridge_blocker", "") and
               st["handle_types"] == "none", f"{name}: why the bridge cannot export: {st}")
    if name == "P15-accept":
        create = next(c for c in calls if c["api"] == "cuMemCreate" and c["res"] == 0)
        expect(create["args"]["handle_types"] == 8 and create["args"].get("granted_types") == 9,
               f"{name}: the shim did not add POSIX_FD to the FABRIC allocation: {create['args']}")
    if name in ("P11-bridge", "P14", "P16"):
        exp = [c for c in calls if c["api"] in ("cudaIpcGetMemHandle", "cuIpcGetMemHandle")
               and "reservation" in c["args"]]
        expect(exp and all(c["res"] == 0 and c.get("skipped") and c["args"].get("export") == 1
                           for c in exp), f"{name}: export calls {exp}")
        if name == "P14":
            expect([c["args"]["bridge"] for c in exp] == ["new export", "same export"],
                   f"{name}: {exp}")
        expect(any("opened by pid" in n for n in notes), f"{name}: the broker's open is not logged")
        own = next(r for r in recs if r.get("k") == "summary")["calls"]
        expect(not any(a in own for a in ("cuMemRetainAllocationHandle",
                                          "cuMemExportToShareableHandle")),
               f"{name}: the broker's driver calls are recorded as the program's: {own}")
        imp = [r for ch in children for r in ch if r.get("k") == "call"]
        opens = [c for c in imp if "OpenMemHandle" in c["api"]]
        closes = [c for c in imp if "CloseMemHandle" in c["api"] and "opens" in c["args"]]
        expect(opens and opens[0]["res"] == 0 and opens[0]["args"]["export"] == 1 and
               opens[0]["args"]["exporter_pid"] == recs[0]["pid"] and
               opens[0]["mem"] == "ipc" and opens[0]["delta"] == opens[0]["args"]["bytes"],
               f"{name}: importer's open {opens[:1]}")
        expect(closes and closes[-1]["args"]["opens"] == 0 and
               closes[-1]["delta"] == -opens[0]["args"]["bytes"], f"{name}: closes {closes}")
        # The bridge's own driver calls are not the program's: none is recorded in the importer.
        expect(not any(c["api"].startswith("cuMem") for c in imp),
               f"{name}: the importer's log records the bridge's driver calls: "
               f"{sorted({c['api'] for c in imp})}")
        summ = next(r for ch in children for r in ch if r.get("k") == "summary")
        ipc_rows = [b for b in summ["bytes"] if b["mem"] == "ipc"]
        expect(ipc_rows and ipc_rows[0]["current"] == 0, f"{name}: ipc bytes {ipc_rows}")
    summ = next((r for r in recs if r.get("k") == "summary"), {})
    if name == "ipc-one-sided":
        expect(not children, f"{name}: the peer without the shim wrote a log")
        expect(summ.get("bridge") == {"exports": 1, "never_requested": 1,
                                      "never_requested_bytes": 2 * (2 << 20),
                                      "first_never_requested_seq": summ.get("bridge", {}).get(
                                          "first_never_requested_seq")} and
               by_seq[summ["bridge"]["first_never_requested_seq"]]["api"] == "cudaIpcGetMemHandle",
               f"{name}: the summary's bridge {summ.get('bridge')}")
    elif name in ("P11-bridge", "P12-bridge"):
        expect(summ.get("bridge", {}).get("exports") == 1 and
               summ["bridge"]["never_requested"] == 0, f"{name}: the summary's bridge {summ.get('bridge')}")
    if name == "P16":
        f = next(f for f in findings if f["class"] == "free-exported")
        expect(f["api"] == "cuMemUnmap" and f["state"]["importer_opens"] == 1 and
               f["state"]["pages"] == 2, f"{name}: {f}")
        made = next(r for r in f["related"] if r["what"] == "export")
        expect(by_seq[made["seq"]]["api"] == "cudaIpcGetMemHandle", f"{name}: related {made}")
    if name == "ipc-forged":
        msgs = [f["msg"] for ch in children for f in ch if f.get("k") == "finding"]
        for want in ("corrupt", "nonce is wrong", "has no export 99", "is gone",
                     "exported by this very process"):
            expect(any(want in m for m in msgs), f"{name}: no finding says '{want}': {msgs}")
        expect(any("wrong nonce" in n for n in notes) and
               sum("malformed request" in n or "sent file descriptors" in n for n in notes) == 5,
               f"{name}: the broker's refusals in the exporter's log: {notes}")
    if name == "ipc-exited":
        expect(all("is gone" in f["msg"] for f in ipc), f"{name}: {[f['msg'] for f in ipc]}")
    if name == "ipc-peer-uid":
        expect(any("refused a connection" in n and "(uid 65534)" in n for n in notes),
               f"{name}: the broker's SO_PEERCRED refusal is not in the exporter's log: {notes}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--real", action="store_true", help="run against the real driver")
    ap.add_argument("case")
    a = ap.parse_args()
    c = CASES[a.case]
    if a.real and not c.get("real"):
        print(f"{a.case}: fake-only case (needs fault injection or forced value reuse)")
        return 77
    build = os.path.abspath(a.build)
    if "script" in c:
        cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), c["script"])]
    else:
        prog_name = c.get("real_prog", c["prog"]) if a.real else c["prog"]
        cmd = [os.path.join(build, "tests", "integration", prog_name)]
    # CMG_TEST_SHIM runs the case against another build of the shim (to see a regression fail).
    shim = os.environ.get("CMG_TEST_SHIM") or os.path.join(build, "shim", "libcumemguard.so")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["MALLOC_PERTURB_"] = "0"
    for k in list(env):
        if k.startswith("CUMEMGUARD_") or k.startswith("FAKECUDA_"):
            del env[k]
    if not a.real:
        fake = os.path.join(build, "tests", "fakecuda")
        env["LD_LIBRARY_PATH"] = fake + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.update(c.get("env", {}))
    other = os.path.join(build, "tests", "integration", c["preload"]) if c.get("preload") else None
    if other:
        env["LD_PRELOAD"] = other

    # A sanitized build needs its runtime loaded first (tests/meson.build, tools/dev sanitize):
    # also without the shim, where an unsanitized interpreter loads a sanitized library.
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    if first:
        env["LD_PRELOAD"] = f"{first}:{other}" if other else first

    # 1. Without the shim: the driver's own answers.
    rc, out, err = run(cmd + c["args"], env)
    if rc == 77:
        print(f"{a.case}: skipped by the program ({err.strip()})")
        return 77
    steps = parse_steps(out)
    base, shim_want, findings = variants(a.case, c, steps, a.real)
    tmp = None
    try:
        expect(rc == 0, f"without shim: exit {rc}\n{err}")
        compare_steps(steps, base, "without shim", a.real)

        # 2. With the shim.
        tmp = tempfile.mkdtemp(prefix=f"cmg-{a.case}-")
        senv = dict(env)
        senv["LD_PRELOAD"] = shim
        if other:
            senv["LD_PRELOAD"] = (f"{shim}:{other}" if c.get("order") == "shim-first"
                                  else f"{other}:{shim}")
        if first:
            senv["LD_PRELOAD"] = f"{first}:{senv['LD_PRELOAD']}"
        senv["CUMEMGUARD_LOG"] = os.path.join(tmp, "log.%p")
        if c.get("bridge"):
            senv["CUMEMGUARD_IPC"] = "bridge"
        senv.update(c.get("shim_env", {}))
        rc2, out2, err2 = run(cmd + c["args"], senv)
        shim_base = steps
        if "strict_reuse" in c:
            reused, srecs = strict_reuse(a.case, c, tmp, a.real)
            if not reused:
                check_strict_fresh(a.case, rc2, out2, err2, srecs)
                print(f"ok {a.case} (value not re-issued: strict mode aborted at release-unknown)")
                return 0
            if steps.get("reused") != "1":
                # Re-issued with the shim, not without it: the re-issue's expectations.
                shim_base = dict(steps, **c["base"])
                _, shim_want, findings = variants(a.case, c, {"reused": "1"}, a.real)
        expect(rc2 == 0, f"with shim: exit {rc2}\n{err2}")
        # The same program's own results, but for what the shim is declared to change.
        want = dict(shim_base)
        want.update(shim_want)
        compare_steps(parse_steps(out2), want, "with shim", a.real, exact=True,
                      varies=c.get("varies", ()))
        logs = sorted(glob.glob(os.path.join(tmp, "log.*")))
        if c.get("nolog"):
            expect(not logs, f"with shim: a process without memory calls wrote {logs}")
            print(f"ok {a.case}")
            return 0
        expect(logs, "with shim: no log written")
        main_log = os.path.join(tmp, f"log.{os.getpid()}")
        recs_by_log = {p: read_log(p) for p in logs}
        # The program's own log is the one whose header has no parent among the logs.
        pids = {recs[0]["pid"]: p for p, recs in recs_by_log.items() if recs}
        top = [p for p, recs in recs_by_log.items() if recs and recs[0]["ppid"] not in pids]
        expect(len(top) == 1, f"with shim: cannot tell the program's log among {logs}")
        recs = recs_by_log[top[0]]
        check_log_basics(recs, top[0])
        got = sorted((f["class"], f["action"]) for f in recs if f.get("k") == "finding")
        if findings is not None:
            expect(got == sorted(findings), f"findings {got}, expected {sorted(findings)}")
        if a.case == "fork":
            children = [p for p in logs if p != top[0]]
            expect(len(children) == 20, f"fork: {len(children)} child logs, expected 20")
            for p in children:
                r = recs_by_log[p]
                expect(r and r[0]["ppid"] == recs[0]["pid"], f"fork: {p} header {r[:1]}")
                expect(r[-1].get("k") == "end", f"fork: child log {p} not complete")
        children = [r for p, r in recs_by_log.items()
                    if r and p != top[0] and r[0]["ppid"] == recs[0]["pid"]]
        if c.get("child_findings") is not None:
            expect(children, "with shim: no log of the child process")
            got_c = sorted((f["class"], f["action"]) for r in children for f in r
                           if f.get("k") == "finding")
            expect(got_c == sorted(c["child_findings"]),
                   f"child findings {got_c}, expected {sorted(c['child_findings'])}")
        ipc_checks(a.case, recs, children)
        case_specific(a.case, recs, steps)
        nccl_cases.check(a.case, recs, parse_steps(out2), expect)
        if a.case in FLUSH_CASES:
            check_flushes(a.case, recs, steps, parse_steps(out2), a.real, build, top[0])
        if a.case in capture_checks.CASE_NAMES:
            capture_checks.check(a.case, recs, parse_steps(out2), expect, a.real, build, top[0])
    except Failure as e:
        print(f"FAIL {a.case}: {e}")
        return 1
    finally:
        # Nothing is left in TMPDIR (check_tmp_clean.py): CMG_KEEP_TMP=1 keeps the logs.
        if tmp and os.environ.get("CMG_KEEP_TMP") == "1":
            print(f"{a.case}: files kept in {tmp}")
        elif tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"ok {a.case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
