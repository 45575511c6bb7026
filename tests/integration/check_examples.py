#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The scripts under examples/ (the README's), run as the README runs them on the fake CUDA stack:
# the double free and stale free explained, and the exporter/importer pair sharing VMM memory
# through the bridge (refused by the driver without it).
#   check_examples.py --cg CUMEMGUARD --build BUILD_DIR --src SOURCE_DIR
import argparse
import os
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)


def lines(text):
    return dict(l.split(" ", 1) for l in text.splitlines() if " " in l)


def main():
    ap = argparse.ArgumentParser()
    for a in ("--cg", "--build", "--src"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    cg, ex = os.path.abspath(a.cg), os.path.join(os.path.abspath(a.src), "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_") and
           k not in ("LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")}
    env["LD_LIBRARY_PATH"] = os.path.join(os.path.abspath(a.build), "tests", "fakecuda")
    if os.environ.get("CMG_PRELOAD_FIRST"):
        env["LD_PRELOAD"] = os.environ["CMG_PRELOAD_FIRST"]
    py = sys.executable
    with tempfile.TemporaryDirectory() as d:
        run = lambda args, **kw: subprocess.run(args, env=dict(env, **kw.pop("extra", {})), cwd=d,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                text=True, timeout=120, **kw)
        # The bug without the shim: the stale free frees the new owner's memory.
        plain = lines(run([py, os.path.join(ex, "double_free.py")]).stdout)
        check(plain.get("same_address") == "1" and plain.get("owner_free") != "0",
              f"double_free.py plain: {plain}")
        # Without a driver (no fake stack on the library path): the script stops at its first call
        # and says why, status 1 (it printed "same_address 1" of two NULL pointers and exited 0),
        # and the summary says that every call failed, once.
        # Checked where ld.so finds a CUDA runtime but no driver (this machine: the toolkit's
        # libcudart registered, no libcuda.so.1); skipped where a driver loads or no runtime does.
        loads = lambda lib: run([py, "-c", f"import ctypes; ctypes.CDLL('{lib}')"],
                                extra={"LD_LIBRARY_PATH": ""}).returncode == 0
        driver = loads("libcuda.so.1") or not any(
            loads(r) for r in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"))
        nd = run([cg, "run", "--no-log", "--", py, os.path.join(ex, "double_free.py")],
                 extra={"LD_LIBRARY_PATH": ""})
        if driver:
            print("a CUDA driver is installed, or no runtime without LD_LIBRARY_PATH: the "
                  "no-driver case is not checked here")
        check(driver or nd.returncode == 1 and nd.stdout == "" and
              "the first CUDA call returned 35 (35: no CUDA driver; on a machine without a GPU put "
              "the build's tests/fakecuda first on LD_LIBRARY_PATH)\n" in nd.stderr and
              "  cuda: every call failed (1 call) with 35 (cudaErrorInsufficientDriver)" in nd.stderr,
              f"double_free.py without a driver: rc {nd.returncode} {nd.stdout!r} "
              f"{nd.stderr[-600:]!r}")
        p = run([cg, "run", "--", py, os.path.join(ex, "double_free.py")])
        out = lines(p.stdout)
        check(p.returncode == 0 and out.get("same_address") == "0" and
              out.get("stale_free") == "0" and out.get("owner_free") == "0",
              f"double_free.py under run: {p.returncode} {out}")
        check("warning: double-free in cudaFree" in p.stderr and "findings: double-free 1" in p.stderr,
              f"double_free.py finding: {p.stderr[-500:]!r}")
        logs = [f for f in os.listdir(d) if f.startswith("cumemguard.python")]
        check(len(logs) == 1, f"double_free.py logs: {logs}")
        # The text report stops a stack at the native main only: the Python function main is the
        # program's, and <module> below it is printed (as --json has it).
        r = run([cg, "report"] + logs)
        stack = [l.strip() for l in r.stdout.splitlines() if l.strip().startswith("#")]
        at_main = [i for i, l in enumerate(stack) if l.split(" ", 2)[1:2] == ["main"] and
                   "double_free.py:26)" in l]
        check(r.returncode == 1 and at_main and
              all(i + 1 < len(stack) and stack[i + 1].split(" ", 2)[1] == "<module>" and
                  "double_free.py:35)" in stack[i + 1] for i in at_main),
              f"double_free.py report below the Python main: {r.returncode} {r.stdout[-1500:]!r}")
        # The IPC pair: refused without the bridge (with the finding), shared with it.
        h = os.path.join(d, "h.json")
        p = run([cg, "run", "--no-log", "--", py, os.path.join(ex, "exporter.py"), h])
        check(p.returncode == 1 and "cudaIpcGetMemHandle 1" in p.stdout and
              "warning: ipc-vmm" in p.stderr, f"exporter.py without the bridge: {p.returncode} "
              f"{p.stdout!r} {p.stderr[-300:]!r}")
        # It says why and what to run (it said only "cudaIpcGetMemHandle 1"), frees its buffer,
        # and writes no handle file.
        check("exporter.py: cudaIpcGetMemHandle failed (1): legacy CUDA IPC cannot export VMM "
              "memory, so no handle file was written; run the pair under cumemguard run -e "
              "CUMEMGUARD_IPC=bridge (docs/ipc-bridge.md)\n" in p.stderr and
              "leaks:" not in p.stderr and not os.path.exists(h),
              f"exporter.py without the bridge, its explanation: {p.stderr[-600:]!r}")
        # The importer without a handle file: one line and 1 (it was a FileNotFoundError
        # traceback).
        p = run([py, os.path.join(ex, "importer.py"), h, "--wait", "0"])
        check(p.returncode == 1 and not p.stdout and p.stderr ==
              f"importer.py: no handle file {h}: run the exporter first (under cumemguard run -e "
              "CUMEMGUARD_IPC=bridge)\n",
              f"importer.py without a handle file: {p.returncode} {p.stderr[-400:]!r}")
        # double_free.py takes none: --help describes it (it ran the bug and exited 0), and an
        # argument is a usage error before any CUDA call.
        p = run([py, os.path.join(ex, "double_free.py"), "--help"])
        check(p.returncode == 0 and p.stdout.startswith("usage: double_free.py [-h]") and
              "malloc" not in p.stdout, f"double_free.py --help: {p.returncode} {p.stdout[:300]!r}")
        p = run([py, os.path.join(ex, "double_free.py"), "--bogus"])
        check(p.returncode == 2 and "unrecognized arguments: --bogus" in p.stderr and not p.stdout,
              f"double_free.py --bogus: {p.returncode} {p.stdout[:200]!r} {p.stderr[-200:]!r}")
        # Arguments as argparse takes them: an option before the file is an option (a leading
        # --torch was the handle file's name, and the exporter waited 120 s for nothing), and
        # one the script does not take is a usage error (2) before any CUDA call.
        for script, argv, says in (("exporter.py", ["--help"], "usage: exporter.py [-h] [--torch] HANDLE_FILE"),
                                   ("importer.py", [h, "--torch"], "importer.py: error: unrecognized arguments: --torch"),
                                   ("exporter.py", [], "exporter.py: error: the following arguments are required: HANDLE_FILE")):
            p = run([py, os.path.join(ex, script)] + argv)
            check(p.returncode == (0 if argv == ["--help"] else 2) and says in p.stdout + p.stderr and
                  not os.path.exists("--torch"),
                  f"{script} {argv}: {p.returncode} {p.stdout[-300:]!r} {p.stderr[-300:]!r}")
        exp = subprocess.Popen([cg, "run", "--no-log", "-e", "CUMEMGUARD_IPC=bridge", "--", py,
                                os.path.join(ex, "exporter.py"), h], env=env, cwd=d,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        imp = run([cg, "run", "--no-log", "-e", "CUMEMGUARD_IPC=bridge", "--", py,
                   os.path.join(ex, "importer.py"), h])
        eo, ee = exp.communicate(timeout=120)
        check(imp.returncode == 0 and "cudaIpcOpenMemHandle 0" in imp.stdout and
              f"bytes ok {3 << 20}" in imp.stdout, f"importer.py: {imp.returncode} {imp.stdout!r} "
              f"{imp.stderr[-300:]!r}")
        check(exp.returncode == 0 and "cudaIpcGetMemHandle 0" in eo and "importer done" in eo,
              f"exporter.py with the bridge: {exp.returncode} {eo!r} {ee[-300:]!r}")
    if FAILURES:
        print(f"{len(FAILURES)} failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
