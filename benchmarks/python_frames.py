#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# What reading the Python frames adds to one captured stack (docs/performance.md "Python frames"),
# on the fake CUDA stack in benchmark mode:
#   * instructions (callgrind): the inclusive count of the reader (cmg::shim::py::capture) per
#     captured stack, in py_stacks.py (ctypes calls under 20 Python frames), as the difference of a
#     run of 3000 and one of 1000 cudaMalloc+cudaFree pairs (what a repeated site costs, the first
#     sight of each code object left out); and the same in cmg-bench-loop, a process without
#     Python (what every process that runs no CPython pays);
#   * time: in one process, blocks of pairs at 3 and at 23 Python frames alternated (py_stacks.py
#     ab), the median per-round difference halved (two stacks per pair): what 20 Python frames
#     add to a stack; the same run with CUMEMGUARD_PYTHON_FRAMES=0 is the control and must read
#     about 0. Wall clock on a shared machine is noisy (see the quartiles); the instruction count
#     is the figure that holds.
#   benchmarks/python_frames.py [--build DIR] [--python PY] [--rounds N] [--block PAIRS]
import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRAMES = 20


def inclusive(out, fn):
    text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", out], capture_output=True,
                          text=True).stdout
    for line in text.splitlines():
        if fn in line and "[" in line:
            return int(re.match(r"\s*([\d,]+)", line).group(1).replace(",", ""))
    return 0


def env_for(bdir, tmp, frames=True):
    e = dict(os.environ)
    for k in [k for k in e if k.startswith("CUMEMGUARD_")]:
        del e[k]
    e.update(LD_LIBRARY_PATH=os.path.join(bdir, "tests", "fakecuda"), FAKECUDA_BENCH="1",
             LD_PRELOAD=os.path.join(bdir, "shim", "libcumemguard.so"), CUMEMGUARD_STACKS="16",
             CUMEMGUARD_LOG=os.path.join(tmp, "bench.%p.log"),
             CUMEMGUARD_PYTHON_FRAMES="1" if frames else "0")
    return e


def callgrind(cmd, env, tmp, tag):
    out = os.path.join(tmp, f"cg.{tag}.out")
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"] + cmd, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    # cmg-bench-loop dumps each operation's loop to a file of its own (OUT.1, OUT.2, ...).
    import glob
    return sum(inclusive(f, "cmg::shim::py::capture(") for f in [out] + glob.glob(out + ".*"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default="/usr/bin/python3")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--block", type=int, default=500)
    a = ap.parse_args()
    bdir = os.path.abspath(a.build)
    work = os.path.join(ROOT, "benchmarks", "py_stacks.py")
    loop = os.path.join(bdir, "benchmarks", "cmg-bench-loop")
    with tempfile.TemporaryDirectory() as tmp:
        e = env_for(bdir, tmp)
        py = [callgrind([a.python, work, str(FRAMES), str(n)], e, tmp, f"py{n}") for n in (1000, 3000)]
        py_ir = (py[1] - py[0]) / (2 * 2000)
        nat = [callgrind([loop, "--iters", str(n), "--batches", "1", "runtime"], e, tmp, f"c{n}")
               for n in (1000, 3000)]
        nat_ir = (nat[1] - nat[0]) / (2 * 2000)
        ab = {}
        for frames in (True, False):
            p = subprocess.run([a.python, work, "ab", str(FRAMES + 3), str(a.rounds), str(a.block)],
                               env=env_for(bdir, tmp, frames), capture_output=True, text=True,
                               check=True)
            m = re.search(r"ab_ns_per_pair=(-?[\d.]+) q1=(-?[\d.]+) q3=(-?[\d.]+)", p.stdout)
            ab[frames] = [float(x) / 2 for x in m.groups()]  # two stacks per pair
        print(f"python: {a.python}; CUMEMGUARD_STACKS=16")
        print(f"instructions per captured stack with {FRAMES} Python frames: {py_ir:,.0f}")
        print(f"instructions per captured stack in a process without Python: {nat_ir:,.0f}")
        print(f"time per captured stack, {FRAMES} more Python frames (in-process A/B, {a.rounds} "
              f"rounds of {a.block} pairs): {ab[True][0]:,.0f} ns (quartiles {ab[True][1]:,.0f} "
              f"to {ab[True][2]:,.0f}); control, frames off: {ab[False][0]:,.0f} ns "
              f"({ab[False][1]:,.0f} to {ab[False][2]:,.0f})")


if __name__ == "__main__":
    main()
