#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Opens the buffer examples/exporter.py shared (cudaIpcOpenMemHandle), reads it back at the opened
# pointer plus the buffer's offset, and checks every byte. See exporter.py for how to run the pair.
#   importer.py HANDLE_FILE [--wait SECONDS]     (waits up to 120 s for the file by default)
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cuda  # noqa: E402


def main():
    ap = argparse.ArgumentParser(prog="importer.py", description="Open the buffer exporter.py "
                                 "shared and check its bytes.")
    ap.add_argument("handle_file", metavar="HANDLE_FILE", help="the file exporter.py writes")
    ap.add_argument("--wait", type=float, default=120.0, metavar="SECONDS",
                    help="how long to wait for the file (default 120)")
    a = ap.parse_args()
    if a.wait < 0:
        ap.error("--wait takes a number of seconds of at least 0")
    path, wait = a.handle_file, a.wait
    deadline = time.monotonic() + wait
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not os.path.exists(path):
        raise SystemExit(f"importer.py: no handle file {path}: run the exporter first (under "
                         "cumemguard run -e CUMEMGUARD_IPC=bridge)")
    job = json.load(open(path))
    rt = _cuda.cudart()
    h = _cuda.IpcHandle()
    ctypes.memmove(ctypes.addressof(h), bytes.fromhex(job["handle"]), 64)
    q = ctypes.c_void_p(0)
    r = rt.cudaIpcOpenMemHandle(ctypes.byref(q), h, ctypes.c_uint(1))
    print(f"cudaIpcOpenMemHandle {r}", flush=True)
    ok = False
    if r == 0:
        n = job["size"]
        buf = ctypes.create_string_buffer(n)
        c = rt.cudaMemcpy(buf, ctypes.c_void_p(q.value + job["offset"]), ctypes.c_size_t(n),
                          _cuda.CUDA_MEMCPY_DEVICE_TO_HOST)
        ok = c == 0 and buf.raw == _cuda.pattern(n)
        print(f"bytes {'ok' if ok else 'differ'} {n}", flush=True)
        rt.cudaIpcCloseMemHandle(q)
    open(path + ".done", "w").close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
