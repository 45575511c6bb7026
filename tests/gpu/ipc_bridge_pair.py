#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Two processes share VMM memory through legacy IPC under the shim (docs/ipc-bridge.md).
#
#   ipc_bridge_pair.py BUILD OUT [--backend torch|ctypes] [--large-mib N]
#
# The exporter allocates a buffer spanning several pages of VMM memory, with PyTorch's
# expandable_segments:True (backend torch, the GPU run) or with the driver's VMM calls through
# ctypes (backend ctypes, which also runs on the fake stack), fills it with a pattern and exports
# cudaIpcGetMemHandle(RANGE_START_ADDR(buffer)) as vLLM's custom all-reduce does. Checks:
#   1. without the shim the export fails with cudaErrorInvalidValue (real-driver.md section 2);
#   2. CUMEMGUARD_IPC=report: the same error, and an ipc-vmm finding that names the reservation,
#      its mapped pages and PYTORCH_CUDA_ALLOC_CONF's 'expandable_segments:True';
#   3. CUMEMGUARD_IPC=bridge: the importer opens the handle with cudaIpcOpenMemHandle, copies the
#      buffer back at (opened pointer + the buffer's offset) and finds every byte;
#   4. the latency of cudaIpcOpenMemHandle (and of the close) for an export of --large-mib MiB.
# Writes OUT/ipc_bridge_pair.json and one line per check on stdout; exits 1 if a check fails.
import ctypes
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.abspath(__file__)
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CUDA_MEMCPY_DEVICE_TO_HOST = 2
CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]  # bytes, not a C string: zeros inside


def pattern(n, seed):
    block = bytes((i * 7 + seed) % 251 for i in range(251))
    return (block * (n // 251 + 1))[:n]


def cudart():
    # The runtime the process already has (PyTorch's wheel), or the first one on the path; the
    # shim's dlsym hook answers cudaIpc* with its wrappers either way.
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("no libcudart")


def range_start(ptr):
    cu = ctypes.CDLL("libcuda.so.1")
    base = ctypes.c_uint64(0)
    r = cu.cuPointerGetAttribute(ctypes.byref(base), CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                 ctypes.c_uint64(ptr))
    if r != 0:
        raise SystemExit(f"cuPointerGetAttribute(RANGE_START_ADDR) = {r}")
    return base.value


# ---- exporter backends --------------------------------------------------------------------------
class TorchBuffers:
    """PyTorch with expandable segments: every segment is VMM memory in 20 MiB pages."""

    def __init__(self):
        import torch
        self.torch = torch
        torch.cuda.init()
        self.keep = []

    def alloc(self, n, data=None, fill=None):
        t = self.torch
        x = t.empty(n, dtype=t.uint8, device="cuda")
        if data is not None:
            x.copy_(t.frombuffer(bytearray(data), dtype=t.uint8))
        else:
            x.fill_(fill)
        t.cuda.synchronize()
        self.keep.append(x)
        return x.data_ptr()

    def free_all(self):
        self.keep.clear()
        self.torch.cuda.empty_cache()  # unmaps the pages: the next export covers the new ones


class CtypesBuffers:
    """The same mappings made with the driver's VMM calls (2 MiB pages on the fake stack)."""

    def __init__(self):
        self.cu = cu = ctypes.CDLL("libcuda.so.1")
        cu.cuInit(0)
        dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
        cu.cuDeviceGet(ctypes.byref(dev), 0)
        cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        cu.cuCtxSetCurrent(ctx)

        class Prop(ctypes.Structure):
            _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                        ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                        ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                        ("gpuDirect", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                        ("reserved", ctypes.c_ubyte * 4)]

        class Access(ctypes.Structure):
            _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]

        self.prop = Prop(1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1, 0)
        self.access = Access(1, 0, 3)
        gran = ctypes.c_size_t(0)
        assert cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0) == 0
        self.page = gran.value
        self.segs = []

    def alloc(self, n, data=None, fill=None):
        cu, page = self.cu, self.page
        off = page // 2  # the buffer starts inside the first page and spans several
        size = (off + n + page - 1) // page * page
        va, zero, none = ctypes.c_uint64(0), ctypes.c_size_t(0), ctypes.c_ulonglong(0)
        assert cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size + page), zero,
                                      ctypes.c_uint64(0), none) == 0
        handles = []
        for p in range(size // page):
            h = ctypes.c_uint64(0)
            assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(page), ctypes.byref(self.prop), none) == 0
            assert cu.cuMemMap(ctypes.c_uint64(va.value + p * page), ctypes.c_size_t(page), zero, h, none) == 0
            assert cu.cuMemSetAccess(ctypes.c_uint64(va.value + p * page), ctypes.c_size_t(page),
                                     ctypes.byref(self.access), ctypes.c_size_t(1)) == 0
            handles.append(h)
        buf = data if data is not None else bytes([fill]) * n
        assert cu.cuMemcpyHtoD_v2(ctypes.c_uint64(va.value + off), buf, ctypes.c_size_t(n)) == 0
        self.segs.append((va.value, size + page, handles))
        return va.value + off

    def free_all(self):
        cu, page = self.cu, self.page
        for va, size, handles in self.segs:
            for i, h in enumerate(handles):
                cu.cuMemUnmap(ctypes.c_uint64(va + i * page), ctypes.c_size_t(page))
                cu.cuMemRelease(h)
            cu.cuMemAddressFree(ctypes.c_uint64(va), ctypes.c_size_t(size))
        self.segs.clear()


def export_role(backend, small, large):
    """Line protocol on stdin/stdout: prints one JSON object per export, waits for a line."""
    bufs = TorchBuffers() if backend == "torch" else CtypesBuffers()
    rt = cudart()
    for name, n, kw in (("small", small, dict(data=pattern(small, 13))),
                        ("large", large, dict(fill=0x5A))):
        ptr = bufs.alloc(n, **kw)
        base = range_start(ptr)
        h = IpcHandle()
        r = rt.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base))
        print(json.dumps({"export": name, "status": r, "handle": bytes(h.reserved).hex(),
                          "off": ptr - base, "size": n}), flush=True)
        if r != 0 or not sys.stdin.readline():
            return 0
        bufs.free_all()
    return 0


def import_role(spec):
    """Opens one handle, times the open and the close, and checks the bytes."""
    job = json.loads(spec)
    rt = cudart()
    rt.cudaSetDevice(0)
    rt.cudaFree(None)  # the context exists before the clock starts
    h = IpcHandle()
    ctypes.memmove(ctypes.addressof(h), bytes.fromhex(job["handle"]), 64)
    q = ctypes.c_void_p(0)
    t0 = time.perf_counter()
    r = rt.cudaIpcOpenMemHandle(ctypes.byref(q), h, ctypes.c_uint(CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
    t1 = time.perf_counter()
    res = {"open_status": r, "open_ms": (t1 - t0) * 1e3}
    if r == 0:
        n, off = job["size"], job["off"]
        if job["export"] == "small":
            ranges, want = [(0, n)], pattern(n, 13)
        else:  # the first and the last MiB of the large buffer
            m = min(n, 1 << 20)
            ranges, want = [(0, m), (n - m, m)], None
        ok = True
        for start, length in ranges:
            buf = ctypes.create_string_buffer(length)
            c = rt.cudaMemcpy(buf, ctypes.c_void_p(q.value + off + start), ctypes.c_size_t(length),
                              CUDA_MEMCPY_DEVICE_TO_HOST)
            expect = want[start:start + length] if want is not None else b"\x5a" * length
            ok = ok and c == 0 and buf.raw == expect
        res["bytes_checked"] = sum(l for _, l in ranges)
        res["bytes_ok"] = ok
        t2 = time.perf_counter()
        res["close_status"] = rt.cudaIpcCloseMemHandle(q)
        res["close_ms"] = (time.perf_counter() - t2) * 1e3
    print(json.dumps(res), flush=True)
    return 0


# ---- orchestration ---------------------------------------------------------------------------
def records(pattern_path):
    out = []
    for p in sorted(glob.glob(pattern_path)):
        with open(p) as f:
            out += [json.loads(l) for l in f if l.strip()]
    return out


def main(argv):
    if len(argv) > 1 and argv[1] == "export":
        return export_role(argv[2], int(argv[3]), int(argv[4]))
    if len(argv) > 1 and argv[1] == "import":
        return import_role(argv[2])
    build, out = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    backend = "torch"
    large_mib = 1024
    rest = argv[3:]
    while rest:
        if rest[0] == "--backend":
            backend, rest = rest[1], rest[2:]
        elif rest[0] == "--large-mib":
            large_mib, rest = int(rest[1]), rest[2:]
        else:
            raise SystemExit(f"unknown argument {rest[0]}")
    os.makedirs(out, exist_ok=True)
    shim = os.path.join(build, "shim", "libcumemguard.so")
    small = 100 << 20 if backend == "torch" else 9 << 20  # five 20 MiB pages / five 2 MiB pages
    large = large_mib << 20
    base_env = dict(os.environ)
    for k in list(base_env):
        if k.startswith("CUMEMGUARD_") or k in ("LD_PRELOAD", "PYTORCH_ALLOC_CONF"):
            del base_env[k]
    base_env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    base_env["MALLOC_PERTURB_"] = "0"
    logdir = tempfile.mkdtemp(prefix="cmg-ipc-pair-", dir=out)
    result, failures = {"backend": backend}, []

    def check(cond, what):
        print(("ok    " if cond else "FAIL  ") + what, flush=True)
        if not cond:
            failures.append(what)

    def env_for(mode, tag):
        e = dict(base_env)
        if mode:
            e["LD_PRELOAD"] = shim
            e["CUMEMGUARD_IPC"] = mode
            e["CUMEMGUARD_LOG"] = os.path.join(logdir, f"{tag}.%p.log")
        return e

    def exporter(mode, tag):
        return subprocess.Popen([sys.executable, HERE, "export", backend, str(small), str(large)],
                                env=env_for(mode, tag), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=open(os.path.join(out, f"{tag}.stderr"), "w"),
                                text=True)

    # 1 and 2: the export fails without the shim and in report mode; report mode says why.
    for mode in (None, "report"):
        tag = f"export-{mode or 'noshim'}"
        p = exporter(mode, tag)
        first = json.loads(p.stdout.readline() or "{}")
        p.stdin.close()
        p.wait(timeout=120)
        result[tag] = first
        check(first.get("status") == 1, f"{tag}: cudaIpcGetMemHandle on expandable-segment memory "
              f"returns {first.get('status')} (cudaErrorInvalidValue is 1)")
    finds = [r for r in records(os.path.join(logdir, "export-report.*.log"))
             if r.get("k") == "finding" and r.get("class") == "ipc-vmm"]
    st = finds[0]["state"] if finds else {}
    result["report_finding"] = finds[0] if finds else None
    check(len(finds) == 1 and st.get("torch_var") == "PYTORCH_CUDA_ALLOC_CONF" and
          st.get("torch_token") == "expandable_segments:True" and st.get("mapped_pages", 0) >= 2,
          f"report: one ipc-vmm finding naming PYTORCH_CUDA_ALLOC_CONF 'expandable_segments:True' "
          f"and the reservation's {st.get('mapped_pages')} mapped pages ({st.get('mapped_bytes')} bytes)")
    if finds:
        print("      " + finds[0]["msg"], flush=True)

    # 3 and 4: the bridge.
    p = exporter("bridge", "bridge-exporter")
    for name in ("small", "large"):
        line = p.stdout.readline()
        job = json.loads(line or "{}")
        result[f"bridge-export-{name}"] = {k: v for k, v in job.items() if k != "handle"}
        check(job.get("status") == 0, f"bridge: cudaIpcGetMemHandle of the {name} buffer returns "
              f"{job.get('status')}")
        if job.get("status") != 0:
            break
        imp = subprocess.run([sys.executable, HERE, "import", line], env=env_for("bridge", f"importer-{name}"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        got = json.loads(imp.stdout.strip().splitlines()[-1]) if imp.stdout.strip() else {}
        opens = [r for r in records(os.path.join(logdir, f"importer-{name}.*.log"))
                 if r.get("k") == "call" and r.get("api") == "cudaIpcOpenMemHandle"]
        exported = opens[0]["args"].get("bytes") if opens else None
        got["export_bytes"] = exported
        result[f"bridge-import-{name}"] = got
        check(imp.returncode == 0 and got.get("open_status") == 0 and got.get("bytes_ok") is True and
              got.get("close_status") == 0,
              f"bridge {name}: open {got.get('open_status')}, {got.get('bytes_checked')} bytes "
              f"checked at pointer + {job['off']}: {'equal' if got.get('bytes_ok') else 'DIFFERENT'}, "
              f"close {got.get('close_status')}")
        if name == "large" and got.get("open_status") == 0:
            print(f"      open latency: {got['open_ms']:.1f} ms for an export of {exported} bytes "
                  f"({exported / (1 << 30) if exported else 0:.2f} GiB); close {got['close_ms']:.1f} ms",
                  flush=True)
        p.stdin.write("next\n")
        p.stdin.flush()
    p.stdin.close()
    p.wait(timeout=120)
    check(p.returncode == 0, f"bridge exporter exit {p.returncode}")
    notes = [r["msg"] for r in records(os.path.join(logdir, "bridge-exporter.*.log")) if r.get("k") == "note"]
    check(sum("opened by pid" in n for n in notes) == 2, "bridge: the exporter's log records both opens")
    result["failures"] = failures
    result["logs"] = logdir
    with open(os.path.join(out, "ipc_bridge_pair.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
