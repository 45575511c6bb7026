# SPDX-License-Identifier: Apache-2.0
# PyTorch workload of tests/gpu/transport.sh: a 1-rank NCCL process group, a small training loop
# whose gradients are all-reduced, and torch.cuda.empty_cache() every iteration while a kernel
# keeps the device busy (so a synchronizing flush blocks measurably). Checks its own numbers and
# prints one JSON object with what transport_check.py compares against the shim's log.
#   python3 transport_workload.py native|expandable|async|defer|ctypes
import ctypes
import json
import os
import sys
import time

import torch
import torch.distributed as dist

ITERS = 12
SLEEP_CYCLES = int(3e8)  # torch.cuda._sleep: about 150 ms on an H200 (2e9 ~ 1 s, nccl-and-cleanup.md 2.2)
BLOCK = 256 << 20        # two blocks cached and flushed per iteration


class CacheCleanup:
    """The adopted helper of docs/transport.md: the shim decides when it is preloaded."""

    FLUSH = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def __init__(self):
        try:
            lib = ctypes.CDLL(None)
            self._maybe = lib.cumemguard_maybe_empty_cache
            self._maybe.argtypes = [self.FLUSH, ctypes.c_void_p]
            self._maybe.restype = ctypes.c_int
        except AttributeError:
            self._maybe = None

    def maybe_empty_cache(self):
        if self._maybe is None:
            torch.cuda.empty_cache()
            return True
        return bool(self._maybe(self.FLUSH(lambda _a: torch.cuda.empty_cache()), None))


def main():
    mode = sys.argv[1]
    torch.manual_seed(0)
    torch.cuda.init()
    dev = torch.device("cuda:0")
    cleanup = CacheCleanup() if mode == "ctypes" else None
    out = {"mode": mode, "iters": ITERS}

    # Before any communicator: a flush that is not opportunistic (and through the C API: it runs).
    tmp = [torch.empty(BLOCK, dtype=torch.uint8, device=dev) for _ in range(2)]
    del tmp
    if cleanup:
        out["before_ran"] = cleanup.maybe_empty_cache()
    else:
        torch.cuda.empty_cache()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)

    # Data that must survive every flush intact, and a model trained with all-reduced gradients.
    keep_cpu = torch.randint(0, 255, (64 << 20,), dtype=torch.uint8)
    keep = keep_cpu.to(dev)
    n, d = 4096, 64
    x_cpu = torch.randn(n, d, dtype=torch.float64)
    w_true = torch.randn(d, 1, dtype=torch.float64)
    y_cpu = x_cpu @ w_true
    x, y = x_cpu.to(dev), y_cpu.to(dev)
    w = torch.zeros(d, 1, dtype=torch.float64, device=dev)
    w_ref = torch.zeros(d, 1, dtype=torch.float64)
    lr = 0.5

    flush_ms, ran = [], []
    for i in range(ITERS):
        grad = x.T @ (x @ w - y) / n
        dist.all_reduce(grad)  # one rank: the sum is the gradient itself
        w -= lr * grad
        w_ref -= lr * (x_cpu.T @ (x_cpu @ w_ref - y_cpu) / n)
        t = torch.full((1 << 20,), float(i), device=dev)
        dist.all_reduce(t)
        assert float(t[0]) == float(i) and float(t[-1]) == float(i), (float(t[0]), i)
        blocks = [torch.empty(BLOCK, dtype=torch.uint8, device=dev) for _ in range(2)]
        for b in blocks:
            b.fill_(i & 0xFF)
        del blocks
        torch.cuda._sleep(SLEEP_CYCLES)  # the device stays busy: a synchronizing free waits
        t0 = time.perf_counter()
        if cleanup:
            ran.append(cleanup.maybe_empty_cache())
        else:
            torch.cuda.empty_cache()
        flush_ms.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()

    out["flush_ms"] = [round(v, 3) for v in flush_ms]
    out["ran"] = ran
    out["keep_intact"] = bool(torch.equal(keep.cpu(), keep_cpu))
    out["w_max_err"] = float((w.cpu() - w_ref).abs().max())
    out["loss"] = float(((x @ w - y) ** 2).mean())

    if mode == "defer":
        # The flushes' memory is still held by the shim: the driver reports it as used. An
        # allocation larger than what the driver has free succeeds after the automatic release.
        free, total = torch.cuda.mem_get_info()
        want = free + (1 << 30)
        out["free_before_big"] = free
        out["big_bytes"] = want
        big = torch.empty(want, dtype=torch.uint8, device=dev)
        big[-(1 << 20):].fill_(3)
        torch.cuda.synchronize()
        out["big_ok"] = int(big[-1]) == 3
        out["free_after_big"] = torch.cuda.mem_get_info()[0]
        del big

    dist.destroy_process_group()
    out["ok"] = out["keep_intact"] and out["w_max_err"] < 1e-9 and out.get("big_ok", True)
    print("RESULT " + json.dumps(out))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
