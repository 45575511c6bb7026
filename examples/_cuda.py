# SPDX-License-Identifier: Apache-2.0
# What the examples share: the CUDA runtime and driver through ctypes (the process's own: PyTorch's
# wheel when torch is loaded, else the first on the library path), and VMM memory made the way
# PyTorch's expandable segments make it, for machines without torch.
import ctypes

CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CUDA_MEMCPY_DEVICE_TO_HOST = 2


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_ubyte * 64)]


def cudart():
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise SystemExit("no CUDA runtime (libcudart.so) on the library path")


def first_call(rc):
    """rc of a script's first CUDA call, or the end of the script when it failed: nothing after it
    would mean anything (every pointer NULL, "same address" by accident). The call itself stays
    in the script, so that its stack names the script's line."""
    if rc != 0:
        hint = (" (35: no CUDA driver; on a machine without a GPU put the build's tests/fakecuda "
                "first on LD_LIBRARY_PATH)" if rc == 35 else "")
        raise SystemExit(f"the first CUDA call returned {rc}{hint}")
    return rc


def driver():
    return ctypes.CDLL("libcuda.so.1")


def range_start(ptr):
    """The start of the reservation holding ptr (what cudaIpcGetMemHandle must be given)."""
    base = ctypes.c_uint64(0)
    r = driver().cuPointerGetAttribute(ctypes.byref(base), CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                       ctypes.c_uint64(ptr))
    if r != 0:
        raise SystemExit(f"cuPointerGetAttribute(RANGE_START_ADDR) returned {r}")
    return base.value


def pattern(n):
    block = bytes((i * 7 + 13) % 251 for i in range(251))
    return (block * (n // 251 + 1))[:n]


class VmmBuffer:
    """n bytes of VMM memory mapped page by page into one reservation, starting half a page in,
    as an expandable segment holds a tensor (cuMemCreate + cuMemMap + cuMemSetAccess)."""

    def __init__(self, n, data):
        cu = self.cu = driver()
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
            _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                        ("flags", ctypes.c_int)]

        prop = Prop(1, 0, 1, 0)  # pinned, device 0, no shareable handle type (as PyTorch's)
        access = Access(1, 0, 3)
        gran = ctypes.c_size_t(0)
        check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        page = self.page = gran.value
        off = page // 2
        size = (off + n + page - 1) // page * page
        va, none = ctypes.c_uint64(0), ctypes.c_ulonglong(0)
        check(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                     ctypes.c_uint64(0), none), "cuMemAddressReserve")
        self.handles = []
        for p in range(size // page):
            h = ctypes.c_uint64(0)
            check(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(page), ctypes.byref(prop), none),
                  "cuMemCreate")
            at = ctypes.c_uint64(va.value + p * page)
            check(cu.cuMemMap(at, ctypes.c_size_t(page), ctypes.c_size_t(0), h, none), "cuMemMap")
            check(cu.cuMemSetAccess(at, ctypes.c_size_t(page), ctypes.byref(access),
                                    ctypes.c_size_t(1)), "cuMemSetAccess")
            self.handles.append(h)
        self.va, self.size, self.ptr = va.value, size, va.value + off
        check(cu.cuMemcpyHtoD_v2(ctypes.c_uint64(self.ptr), data, ctypes.c_size_t(n)), "cuMemcpyHtoD")

    def free(self):
        for i, h in enumerate(self.handles):
            self.cu.cuMemUnmap(ctypes.c_uint64(self.va + i * self.page), ctypes.c_size_t(self.page))
            self.cu.cuMemRelease(h)
        self.cu.cuMemAddressFree(ctypes.c_uint64(self.va), ctypes.c_size_t(self.size))


def check(r, what):
    if r != 0:
        raise SystemExit(f"{what} returned {r}")
