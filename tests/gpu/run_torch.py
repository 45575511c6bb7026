#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs torch_workload.py under `cumemguard run` with each allocator configuration and checks the
# shim's logs: the run exits 0, PyTorch's and NCCL's calls are seen, and no finding is reported
# on these legitimate patterns.
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

RUNS = {
    "default": dict(env={}, want_calls=["cudaMalloc", "cudaFree"]),
    "expandable": dict(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                       want_calls=["cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
                                   "cuMemAddressReserve"]),
    "async": dict(env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                  want_calls=["cudaMallocAsync", "cudaFreeAsync"]),
    "nccl": dict(env={}, want_calls=["ncclCommInitRankConfig", "cuMemCreate", "cuMemMap",
                                     "cuMemRelease", "cuMemRetainAllocationHandle"]),
    "expandable-nccl": dict(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                            want_calls=["cuMemCreate", "ncclCommInitRankConfig"]),
}


def load(path):
    with open(path) as f:
        return [json.loads(l) for l in f]


def main():
    build, out = sys.argv[1], sys.argv[2]
    modes = sys.argv[3:] or list(RUNS)
    cg = os.path.join(build, "tools", "cumemguard")
    failures = 0
    for mode in modes:
        r = RUNS[mode]
        logdir = tempfile.mkdtemp(prefix=f"cmg-torch-{mode}-")
        env = dict(os.environ)
        env.update(r["env"])
        env["NCCL_NVLS_ENABLE"] = "0"
        cmd = [cg, "run", "--log", os.path.join(logdir, "log.%p"), "--",
               sys.executable, os.path.join(HERE, "torch_workload.py"), mode]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        with open(os.path.join(out, f"torch-{mode}.txt"), "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in r["env"].items()) + " " +
                    " ".join(cmd) + "\n" + p.stdout)
        problems = []
        if p.returncode != 0:
            problems.append(f"exit {p.returncode}")
        logs = glob.glob(os.path.join(logdir, "log.*"))
        calls, findings, sizes = {}, [], set()
        for lp in logs:
            for rec in load(lp):
                if rec.get("k") == "summary":
                    for k, v in rec["calls"].items():
                        calls[k] = calls.get(k, 0) + v
                elif rec.get("k") == "finding":
                    findings.append((rec["class"], rec["msg"]))
                elif rec.get("k") == "call" and rec["api"] == "cuMemCreate" and rec["res"] == 0:
                    sizes.add(rec["args"]["size"])
        for c in r["want_calls"]:
            if not calls.get(c):
                problems.append(f"no {c} seen")
        if findings:
            problems.append(f"{len(findings)} findings: {findings[:3]}")
        if mode == "expandable" and (20 << 20) not in sizes:
            problems.append(f"no 20 MiB expandable-segment pages among cuMemCreate sizes {sorted(sizes)[:8]}")
        line = f"{mode}: calls " + ", ".join(f"{k} {v}" for k, v in sorted(calls.items()))
        print(line)
        print(f"{mode}: {'ok' if not problems else 'FAIL ' + '; '.join(problems)}")
        failures += bool(problems)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
