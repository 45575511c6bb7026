#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# A double free and a stale free of a re-issued address, through the CUDA runtime (ctypes, no
# PyTorch needed): the bugs `cumemguard run` explains.
#   cumemguard run --log df.log -- python3 examples/double_free.py
#   cumemguard report df.log
import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cuda  # noqa: E402


def main():
    rt = _cuda.cudart()
    p, q = ctypes.c_void_p(0), ctypes.c_void_p(0)
    print("malloc", _cuda.first_call(rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(1 << 20))))
    print("free", rt.cudaFree(p))
    # Stale code keeps p: the driver may give the same address to the next allocation, and the
    # stale free then frees that one (under cumemguard run the freed address is held back, so the
    # stale free is caught as the double free it is).
    print("malloc_again", rt.cudaMalloc(ctypes.byref(q), ctypes.c_size_t(1 << 20)))
    print("same_address", int(p.value == q.value))
    print("stale_free", rt.cudaFree(p))
    print("owner_free", rt.cudaFree(q))
    return 0


if __name__ == "__main__":
    # No arguments; --help says what it does, and anything else is refused before a CUDA call.
    argparse.ArgumentParser(prog="double_free.py", description="A double free and a stale free "
                            "of a re-issued address through the CUDA runtime (no arguments).").parse_args()
    sys.exit(main())
