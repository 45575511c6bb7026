#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Shares a buffer of VMM memory (PyTorch's expandable segments) with another process through
# legacy IPC, as vLLM's and SGLang's custom all-reduce do: cudaIpcGetMemHandle(RANGE_START_ADDR of
# the buffer). The driver refuses that for VMM memory; under cumemguard with CUMEMGUARD_IPC=bridge
# it works (docs/ipc-bridge.md, "The bridge").
#
#   cumemguard run -e CUMEMGUARD_IPC=bridge -- python3 examples/exporter.py [--torch] HANDLE_FILE
#   cumemguard run -e CUMEMGUARD_IPC=bridge -- python3 examples/importer.py HANDLE_FILE
#
# (a usage error exits 2 with argparse's message; --help describes the arguments)
#
# --torch allocates the buffer with PyTorch (set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True);
# without it the same kind of memory is made with the driver's VMM calls (no PyTorch needed).
# Writes the handle, the buffer's offset in its reservation and its size to HANDLE_FILE as JSON,
# then keeps the memory until the importer writes HANDLE_FILE.done (at most 120 s).
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _cuda  # noqa: E402

SIZE = 3 << 20  # spans several pages


def main():
    # argparse: --torch before or after the file, --help, and a refused argument said as one
    # (a leading --torch was taken for the file's name, and the pair waited 120 s for nothing).
    ap = argparse.ArgumentParser(prog="exporter.py", description="Share a buffer of VMM memory "
                                 "through legacy CUDA IPC (the importer.py pair).")
    ap.add_argument("handle_file", metavar="HANDLE_FILE",
                    help="where the handle is written, as JSON, for importer.py")
    ap.add_argument("--torch", action="store_true",
                    help="allocate the buffer with PyTorch (expandable segments) instead of the "
                         "driver's VMM calls")
    a = ap.parse_args()
    path, use_torch = a.handle_file, a.torch
    data = _cuda.pattern(SIZE)
    if use_torch:
        import torch
        t = torch.frombuffer(bytearray(data), dtype=torch.uint8).to("cuda")
        torch.cuda.synchronize()
        ptr = t.data_ptr()
    else:
        buf = _cuda.VmmBuffer(SIZE, data)
        ptr = buf.ptr
    base = _cuda.range_start(ptr)
    h = _cuda.IpcHandle()
    r = _cuda.cudart().cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base))
    print(f"cudaIpcGetMemHandle {r}", flush=True)
    if r != 0:
        if not use_torch:
            buf.free()
        # The driver refuses legacy IPC of VMM memory (invalid argument); the bridge exports it.
        print(f"exporter.py: cudaIpcGetMemHandle failed ({r}): legacy CUDA IPC cannot export VMM "
              "memory, so no handle file was written; run the pair under cumemguard run -e "
              "CUMEMGUARD_IPC=bridge (docs/ipc-bridge.md)", file=sys.stderr, flush=True)
        return 1
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"handle": bytes(h.reserved).hex(), "offset": ptr - base, "size": SIZE}, f)
    os.replace(tmp, path)  # the importer never reads half a file
    deadline = time.monotonic() + 120
    while not os.path.exists(path + ".done") and time.monotonic() < deadline:
        time.sleep(0.05)
    print("importer done" if os.path.exists(path + ".done") else "no importer", flush=True)
    if not use_torch:
        buf.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
