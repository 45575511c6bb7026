#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The cumemguard package on the real PyTorch (gpu part python_api.sh): with expandable segments
# on, torch.cuda.memory._snapshot()["allocator_settings"] before, inside and after
# cumemguard.expandable_segments(False) — equal before and after, only expandable_segments off
# inside — and legacy IPC (cudaIpcGetMemHandle through ctypes on libcudart, as custom all-reduce
# does) of a buffer allocated inside the block succeeding while one allocated outside fails.
# Mixed legacy and unified-only configurations, without the shim and under `cumemguard run`.
#   python_api_check.py BUILD OUT
#   python_api_check.py --workload        (one run, prints a JSON object)
import json
import os
import subprocess
import sys

CONFS = {
    "legacy": ("PYTORCH_CUDA_ALLOC_CONF",
               "max_split_size_mb:512,garbage_collection_threshold:0.8,"
               "roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True"),
    "unified": ("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6,expandable_segments:True"),
}
INVALID_VALUE = 1  # cudaErrorInvalidValue: legacy IPC refuses VMM memory (real-driver.md section 2)


def workload():
    import ctypes

    import cumemguard
    import torch

    out = {"torch": torch.__version__}
    a = cumemguard.active()
    out["active"] = [a.loaded, a.version]
    out["getters"] = {
        "torch.cuda.memory.get_allocator_settings":
            hasattr(torch.cuda.memory, "get_allocator_settings"),
        "torch._C._accelerator_getAllocatorSettings":
            hasattr(torch._C, "_accelerator_getAllocatorSettings"),
        "torch._C._accelerator_setAllocatorSettings":
            hasattr(torch._C, "_accelerator_setAllocatorSettings"),
    }
    rt = ctypes.CDLL("libcudart.so.13")
    rt.cudaIpcGetMemHandle.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    rt.cudaIpcGetMemHandle.restype = ctypes.c_int

    def export(t):
        handle = ctypes.create_string_buffer(64)  # cudaIpcMemHandle_t
        return rt.cudaIpcGetMemHandle(handle, ctypes.c_void_p(t.data_ptr()))

    def settings():
        return torch.cuda.memory._snapshot()["allocator_settings"]

    def expandable_segment_of(t):
        for s in torch.cuda.memory._snapshot()["segments"]:
            if s["address"] <= t.data_ptr() < s["address"] + s["total_size"]:
                return s.get("is_expandable")
        return None

    warm = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")  # the allocator is set up
    out["before"] = settings()
    with cumemguard.expandable_segments(False) as block:
        out["inside"] = settings()
        inside = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        out["export_inside"] = export(inside)
    out["after"] = settings()
    # Larger than what is left of the block's segment (20 MiB, 8 MiB used): a segment made now,
    # with the settings restored (a smaller one would be carved from the block's segment).
    outside = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["export_outside"] = export(outside)
    out["segment_inside_expandable"] = expandable_segment_of(inside)
    out["segment_outside_expandable"] = expandable_segment_of(outside)
    out["plan"] = block.plan
    out["findings"] = cumemguard.findings()
    del warm, inside, outside
    print(json.dumps(out))


def check(name, shim, r):
    problems = []
    if r["before"] != r["after"]:
        problems.append(f"settings after {r['after']} != before {r['before']}")
    if r["before"].get("expandable_segments") is not True:
        problems.append("expandable segments not on before the block")
    if r["inside"].get("expandable_segments") is not False:
        problems.append("expandable segments not off inside the block")
    diff = {k for k in r["before"] if k not in ("expandable_segments", "PYTORCH_CUDA_ALLOC_CONF")
            and r["inside"].get(k) != r["before"][k]}
    if diff:
        problems.append(f"inside the block also changed {sorted(diff)}")
    if r["export_inside"] != 0:
        problems.append(f"export of the buffer allocated inside: {r['export_inside']}")
    if r["export_outside"] != INVALID_VALUE:
        problems.append(f"export of the buffer allocated outside: {r['export_outside']}")
    if r["segment_inside_expandable"] is not False or r["segment_outside_expandable"] is not True:
        problems.append(f"segments inside/outside expandable: {r['segment_inside_expandable']}/"
                        f"{r['segment_outside_expandable']}")
    if r["active"][0] != shim:
        problems.append(f"active() {r['active']}")
    want_findings = {"ipc-vmm": 1} if shim else None  # the refused export, under the shim
    if r["findings"] != want_findings:
        problems.append(f"findings {r['findings']}, expected {want_findings}")
    return problems


def main():
    if sys.argv[1] == "--workload":
        workload()
        return 0
    build, out = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    cg = os.path.join(build, "tools", "cumemguard")
    bad = 0
    for name, (var, conf) in CONFS.items():
        for shim in (False, True):
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("PYTORCH_", "CUMEMGUARD_"))}
            env[var] = conf
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(build, "python"),
                                                              env.get("PYTHONPATH")]))
            cmd = [sys.executable, os.path.abspath(__file__), "--workload"]
            if shim:
                cmd = [cg, "run", "--log", os.path.join(out, f"{name}.%p.log"), "--"] + cmd
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, timeout=600)
            label = f"{name}-{'shim' if shim else 'plain'}"
            with open(os.path.join(out, f"{label}.txt"), "w") as f:
                f.write(f"$ {var}='{conf}' {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            try:
                r = json.loads(p.stdout.strip().splitlines()[-1])
            except (IndexError, json.JSONDecodeError):
                print(f"{label}: FAIL exit {p.returncode}: {p.stderr[-2000:]}")
                bad += 1
                continue
            with open(os.path.join(out, f"{label}.json"), "w") as f:
                json.dump(r, f, indent=2)
            problems = check(name, shim, r)
            if p.returncode != 0:
                problems.append(f"exit {p.returncode}")
            print(f"{label}: {'ok' if not problems else 'FAIL ' + '; '.join(problems)}")
            print(f"  export inside {r['export_inside']}, outside {r['export_outside']}; "
                  f"block set {r['plan']['result']!r}, restored {r['plan']['restore']!r}; "
                  f"getters {r['getters']}")
            bad += bool(problems)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
