# SPDX-License-Identifier: Apache-2.0
# Shared by run_life.py and run_hostile.py: the environment of a run on the fake CUDA stack with or
# without the shim, reading logs line by line, and the failure type the cases raise.
import json
import os
import shutil
import subprocess


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def scale():
    """Time limits stretch in a sanitized build (tools/dev sanitize sets CMG_TIMEOUT_MULTIPLIER)."""
    return float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))


class Build:
    def __init__(self, build):
        self.root = os.path.abspath(build)
        # CMG_TEST_SHIM runs the cases against another build of the shim (to see a regression
        # test fail on the shim from before its fix).
        self.shim = os.environ.get("CMG_TEST_SHIM") or os.path.join(self.root, "shim",
                                                                     "libcumemguard.so")
        self.fake = os.path.join(self.root, "tests", "fakecuda")
        self.first = os.environ.get("CMG_PRELOAD_FIRST", "")

    def prog(self, *parts):
        return os.path.join(self.root, *parts)

    def env(self, shim=True, log=None, extra=None, preload=None):
        """The environment of one run. `preload` replaces the shim in LD_PRELOAD (a list)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("CUMEMGUARD_", "FAKECUDA_")) and k != "LD_PRELOAD"}
        env["MALLOC_PERTURB_"] = "0"
        env["LD_LIBRARY_PATH"] = self.fake + (":" + os.environ["LD_LIBRARY_PATH"]
                                              if os.environ.get("LD_LIBRARY_PATH") else "")
        libs = preload if preload is not None else ([self.shim] if shim else [])
        if libs:
            env["LD_PRELOAD"] = ":".join(([self.first] if self.first else []) + libs)
        if log:
            env["CUMEMGUARD_LOG"] = log
        env.update(extra or {})
        return env

    def run(self, argv, env, timeout=60, cwd=None):
        timeout *= scale()
        try:
            p = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=timeout, cwd=cwd)
        except subprocess.TimeoutExpired:
            raise Failure(f"{' '.join(argv)}: no exit within {timeout} s (hung)")
        return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def wait_until(cond, what, timeout=30):
    """Waits for a condition the test can observe (a log holding what a process wrote), not for
    an amount of time: `cond` is polled until true; `timeout` (scaled) only guards against a hang,
    and running into it is a failure naming `what`."""
    import time
    deadline = time.monotonic() + timeout * scale()
    while not cond():
        if time.monotonic() > deadline:
            raise Failure(f"{what}: not within {timeout * scale():.0f} s")
        time.sleep(0.002)


def steps(text):
    out = {}
    for line in text.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def read_log(path, allow_cut_last=False):
    """Records of a log; every line must be JSON. With allow_cut_last, a last line without its
    newline (a process killed mid-write) is allowed and returned as `cut`."""
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    cut = lines.pop()  # b"" when the file ends with a newline
    expect(not cut or allow_cut_last, f"{path}: the last line is not complete: {cut[:120]!r}")
    recs = []
    for n, line in enumerate(lines, 1):
        try:
            recs.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise Failure(f"{path}:{n}: not JSON ({e}): {line[:200]!r}")
    return recs, cut


def logs_in(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.startswith("log."))


def stderr_lines(err):
    return [l for l in err.splitlines() if l.startswith("cumemguard")]


def run_case(name, fn, tmp):
    """Runs one case: prints "ok NAME" and removes tmp, or "FAIL NAME: why" and keeps it."""
    try:
        fn()
    except Failure as e:
        print(f"FAIL {name}: {e}\n  (files kept in {tmp})")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"ok {name}")
    return 0
