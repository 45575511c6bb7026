#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# PyTorch's CUDA graphs under the shim (the gpu part capture.sh): torch.cuda.graph captures a small
# model's step with each allocator configuration, replays it and compares the result with the same
# step run eagerly; under `cumemguard run` the run must exit 0 with no finding, and the log must show
# the capture (begin and end with a graph) and, for the native allocator, the private pool's memory
# as the graph's.
#   capture_torch.py BUILD OUT            (every mode; exit 0 when all agree)
#   capture_torch.py --workload MODE      (one workload, run under cumemguard run)
import glob
import json
import os
import subprocess
import sys
import tempfile

MODES = {
    "native": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def workload(mode):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256)).cuda()
    static_in = torch.randn(64, 256, device="cuda")
    # Warm-up on a side stream, as the torch.cuda.graphs documentation asks.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = model(static_in)
    ok = True
    for i in range(3):
        x = torch.randn(64, 256, device="cuda")
        static_in.copy_(x)
        g.replay()
        torch.cuda.synchronize()
        ok &= torch.allclose(static_out, model(x), atol=1e-5)
    # A second graph sharing the first one's pool, then both released.
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, pool=g.pool()):
        static_out2 = model(static_out)
    g2.replay()
    torch.cuda.synchronize()
    ok &= torch.allclose(static_out2, model(static_out), atol=1e-5)
    del g, g2, static_out, static_out2
    torch.cuda.empty_cache()
    print("replay_ok", int(ok))
    print("mode", mode)
    return 0 if ok else 1


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def main():
    if sys.argv[1] == "--workload":
        return workload(sys.argv[2])
    build, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    cg = os.path.join(build, "tools", "cumemguard")
    failures = 0
    for mode, env_add in MODES.items():
        logdir = tempfile.mkdtemp(prefix=f"cmg-capture-{mode}-")
        env = dict(os.environ)
        env.update(env_add)
        cmd = [cg, "run", "--log", os.path.join(logdir, "log.%p"), "--", sys.executable,
               os.path.abspath(__file__), "--workload", mode]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
        with open(os.path.join(out, f"capture-torch-{mode}.txt"), "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in env_add.items()) + " " +
                    " ".join(cmd) + "\n" + p.stdout)
        problems = []
        if p.returncode != 0:
            problems.append(f"exit {p.returncode}")
        if "replay_ok 1" not in p.stdout:
            problems.append("the replayed graph's result differs from the eager step")
        findings, begins, ends, graph_bytes = [], [], [], 0
        for lp in glob.glob(os.path.join(logdir, "log.*")):
            for rec in load(lp):
                if rec.get("k") == "finding":
                    findings.append((rec["class"], rec["msg"][:200]))
                elif rec.get("k") == "call" and "BeginCapture" in rec.get("api", ""):
                    begins.append(rec)
                elif rec.get("k") == "call" and "EndCapture" in rec.get("api", ""):
                    ends.append(rec)
                elif rec.get("k") == "summary":
                    graph_bytes += sum(b["total"] for b in rec["bytes"] if b["mem"] == "graph")
        if findings:
            problems.append(f"{len(findings)} findings: {findings[:3]}")
        if len(begins) < 2 or not all(b["res"] == 0 and b["args"].get("capture") for b in begins):
            problems.append(f"captures not seen begin: {begins[:2]}")
        if len(ends) != len(begins) or not all(e["res"] == 0 and e["args"].get("graph")
                                               for e in ends):
            problems.append(f"captures not seen end with a graph: {ends[:2]}")
        if mode == "native" and graph_bytes == 0:
            problems.append("the private pool's memory is not counted as the graph's")
        print(f"{mode}: captures {len(begins)}, graph bytes {graph_bytes}: "
              f"{'ok' if not problems else 'FAIL ' + '; '.join(problems)}")
        failures += bool(problems)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
