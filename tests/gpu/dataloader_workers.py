# SPDX-License-Identifier: Apache-2.0
# PyTorch's DataLoader with forked workers, as a training job has it: the parent holds CUDA memory
# and a model step, the workers (forked; multiprocessing ends each with os._exit) make batches on
# the CPU, and the workers of a second loader call the driver (refused in a forked child). Prints the
# loss and the batch sum, which must be the same with and without the shim.
#   dataloader_workers.py
import ctypes
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((16,), float(i * i))


class TouchesCuda(Squares):
    def __getitem__(self, i):
        # A forked worker's own driver call (PyTorch would refuse one before the driver: "Cannot
        # re-initialize CUDA in forked subprocess"): the driver refuses it in a forked child, and the
        # worker goes on. It makes the shim active in the worker, whose log then ends at its _exit.
        p = ctypes.c_uint64()
        ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
        return super().__getitem__(i)


def main():
    torch.multiprocessing.set_start_method("fork", force=True)
    w = torch.randn(16, 1, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    total = 0.0
    for ds in (Squares(), TouchesCuda()):
        for batch in DataLoader(ds, batch_size=8, num_workers=2):
            total += float(batch.sum())
            loss = (batch.cuda() @ w).square().mean()
    torch.cuda.synchronize()
    print("batches_sum", total)
    print("loss_finite", int(torch.isfinite(loss).item()))
    print("pid", os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
