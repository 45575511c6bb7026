#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The shim's C API from Python with ctypes, the way a program adopts it around
# torch.cuda.empty_cache() (docs/transport.md). Here the flush is a Python callback that frees
# device memory through the CUDA runtime, so the script needs no torch and runs on the fake stack.
# Prints one "step value" line per result (tests/integration/run_case.py checks them).
import ctypes
import sys

FLUSH = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class CacheCleanup:
    """Optional cache flushes that step aside once a transport is live.

    With libcumemguard.so preloaded the shim decides (cumemguard_maybe_empty_cache); without it
    every flush runs, exactly as before the program adopted the helper.
    """

    def __init__(self):
        try:
            lib = ctypes.CDLL(None)  # the process's global scope: the preloaded shim is in it
            self._maybe = lib.cumemguard_maybe_empty_cache
            self._suppress = lib.cumemguard_suppress_opportunistic_cleanup
            self._suppressed = lib.cumemguard_opportunistic_cleanup_suppressed
            self._release = lib.cumemguard_release_deferred
        except AttributeError:
            self._maybe = None
            return
        self._maybe.argtypes = [FLUSH, ctypes.c_void_p]
        self._maybe.restype = ctypes.c_int
        self._suppress.argtypes = []
        self._suppress.restype = None
        self._suppressed.restype = ctypes.c_int
        self._release.restype = ctypes.c_size_t

    @property
    def present(self):
        return self._maybe is not None

    def maybe_empty_cache(self, flush):
        """Runs flush() unless opportunistic cleanup is suppressed; True when it ran."""
        if self._maybe is None:
            flush()
            return True
        cb = FLUSH(lambda _arg: flush())  # kept alive for the duration of the call
        return bool(self._maybe(cb, None))

    def suppress(self):
        """Call before a transport the shim cannot see (UCXX, custom) starts background work."""
        if self._maybe is not None:
            self._suppress()

    def suppressed(self):
        return bool(self._suppressed()) if self._maybe is not None else False

    def release_deferred(self):
        return int(self._release()) if self._maybe is not None else None


def main():
    cudart = ctypes.CDLL("libcudart.so.13")
    cudart.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    cudart.cudaFree.argtypes = [ctypes.c_void_p]
    cleanup = CacheCleanup()
    print("api", "present" if cleanup.present else "absent")

    buffers = []
    calls = [0]

    def flush():  # stands for torch.cuda.empty_cache
        calls[0] += 1
        while buffers:
            print("flush.free", cudart.cudaFree(buffers.pop()))

    def cache(size):
        p = ctypes.c_void_p()
        assert cudart.cudaMalloc(ctypes.byref(p), size) == 0
        buffers.append(p.value)

    cache(1 << 20)
    print("before.suppressed", int(cleanup.suppressed()))
    print("before.ran", int(cleanup.maybe_empty_cache(flush)))
    print("before.callback_calls", calls[0])
    cleanup.suppress()  # e.g. right before starting a UCXX listener
    print("suppressed", int(cleanup.suppressed()))
    cache(2 << 20)
    print("after.ran", int(cleanup.maybe_empty_cache(flush)))
    print("after.callback_calls", calls[0])
    released = cleanup.release_deferred()
    print("release_deferred", "absent" if released is None else released)
    for p in buffers:  # an intentional release keeps its direct call
        print("intentional.free", cudart.cudaFree(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
