#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Compares what `cumemguard config --json` predicts for an allocator environment with what torch
# really does on this machine: the snapshot's allocator_settings, the exception at the first CUDA
# allocation, or the abort during `import torch`; also with the shim's override applied at load.
# Writes a markdown agreement table. Any disagreement is a parser bug, not a row to loosen.
#   alloc_conf_agreement.py BUILD_DIR OUT_DIR
import concurrent.futures as cf
import json
import os
import subprocess
import sys

VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
C, A, H = VARS[0], VARS[2], VARS[1]

# (row id from cases/alloc-conf-vectors.md, environment, shim override or None)
VECTORS = [
    ("1", {C: ""}, None),
    ("2", {C: "expandable_segments:True"}, None),
    ("3", {C: "expandable_segments:False"}, None),
    ("5", {C: "expandable_segments:1"}, None),
    ("7", {C: "Expandable_Segments:True"}, None),
    ("8", {C: "max_split_size_mb:512"}, None),
    ("9", {C: "max_split_size_mb:20"}, None),
    ("10", {C: "max_split_size_mb:19"}, None),
    ("11", {C: "max_split_size_mb:abc"}, None),
    ("14", {C: "garbage_collection_threshold:0.8"}, None),
    ("15", {C: "garbage_collection_threshold:1.0"}, None),
    ("17", {C: "garbage_collection_threshold:abc"}, None),
    ("18", {C: "roundup_power2_divisions:4"}, None),
    ("19", {C: "roundup_power2_divisions:3"}, None),
    ("20", {C: "roundup_power2_divisions:[256:1,512:2,>:4]"}, None),
    ("24", {C: "roundup_power2_divisions:[300:2]"}, None),
    ("25", {C: "roundup_power2_divisions:[256:1,512:2"}, None),
    ("28", {C: "backend:cudaMallocAsync"}, None),
    ("29", {C: "backend:foo"}, None),
    ("31", {C: "foo:bar"}, None),
    ("32", {C: "release_lock_on_cudamalloc:True"}, None),
    ("33", {C: "pinned_use_cuda_host_register:True,pinned_num_register_threads:8"}, None),
    ("34", {C: "pinned_num_register_threads:3"}, None),
    ("38", {C: "graph_capture_record_stream_reuse:True"}, None),
    ("40", {C: "large_segment_size_mb:64,max_split_size_mb:32"}, None),
    ("43", {C: "expandable_segments:True,"}, None),
    ("45", {C: "expandable_segments:True,,max_split_size_mb:64"}, None),
    ("47", {C: "expandable_segments=True"}, None),
    ("48", {C: "expandable_segments:True,expandable_segments:False"}, None),
    ("53", {C: "expandable_segments:True", A: "max_split_size_mb:256"}, None),
    ("55", {A: "expandable_segments:True"}, None),
    ("58", {C: "expandable_segments:True", H: "max_split_size_mb:64"}, None),
    ("60", {A: "release_lock_on_cudamalloc:True"}, None),
    ("P20", {C: "expandable_segments"}, None),
    # Keys of later releases, judged for the installed 2.11 (policy/torch_releases.def): 2.12's
    # throw_on_cudamalloc_oom and pinned_free_catch_all, and the next release's reserve, all raise.
    ("R12", {C: "per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True"}, None),
    ("R12b", {C: "pinned_free_catch_all:True"}, None),
    ("R15", {C: "expandable_segments_reserve:0.5"}, None),
    ("P22", {C: "max_split_size_mb:512,garbage_collection_threshold:0.8,expandable_segments:True"},
     "expandable_segments:False"),
    ("ovr-alloc", {A: "expandable_segments:True,max_split_size_mb:128"}, "expandable_segments:False"),
    ("ovr-create", {}, "expandable_segments:True"),
    ("ovr-remove", {C: "max_split_size_mb:64,garbage_collection_threshold:0.5"},
     "-garbage_collection_threshold"),
]

PROBE = r"""
import json
import torch
out = {}
try:
    torch.empty(16, device="cuda")
    out["backend"] = torch.cuda.get_allocator_backend()
    if out["backend"] == "native":
        out["snapshot"] = torch.cuda.memory._snapshot()["allocator_settings"]
    out["outcome"] = "ok"
except Exception as e:
    out.update(outcome="exception", type=type(e).__name__, message=str(e))
print("RESULT " + json.dumps(out))
"""


def predict(cg, env, override):
    args = [cg, "config", "--json"]
    for v in VARS:
        args += ["--env", f"{v}={env[v]}" if v in env else v]
    if override is not None:
        args += ["--env", f"CUMEMGUARD_TORCH_ALLOC_CONF={override}"]
    p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pred = json.loads(p.stdout)["torch"]
    if override is None:
        return pred, env
    ov = pred["override"]
    if ov["action"] != "write":
        return pred, env
    after = dict(env)
    for w in ov["writes"]:
        after[w["variable"]] = w["new"]
    return predict(cg, after, None)[0], after


def observe(env, shim=None, override=None):
    e = {k: v for k, v in os.environ.items() if k not in VARS and not k.startswith("CUMEMGUARD_")}
    e.update(env)
    if shim:
        e["LD_PRELOAD"] = shim
        e["CUMEMGUARD_TORCH_ALLOC_CONF"] = override
    p = subprocess.run([sys.executable, "-c", PROBE], env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=180)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), p.stderr
    if p.returncode in (-6, 134):
        return {"outcome": "import-abort"}, p.stderr
    return {"outcome": f"crash rc={p.returncode}"}, p.stderr


def close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) < 1e-9
    if isinstance(a, dict) and isinstance(b, dict):
        return set(a) == set(b) and all(close(a[k], b[k]) for k in a)
    return a == b


def compare(pred, obs):
    po, oo = pred["outcome"], obs["outcome"]
    if po != oo:
        return False, f"outcome predicted {po}, observed {oo}"
    if po == "exception":
        err = pred["error"]
        if err["type"] != obs["type"]:
            return False, f"type {err['type']} vs {obs['type']}"
        if err["message"] not in obs["message"]:
            return False, f"message {err['message']!r} not in {obs['message'][:160]!r}"
        return True, f"{obs['type']}: {err['message'][:60]}"
    if po == "import-abort":
        return True, "import aborted (SIGABRT)"
    if pred["load_backend"] != obs.get("backend"):
        return False, f"backend {pred['load_backend']} vs {obs.get('backend')}"
    if pred["snapshot"] is None:
        return True, f"backend {obs['backend']}"
    diffs = [k for k in pred["snapshot"] if not close(pred["snapshot"][k], obs["snapshot"].get(k))]
    extra = [k for k in obs["snapshot"] if k not in pred["snapshot"]]
    if diffs or extra:
        return False, "; ".join(f"{k}: {pred['snapshot'].get(k)!r} vs {obs['snapshot'].get(k)!r}"
                                for k in diffs + extra)
    s = obs["snapshot"]
    return True, (f"es={s['expandable_segments']} ms={s['max_split_size']} "
                  f"gc={s['garbage_collection_threshold']}")


def one(cg, shim, row):
    rid, env, override = row
    pred, after = predict(cg, env, override)
    if override is None:
        obs, err = observe(env)
    else:
        obs, err = observe(env, shim, override)
    ok, detail = compare(pred, obs)
    envtxt = " ".join(f"{k.replace('PYTORCH_', '').replace('_ALLOC_CONF', '')}={v!r}"
                      for k, v in env.items()) or "(none)"
    if override is not None:
        envtxt += f" + CUMEMGUARD_TORCH_ALLOC_CONF={override!r} (under the shim)"
    return rid, envtxt, pred["outcome"], obs["outcome"], ok, detail


def main():
    build, out = sys.argv[1], sys.argv[2]
    cg = os.path.join(build, "tools", "cumemguard")
    shim = os.path.abspath(os.path.join(build, "shim", "libcumemguard.so"))
    with cf.ThreadPoolExecutor(max_workers=8) as ex:
        rows = list(ex.map(lambda r: one(cg, shim, r), VECTORS))
    lines = ["| # | environment | predicted | observed (torch " +
             subprocess.run([sys.executable, "-c", "import torch;print(torch.__version__)"],
                            stdout=subprocess.PIPE, text=True).stdout.strip() +
             ") | agree | detail |", "|---|---|---|---|---|---|"]
    bad = 0
    for rid, envtxt, po, oo, ok, detail in rows:
        bad += not ok
        lines.append(f"| {rid} | `{envtxt}` | {po} | {oo} | {'yes' if ok else '**NO**'} | "
                     f"{detail.replace('|', '/')} |")
    lines.append("")
    lines.append(f"{len(rows) - bad} of {len(rows)} vectors agree.")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "alloc-conf-agreement.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
