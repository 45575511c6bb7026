#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# On the real PyTorch (the gpu part torch_path.sh): the release the shim finds loaded, the release
# `cumemguard config` finds installed, and the allocator path check — silent with the default
# allocator and with expandable segments, a `config` finding naming the variable for two faked
# mismatches (expandable segments asked for in the environment but turned off with PyTorch's own
# setter before the first allocation; caching turned off with PYTORCH_NO_CUDA_MEMORY_CACHING=1).
#   torch_path_check.py BUILD OUT          (runs the cases; exit 0 when all agree)
#   torch_path_check.py --workload MODE    (one workload, under cumemguard run)
import glob
import json
import os
import subprocess
import sys
import tempfile


def workload(mode):
    import torch

    if mode == "setter-off":
        # Behind the configuration's back: PyTorch's own setter, not cumemguard's API.
        torch._C._accelerator_setAllocatorSettings("expandable_segments:False")
    ts = [torch.empty(8 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
    torch.cuda.synchronize()
    try:  # not every mode has a snapshot
        s = torch.cuda.memory._snapshot()
        print("expandable_in_snapshot", s["allocator_settings"]["expandable_segments"])
        print("segments", [x.get("is_expandable") for x in s["segments"]])
    except Exception as e:
        print("snapshot", type(e).__name__, e)
    del ts
    torch.cuda.empty_cache()
    print("torch_version", torch.__version__)


EXP = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
CASES = [
    # name, environment, config findings expected (substrings of the one finding, or none)
    ("default", {}, None),
    ("expandable", EXP, None),
    ("unified-expandable", {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, None),
    ("setter-off", EXP, ["PyTorch's caching allocator makes segments with cudaMalloc",
                         "libc10_cuda.so) although PYTORCH_CUDA_ALLOC_CONF asks for "
                         "expandable_segments:True"]),
    ("no-caching", dict(EXP, PYTORCH_NO_CUDA_MEMORY_CACHING="1"),
     ["PyTorch's caching allocator makes segments with cudaMalloc",
      "PYTORCH_NO_CUDA_MEMORY_CACHING='1' turns torch"]),
]


def main():
    if sys.argv[1] == "--workload":
        workload(sys.argv[2])
        return 0
    build, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    cg = os.path.join(build, "tools", "cumemguard")
    bad = 0
    import torch  # only for the expected version

    want_version = torch.__version__
    for name, extra, want in CASES:
        logdir = tempfile.mkdtemp(prefix=f"cmg-path-{name}-")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "CUMEMGUARD_"))}
        env.update(extra)
        env["CUMEMGUARD_LOG_LEVEL"] = "info"
        mode = "setter-off" if name == "setter-off" else "plain"
        cmd = [cg, "run", "--log", os.path.join(logdir, "log.%p"), "--", sys.executable,
               os.path.abspath(__file__), "--workload", mode]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=600)
        with open(os.path.join(out, f"torch-path-{name}.txt"), "w") as f:
            f.write("$ " + " ".join(f"{k}={v}" for k, v in extra.items()) + " " + " ".join(cmd) +
                    "\n" + p.stdout)
        recs = [json.loads(l) for lp in glob.glob(os.path.join(logdir, "log.*")) for l in open(lp)]
        problems = []
        if p.returncode != 0:
            problems.append(f"exit {p.returncode}")
        notes = [r["msg"] for r in recs if r.get("k") == "note" and "is loaded" in r.get("msg", "")]
        if not any(n.startswith(f"PyTorch {want_version} is loaded (version from ") and
                   n.endswith("/torch/version.py)") for n in notes):
            problems.append(f"release not found: notes {notes}")
        configs = [r["msg"] for r in recs if r.get("k") == "finding" and r["class"] == "config"]
        others = [r["class"] for r in recs if r.get("k") == "finding" and r["class"] != "config"]
        if others:
            problems.append(f"other findings {others}")
        if want is None and configs:
            problems.append(f"config findings {configs}")
        if want is not None:
            if len(configs) != 1 or not all(w in configs[0] for w in want):
                problems.append(f"expected one config finding with {want}, got {configs}")
        print(f"{name}: {'ok' if not problems else 'FAIL ' + '; '.join(problems)}")
        if configs:
            print(f"  finding: {configs[0]}")
        bad += bool(problems)

    # `cumemguard config` finds the installed torch through this interpreter, without importing it.
    p = subprocess.run([cg, "config", "--json", "--python", sys.executable],
                       stdout=subprocess.PIPE, text=True, timeout=120)
    v = json.loads(p.stdout)["torch"]["torch_version"]
    with open(os.path.join(out, "torch-path-config.json"), "w") as f:
        json.dump(v, f, indent=2)
    ok = v["judged"] == want_version and v["source"].endswith("/torch/version.py (" +
                                                              sys.executable + ")")
    print(f"config: judged {v['judged']} from {v['source']}: {'ok' if ok else 'FAIL'}")
    bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
