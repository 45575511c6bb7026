#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The PyTorch-facing checks of the shim on the fake stack: the allocator path check (a cudaMalloc
# from PyTorch's allocator while expandable segments are asked for) and the known problems of the
# release found loaded (torch/version.py beside torch/lib). Each case runs torch_path_cases without
# and with the shim and checks the steps, the exact findings and their messages.
#   run_torch_cases.py BUILD CASE
import atexit
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

EXP = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
MISMATCH = "PyTorch's caching allocator makes segments with cudaMalloc (1048576 bytes, called from "
NEW_KEY = "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"

# Each case: env, steps, torch release to install beside the library (None: the library alone, no
# release found), and the findings as (class, [substrings of the message]) in log order.
CASES = {
    "path-default": dict(env={}, steps=["seg:4:linear"], findings=[]),
    "path-expandable": dict(env=EXP, steps=["seg:4:vmm"], findings=[]),
    # The faked mismatch: expandable segments asked for, segments made with cudaMalloc. One
    # finding however many segments follow.
    "path-mismatch": dict(env=EXP, steps=["seg:5:linear"], findings=[
        ("config", [MISMATCH, "/libc10_cuda.so) although PYTORCH_CUDA_ALLOC_CONF asks "
                    "for expandable_segments:True: expandable segments are not in use; possible "
                    "causes: torch was built without the CUDA driver API"])]),
    "path-unified": dict(env={"PYTORCH_ALLOC_CONF": "max_split_size_mb:64,expandable_segments:True"},
                         steps=["seg:1:linear"], findings=[
        ("config", [MISMATCH, "although PYTORCH_ALLOC_CONF asks for expandable_segments:True"])]),
    "path-nocaching": dict(env=dict(EXP, PYTORCH_NO_CUDA_MEMORY_CACHING="1"),
                           steps=["seg:2:linear"], findings=[
        ("config", [MISMATCH, "PYTORCH_NO_CUDA_MEMORY_CACHING='1' turns torch's caching allocator "
                    "off, so every allocation is a cudaMalloc"])]),
    "path-async": dict(env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync,expandable_segments:True"},
                       steps=["seg:2:linear"], findings=[]),
    "path-other-caller": dict(env=EXP, steps=["main-malloc", "seg:1:vmm"], findings=[]),
    # Run-time changes through the C API (what the Python package does around its block): off, the
    # allocator's cudaMalloc is the asked path; on again, it is not.
    "path-runtime": dict(env=EXP, steps=["applied:expandable_segments:False", "seg:2:linear",
                                         "applied:expandable_segments:True", "seg:1:linear"],
                         shim_steps={"applied:expandable_segments:False": "0",
                                     "applied:expandable_segments:True": "1"},
                         base_steps={"applied:expandable_segments:False": "absent",
                                     "applied:expandable_segments:True": "absent"},
                         findings=[("config", [MISMATCH, "although the settings applied at run "
                                               "time ask for expandable_segments:True"])]),
    "path-runtime-rejected": dict(env=EXP, steps=["applied:expandable_segments:maybe", "seg:1:vmm"],
                                  shim_steps={"applied:expandable_segments:maybe": "-1"},
                                  base_steps={"applied:expandable_segments:maybe": "absent"},
                                  findings=[]),
    "path-disabled": dict(env=dict(EXP), shim_env={"CUMEMGUARD_DISABLE": "1"},
                          steps=["seg:2:linear"], findings=None),
    # The release found loaded, and its problems for the environment it read.
    "release-2.9.1-unified": dict(env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
                                  release="2.9.1+cu128", steps=["seg:2:linear"], findings=[
        ("config", ["torch 2.9.1+cu128 (", "/torch/version.py): PYTORCH_ALLOC_CONF sets "
                    "expandable_segments:True, but this release takes expandable_segments for "
                    "CUDA only from PYTORCH_CUDA_ALLOC_CONF", "(pytorch#183387;"]),
        ("config", [MISMATCH, "although PYTORCH_ALLOC_CONF asks for expandable_segments:True",
                    "; torch 2.9.1+cu128 (", "pytorch#183387"])]),
    "release-2.11-unified": dict(env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
                                 release="2.11.0+cu130", steps=["seg:2:vmm"], findings=[],
                                 note="PyTorch 2.11.0+cu130 is loaded (version from "),
    # torch/version.py replaced by a FIFO: the shim must not block in open(2) on it at the first
    # CUDA call (it did); the release is then not known, and nothing is claimed about it.
    "release-fifo": dict(env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
                         release="2.9.1+cu128", fifo=True, steps=["seg:2:vmm"], findings=[]),
    "release-2.5.1-nocache0": dict(env={"PYTORCH_NO_CUDA_MEMORY_CACHING": "0"},
                                   release="2.5.1", steps=["seg:1:linear"], findings=[
        ("config", ["torch 2.5.1 (", "PYTORCH_NO_CUDA_MEMORY_CACHING='0' turns the CUDA caching "
                    "allocator off in this release", "(pytorch#145661; fixed by PR #145905, "
                    "first in 2.7.0"])]),
    "release-2.2.0-maxsplit": dict(env={"PYTORCH_CUDA_ALLOC_CONF":
                                        "expandable_segments:True,max_split_size_mb:256"},
                                   release="2.2.0", steps=["seg:1:vmm"], findings=[
        ("config", ["torch 2.2.0 (", "INTERNAL ASSERT FAILED (pytorch#119452; fixed by PR #120022"]),
        ("config", ["torch 2.2.0 (", "nearly out of memory (PR #134338; first in 2.5.0"])]),
    # A key of 2.12 (throw_on_cudamalloc_oom, its release notes): not an error before the release
    # is known; for 2.12 none at all, for 2.11 PyTorch's own error once that release is found.
    "release-2.12-new-key": dict(env={"PYTORCH_CUDA_ALLOC_CONF": NEW_KEY}, release="2.12.0",
                                 steps=["seg:1:linear"], findings=[]),
    "release-2.11-new-key": dict(env={"PYTORCH_CUDA_ALLOC_CONF": NEW_KEY}, release="2.11.0",
                                 steps=["seg:1:linear"], findings=[
        ("config", ["torch 2.11.0 (", "/torch/version.py): PYTORCH_CUDA_ALLOC_CONF: the first "
                    "CUDA allocation would raise ValueError: Unrecognized key "
                    "'throw_on_cudamalloc_oom' in CUDA allocator config. (parser C, at "
                    "'throw_on_cudamalloc_oom:True')"])]),
    # What every release rejects is said at load, before any release is known, and only then.
    "load-every-release": dict(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"},
                               release="2.12.0", steps=["seg:1:linear"], findings=[
        ("config", ["PYTORCH_CUDA_ALLOC_CONF: the first CUDA allocation would raise ValueError: "
                    "Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'maybe'"])]),
}


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def run(cmd, env):
    t = 120 * float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=t)


def steps_of(out):
    return dict(l.split(None, 1) for l in out.splitlines() if len(l.split(None, 1)) == 2)


def main():
    build, name = os.path.abspath(sys.argv[1]), sys.argv[2]
    c = CASES[name]
    tmp = tempfile.mkdtemp(prefix=f"cmg-{name}-")
    # Removed on every way out, fail() included; CMG_KEEP_TMP=1 keeps it.
    if os.environ.get("CMG_KEEP_TMP") == "1":
        print(f"{name}: files kept in {tmp}")
    else:
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    lib = os.path.join(build, "tests", "torch", "libc10_cuda.so")
    if c.get("release"):
        # A wheel's layout: site-packages/torch/lib/libc10_cuda.so beside torch/version.py.
        os.makedirs(os.path.join(tmp, "site", "torch", "lib"))
        shutil.copy(lib, os.path.join(tmp, "site", "torch", "lib"))
        lib = os.path.join(tmp, "site", "torch", "lib", "libc10_cuda.so")
        version_py = os.path.join(tmp, "site", "torch", "version.py")
        if c.get("fifo"):
            os.mkfifo(version_py)
        else:
            with open(version_py, "w") as f:
                f.write(f"__version__ = '{c['release']}'\ndebug = False\n")
    prog = os.path.join(build, "tests", "torch", "torch_path_cases")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUMEMGUARD_", "FAKECUDA_", "PYTORCH_"))}
    env.pop("LD_PRELOAD", None)
    env["LD_LIBRARY_PATH"] = os.path.join(build, "tests", "fakecuda")
    env.update(c["env"])
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    if first:
        env["LD_PRELOAD"] = first
    cmd = [prog, lib] + c["steps"]
    p = run(cmd, env)
    if p.returncode != 0:
        fail(f"{name}: without the shim: exit {p.returncode}: {p.stderr}")
    base = steps_of(p.stdout)
    want = {s: "ok" for s in c["steps"] if s.startswith("seg:")}
    want["release"] = "ok"
    want.update(c.get("base_steps", {}))
    for k, v in want.items():
        if base.get(k) != v:
            fail(f"{name}: without the shim: {k} = {base.get(k)!r}, expected {v!r}")

    senv = dict(env, LD_PRELOAD=":".join(filter(None, [first, os.path.join(build, "shim",
                                                                         "libcumemguard.so")])),
                CUMEMGUARD_LOG=os.path.join(tmp, "log.%p"), CUMEMGUARD_LOG_LEVEL="info")
    senv.update(c.get("shim_env", {}))
    p = run(cmd, senv)
    if p.returncode != 0:
        fail(f"{name}: with the shim: exit {p.returncode}: {p.stderr}")
    got = steps_of(p.stdout)
    want.update(c.get("shim_steps", {}))
    for k, v in want.items():
        if got.get(k) != v:
            fail(f"{name}: with the shim: {k} = {got.get(k)!r}, expected {v!r}")
    logs = glob.glob(os.path.join(tmp, "log.*"))
    if c["findings"] is None:  # disabled: nothing written, nothing said
        if logs or p.stderr:
            fail(f"{name}: disabled shim wrote {logs} / said {p.stderr!r}")
        print(f"ok {name}")
        return 0
    if len(logs) != 1:
        fail(f"{name}: logs {logs}")
    recs = [json.loads(l) for l in open(logs[0])]
    findings = [r for r in recs if r.get("k") == "finding"]
    if len(findings) != len(c["findings"]):
        fail(f"{name}: {len(findings)} findings, expected {len(c['findings'])}: "
             f"{[f['msg'] for f in findings]}")
    for f, (cls, parts) in zip(findings, c["findings"]):
        if f["class"] != cls:
            fail(f"{name}: class {f['class']}, expected {cls}")
        for part in parts:
            if part not in f["msg"]:
                fail(f"{name}: {part!r} not in {f['msg']!r}")
        # Printed on stderr as well (config findings are errors the user must see).
        if f["msg"][:60] not in p.stderr:
            fail(f"{name}: finding not printed: {p.stderr!r}")
        if f["msg"].startswith("PyTorch's caching allocator"):
            if f["api"] != "cudaMalloc" or f["state"]["check"] != "torch-path" or \
                    not f["state"]["caller"].endswith("/libc10_cuda.so"):
                fail(f"{name}: path finding record {f}")
        elif f["msg"].startswith("torch "):
            if f["state"]["torch_version"] != c["release"] or \
                    not f["state"]["version_source"].endswith("/site/torch/version.py"):
                fail(f"{name}: release finding record {f}")
    summary = next(r for r in recs if r.get("k") == "summary")
    if summary["findings"].get("config", 0) != len(c["findings"]):
        fail(f"{name}: summary findings {summary['findings']}")
    if c.get("note"):
        notes = [r for r in recs if r.get("k") == "note" and c["note"] in r.get("msg", "")]
        if not notes:
            fail(f"{name}: no note {c['note']!r} in the log")
    print(f"ok {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
