# SPDX-License-Identifier: Apache-2.0
# PyTorch workloads run under `cumemguard run` on the GPU machine: the default caching allocator,
# expandable segments, the cudaMallocAsync backend, and a 1-rank NCCL process group. Each checks
# its own numbers and exits 0; the shim's log is checked afterwards by run_torch.py.
import os
import sys

import torch


def churn(steps=50):
    x = torch.randn(1024, 1024, device="cuda")
    total = 0.0
    for i in range(steps):
        ts = [torch.empty((4 + i % 5) << 20, dtype=torch.uint8, device="cuda") for _ in range(6)]
        y = x @ x
        total += float(y[0, 0])
        del ts
        if i % 10 == 9:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return total


def nccl(iters=20):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    for i in range(iters):
        t = torch.full((1 << 20,), float(i), device="cuda")
        dist.all_reduce(t)
        assert float(t[0]) == float(i), (float(t[0]), i)
        if i % 5 == 4:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    dist.destroy_process_group()


def main():
    mode = sys.argv[1]
    torch.cuda.init()
    if mode in ("default", "expandable", "async"):
        churn()
    elif mode == "nccl":
        nccl()
    elif mode == "expandable-nccl":
        churn(30)
        nccl()
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"workload {mode} ok")


if __name__ == "__main__":
    main()
