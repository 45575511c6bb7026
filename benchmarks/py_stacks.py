#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The workload of benchmarks/python_frames.py: cudaMalloc+cudaFree pairs through ctypes at the
# bottom of a Python stack of FRAMES frames (the module's frame included), so every captured stack
# carries that many Python frames. Prints "ns_per_pair=..." for N timed pairs after a warm-up.
#   py_stacks.py FRAMES N
# With "ab ROUNDS BLOCK": in one process, blocks of BLOCK pairs at 3 frames and at FRAMES frames
# alternated (order swapped every round), and the median over rounds of the per-pair difference:
# "ab_ns_per_pair=..." (what FRAMES-3 more Python frames cost two stacks).
import ctypes
import sys
import time

rt = ctypes.CDLL("libcudart.so.13")


def pairs(n):
    p = ctypes.c_void_p(0)
    size = ctypes.c_size_t(4096)
    malloc, free = rt.cudaMalloc, rt.cudaFree
    ref = ctypes.byref(p)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        malloc(ref, size)
        free(p)
    return time.perf_counter_ns() - t0


def down(k, n):
    # <module>, main and this function's k levels: FRAMES frames at the calls in pairs().
    if k > 1:
        return down(k - 1, n)
    pairs(200)  # warm-up: code objects interned, lines cached
    return pairs(n)


def ab(frames, rounds, block):
    down(1, block)
    down(frames - 3, block)
    diffs = []
    for r in range(rounds):
        if r % 2:
            deep = down(frames - 3, block)
            shallow = down(1, block)
        else:
            shallow = down(1, block)
            deep = down(frames - 3, block)
        diffs.append((deep - shallow) / block)
    diffs.sort()
    q = len(diffs) // 4
    print(f"ab_ns_per_pair={diffs[len(diffs) // 2]:.1f} q1={diffs[q]:.1f} q3={diffs[-q - 1]:.1f}")


def main():
    if sys.argv[1] == "ab":
        frames, rounds, block = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
        return ab(frames, rounds, block)
    frames, n = int(sys.argv[1]), int(sys.argv[2])
    ns = down(frames - 3, n)
    print(f"ns_per_pair={ns / n:.1f}")


if __name__ == "__main__":
    main()
