#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# PyTorch under `cumemguard run`: the caching allocator's segment allocation (cudaMalloc from
# libc10_cuda.so) must carry the Python frames of the line that asked for the memory, and
# empty_cache()'s free the line that flushed, read from the event log.
#   pyframes_torch.py CUMEMGUARD OUT_DIR            (the workload: pyframes_torch.py --work)
import json
import os
import subprocess
import sys


def work():
    import torch
    x = torch.empty(96 << 20, dtype=torch.uint8, device="cuda")  # @alloc
    torch.cuda.synchronize()
    del x
    torch.cuda.empty_cache()  # @flush
    print("done")


def line_of(marker):
    with open(__file__, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.rstrip().endswith("# " + marker):
                return n
    raise SystemExit("no marker " + marker)


def main():
    if sys.argv[1:] == ["--work"]:
        return work()
    cg, out = sys.argv[1], sys.argv[2]
    log = os.path.join(out, "pyframes_torch.log")
    p = subprocess.run([cg, "run", "--no-summary", "--log", log, "--", sys.executable,
                        os.path.abspath(__file__), "--work"], capture_output=True, text=True,
                       timeout=600)
    print(p.stdout.strip(), p.stderr[-300:].strip())
    codes, stacks, calls = {}, {}, []
    with open(log, encoding="utf-8") as f:
        for raw in f:
            r = json.loads(raw)
            if r.get("k") == "pycode":
                codes[r["id"]] = r
            elif r.get("k") == "stack":
                stacks[r["id"]] = r
            elif r.get("k") == "call" and r.get("api") in ("cudaMalloc", "cudaFree"):
                calls.append(r)
    me = os.path.abspath(__file__)

    def sites(call):
        st = stacks.get(call.get("stack"), {})
        return [(codes[c]["name"], codes[c]["file"], line) for _, c, line in st.get("py", [])
                if c in codes]

    want_alloc = ("work", me, line_of("@alloc"))
    want_free = ("work", me, line_of("@flush"))
    mallocs = [c for c in calls if c["api"] == "cudaMalloc" and c.get("res") == 0]
    frees = [c for c in calls if c["api"] == "cudaFree" and c.get("res") == 0]
    ok_alloc = any(want_alloc in sites(c) for c in mallocs)
    ok_free = any(want_free in sites(c) for c in frees)
    print(f"torch segment cudaMalloc names {want_alloc}: {ok_alloc} ({len(mallocs)} mallocs)")
    print(f"torch empty_cache cudaFree names {want_free}: {ok_free} ({len(frees)} frees)")
    if p.returncode != 0 or "done" not in p.stdout or not ok_alloc or not ok_free:
        print("FAIL pyframes torch")
        for c in mallocs[:3] + frees[:3]:
            print(" ", c["api"], sites(c)[:4])
        return 1
    print("ok pyframes torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
