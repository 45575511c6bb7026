#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs the GPU benchmarks for tests/gpu/bench.sh: each round runs every configuration once, in
# turn, so slow drifts of the machine hit all of them alike; a configuration's figure is the median
# over rounds of its ratio to the run without the shim in the same round.
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIGS = [("base", None), ("track", {}), ("stacks16", {"CUMEMGUARD_STACKS": "16"})]
# operation -> (label, iterations per run): each run of the loop takes about a second
LOOP_OPS = {
    "alloc": ("cuMemAlloc_v2 + cuMemFree_v2, 2 MiB", 3000),
    "runtime": ("cudaMalloc + cudaFree, 2 MiB", 3000),
    "vmm": ("VMM cycle (create reserve map access unmap release free), 2 MiB", 3000),
    "vmm-page": ("VMM page after 4096 mapped (create map access unmap release), 2 MiB", 2000),
    "fail": ("cuMemUnmap refused by the driver", 20000),
    "gpa": ("cuGetProcAddress(\"cuMemAlloc\")", 20000),
    "not-intercepted": ("cuCtxSynchronize (not intercepted)", 20000),
}
# More rounds give a steadier median on a noisy machine: CMG_BENCH_LOOP_ROUNDS/CMG_BENCH_TORCH_ROUNDS.
LOOP_ROUNDS = int(os.environ.get("CMG_BENCH_LOOP_ROUNDS", "7"))
TORCH_ROUNDS = int(os.environ.get("CMG_BENCH_TORCH_ROUNDS", "4"))
TORCH_CONFIGS = [("base", None), ("track", {})]


def env_for(build, cfg):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_")}
    env.pop("LD_PRELOAD", None)
    if cfg is not None:
        env["LD_PRELOAD"] = os.path.join(build, "shim", "libcumemguard.so")
        env.update(cfg)
    return env


def run(cmd, env, raw, timeout=120):
    t0 = time.time()
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    raw.write(f"$ {'LD_PRELOAD=' + env['LD_PRELOAD'] + ' ' if 'LD_PRELOAD' in env else ''}"
              f"{' '.join(k + '=' + v for k, v in env.items() if k.startswith('CUMEMGUARD_'))} "
              f"{' '.join(cmd)}   ({time.time() - t0:.1f} s, exit {p.returncode})\n{p.stdout}\n")
    raw.flush()
    if p.returncode != 0:
        raise SystemExit(f"gpu bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-2000:]}")
    return p.stdout


def loops(build, raw):
    exe = os.path.join(build, "benchmarks", "cmg-bench-loop")
    ns = {c: {op: [] for op in LOOP_OPS} for c, _ in CONFIGS}
    identity = ""
    for r in range(LOOP_ROUNDS):
        for name, cfg in CONFIGS:
            ops = [f"{op}:{iters}" for op, (_, iters) in LOOP_OPS.items()]
            if r == 0:
                ops = ["identity"] + ops
            text = run([exe, "--batches", "10"] + ops, env_for(build, cfg), raw)
            for op in LOOP_OPS:
                m = re.search(rf"^op={re.escape(op)} .*ns_median=([\d.]+)", text, re.M)
                ns[name][op].append(float(m.group(1)))
            if r == 0 and name == "track":
                identity = "\n".join(l for l in text.splitlines() if l.startswith("identity="))
        print(f"  loop round {r + 1}/{LOOP_ROUNDS}", file=sys.stderr, flush=True)
    return ns, identity


def torch_steps(build, raw):
    ms = {c: [] for c, _ in TORCH_CONFIGS}
    port = 29600
    for r in range(TORCH_ROUNDS):
        for name, cfg in TORCH_CONFIGS:
            env = env_for(build, cfg)
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
            env["MASTER_ADDR"] = "127.0.0.1"
            env["MASTER_PORT"] = str(port)
            port += 1
            text = run([sys.executable, os.path.join(HERE, "bench_torch.py")], env, raw, timeout=300)
            m = re.search(r"step_ms_median=([\d.]+)", text)
            ms[name].append(float(m.group(1)))
        print(f"  torch round {r + 1}/{TORCH_ROUNDS}", file=sys.stderr, flush=True)
    return ms


def ratio(values, base):
    """Median over rounds of (with the shim / without it) within each round."""
    return statistics.median(a / b for a, b in zip(values, base))


def main():
    build, out = sys.argv[1], sys.argv[2]
    t0 = time.time()
    raw = open(os.path.join(out, "bench-raw.txt"), "w")
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version",
                              "--format=csv,noheader"], stdout=subprocess.PIPE, text=True).stdout.strip()
    except OSError:
        gpu = "unknown"
    ns, identity = loops(build, raw)
    ms = torch_steps(build, raw)
    lines = [f"GPU: {gpu}; {LOOP_ROUNDS} rounds (loops), {TORCH_ROUNDS} rounds (PyTorch), "
             f"configurations interleaved; ratio = median over rounds of (with shim / without) "
             f"in the same round; {time.time() - t0:.0f} s in all", "",
             "| operation | without shim, median ns | tracking: ratio | tracking: +ns | "
             "stacks 16: ratio | stacks 16: +ns |", "|---|---|---|---|---|---|"]
    for op, (label, _) in LOOP_OPS.items():
        base = statistics.median(ns["base"][op])
        cells = [label, f"{base:,.0f}"]
        for c in ("track", "stacks16"):
            cells += [f"{ratio(ns[c][op], ns['base'][op]):.4f}",
                      f"{statistics.median(ns[c][op]) - base:+,.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    base = statistics.median(ms["base"])
    lines += ["", "| PyTorch step (expandable segments, 1-rank NCCL all-reduce) | without shim, "
              "median ms | tracking: ratio |", "|---|---|---|",
              f"| training step | {base:.3f} | {ratio(ms['track'], ms['base']):.4f} |", "", "pointers handed out under the shim "
              "(not intercepted: the driver's own; intercepted: the shim's wrapper):", "```",
              identity.strip(), "```"]
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "bench.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
