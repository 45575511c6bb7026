# SPDX-License-Identifier: Apache-2.0
# One process of the PyTorch benchmark (tests/gpu/bench.py runs it without and with the shim): a
# small training loop whose batch size changes every step, so that the expandable-segments
# allocator maps, unmaps and releases pages, an empty_cache() every 10 steps, and a 1-rank NCCL
# all-reduce of the gradients. Prints the median step time after a warm-up.
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    steps = int(os.environ.get("CMG_BENCH_STEPS", "200"))
    warm = 20
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    times = []
    for i in range(steps + warm):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = 256 + 512 * (i % 7)  # shapes change: the allocator grows and shrinks
        x = torch.randn(batch, 1024, device=dev)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        if i % 10 == 9:
            torch.cuda.empty_cache()  # unmap and release, then map again next step
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    times = times[warm:]
    print(f"step_ms_median={statistics.median(times) * 1e3:.4f} "
          f"step_ms_min={min(times) * 1e3:.4f} steps={len(times)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
