#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard report` at scale (docs/performance.md, "Report at scale"): generates a realistic event
# log of a long training job (allocations and frees from a few hundred sites, VMM cycles, NCCL
# setup, stacks of 16 frames from 40 modules, a few findings, leaks at exit), then times the text
# report, --json and --trace on it, and a Python json.loads loop over the same file as the
# reference, each as a separate process: wall time and peak RSS (GNU time's %M).
#
#   benchmarks/report_scale.py --cumemguard build/tools/cumemguard [--size 43M|1G] [--runs 3]
#
# Targets: every output at least 4x faster than the Python loop; peak RSS at most half the log's
# size plus 64 MB. The figures it prints are medians over --runs runs of each: wall time, and CPU
# time (user + system, GNU time's %U %S), which a machine shared with other work disturbs less.
import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def generate(path, target_bytes, seed=1):
    rnd = random.Random(seed)
    pid = 41000
    modules = []
    base = 0x7F0000000000
    for i in range(40):
        size = rnd.choice([1, 2, 4, 8, 16]) << 20
        modules.append((f"/opt/venv/lib/python3.12/site-packages/torch/lib/libtorch_part{i}.so",
                        base, size))
        base += size + (1 << 24)
    stacks = []
    with open(path, "w") as f:
        w = f.write
        w('{"cumemguard_log":1,"tool":"0.1.0","pid":%d,"ppid":1,"rank":0,"host":"node7",'
          '"start_unix_ns":1764400000000000000,"argv":["python3","train.py","--epochs","90"],'
          '"mode":"guard","options":{"CUMEMGUARD_STACKS":"16"}}\n' % pid)
        for path_, b, s in modules:
            w('{"k":"module","path":"%s","base":"0x%x","size":%d,"build_id":"%040x"}\n'
              % (path_, b, s, rnd.getrandbits(160)))
        for sid in range(1, 401):
            pcs = []
            for _ in range(16):
                _, b, s = rnd.choice(modules)
                pcs.append('"0x%x"' % (b + rnd.randrange(s)))
            w('{"k":"stack","id":%d,"pcs":[%s]}\n' % (sid, ",".join(pcs)))
            stacks.append(sid)
        seq = 0
        ts = 1000000
        live = []
        next_ptr = 0x7F3000000000
        tids = [pid, pid + 1, pid + 2, pid + 3]
        vmm_base = 0x7E0000000000

        def call(api, args, mem=None, delta=0, dev=0, res=0, stack=None, extra=""):
            nonlocal seq, ts
            seq += 1
            ts += rnd.randrange(200, 4000)
            s = ('{"k":"call","seq":%d,"ts":%d,"tid":%d,"api":"%s","res":%d,"dur":%d,"args":{%s},'
                 '"dev":%d' % (seq, ts, rnd.choice(tids), api, res, rnd.randrange(800, 60000),
                               args, dev))
            if mem:
                s += ',"mem":"%s"' % mem
            if delta:
                s += ',"delta":%d' % delta
            if stack:
                s += ',"stack":%d' % stack
            w(s + extra + "}\n")

        # NCCL setup.
        seq += 1
        w('{"k":"nccl","seq":%d,"ts":%d,"tid":%d,"event":"init","api":"ncclCommInitRank",'
          '"comm":"0x55aa00001000","rank":0,"nranks":8,"dev":0,"res":0,"live":1,'
          '"suppressed":true}\n' % (seq, ts, pid))
        findings = 0
        while f.tell() < target_bytes:
            r = rnd.random()
            if r < 0.45 or not live:
                size = rnd.choice([512, 4096, 1 << 20, 2 << 20, 20 << 20])
                ptr = next_ptr
                next_ptr += size + 4096
                call("cudaMalloc", '"size":%d,"ptr":"0x%x"' % (size, ptr), "linear", size,
                     stack=rnd.choice(stacks))
                live.append((ptr, size))
                if len(live) > 3000:
                    rnd.shuffle(live)
            elif r < 0.9:
                ptr, size = live.pop()
                call("cudaFree", '"ptr":"0x%x"' % ptr, "linear", -size, stack=rnd.choice(stacks))
            elif r < 0.995:
                # A VMM cycle: reserve, create, map, access, unmap, release, free.
                va = vmm_base
                vmm_base += 1 << 26
                size = 2 << 20
                h = rnd.getrandbits(40)
                st = rnd.choice(stacks)
                call("cuMemAddressReserve", '"size":%d,"align":0,"addr":"0x0","flags":0,'
                     '"ptr":"0x%x"' % (size, va), "va", size, stack=st)
                call("cuMemCreate", '"size":%d,"loc_type":1,"loc_id":0,"handle_types":0,'
                     '"flags":0,"handle":"0x%x"' % (size, h), "vmm", size, stack=st)
                call("cuMemMap", '"ptr":"0x%x","size":%d,"offset":0,"handle":"0x%x","flags":0'
                     % (va, size, h), stack=st)
                call("cuMemSetAccess", '"ptr":"0x%x","size":%d,"count":1' % (va, size), stack=st)
                call("cuMemUnmap", '"ptr":"0x%x","size":%d' % (va, size), stack=st)
                call("cuMemRelease", '"handle":"0x%x"' % h, "vmm", -size, stack=st)
                call("cuMemAddressFree", '"ptr":"0x%x","size":%d' % (va, size), "va", -size,
                     stack=st)
            else:
                seq += 1
                findings += 1
                ptr = next_ptr
                w('{"k":"finding","seq":%d,"ts":%d,"tid":%d,"class":"double-free","api":"cudaFree",'
                  '"action":"skip","res":0,"args":{"ptr":"0x%x"},"msg":"cudaFree of 0x%x, which '
                  'was already freed at seq %d","stack":%d,"related":[{"what":"first free",'
                  '"seq":%d,"ts":%d,"tid":%d,"api":"cudaFree","stack":%d}]}\n'
                  % (seq, ts, pid, ptr, ptr, seq - 5, rnd.choice(stacks), seq - 5, ts - 9000, pid,
                     rnd.choice(stacks)))
        for ptr, size in live[:200]:
            w('{"k":"leak","what":"linear","api":"cudaMalloc","ptr":"0x%x","size":%d,"dev":0,'
              '"stack":%d}\n' % (ptr, size, rnd.choice(stacks)))
        w('{"k":"summary","ts":%d,"calls":{"cudaMalloc":1},"findings":{"double-free":%d}}\n'
          % (ts + 10, findings))
        w('{"k":"end","ts":%d}\n' % (ts + 20))
    return os.path.getsize(path)


def measure(argv):
    """Wall seconds and peak RSS (bytes) of one process. The peak comes from GNU time's %M: a
    process's high-water mark survives execve, so wait4() on a child forked from this Python would
    report this script's own size for any program smaller than it."""
    timer = shutil.which("time") or "/usr/bin/time"
    out = tempfile.mktemp(prefix="cmg-rss-")
    start = time.perf_counter()
    p = subprocess.run([timer, "-f", "%M %U %S", "-o", out] + argv, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    if p.returncode not in (0, 1):
        sys.exit(f"report_scale: {' '.join(argv)} exited {p.returncode}")
    with open(out) as f:
        rss_kb, user, sys_ = f.read().split()[-3:]
    os.remove(out)
    return wall, int(rss_kb) * 1024, float(user) + float(sys_)


PY_LOOP = "import json,sys\nfor line in open(sys.argv[1]):\n    json.loads(line)\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cumemguard", required=True)
    ap.add_argument("--size", default="43M")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="write the log here and keep it")
    a = ap.parse_args()
    target = parse_size(a.size)
    tmp = tempfile.mkdtemp(prefix="cmg-report-scale-")
    log = a.keep or os.path.join(tmp, "cumemguard.train.41000.log")
    t = time.perf_counter()
    size = generate(log, target)
    print(f"log: {size / 2**20:.1f} MiB ({size} bytes), generated in {time.perf_counter() - t:.1f} s")
    cases = [
        ("python json.loads loop", [sys.executable, "-c", PY_LOOP, log]),
        ("report (text)", [a.cumemguard, "report", log]),
        ("report --json", [a.cumemguard, "report", "--json", log]),
        ("report --trace", [a.cumemguard, "report", "--trace", os.path.join(tmp, "t.json"), log]),
        ("report --html", [a.cumemguard, "report", "--html", os.path.join(tmp, "r.html"), log]),
    ]
    results = {name: [] for name, _ in cases}
    for _ in range(a.runs):  # interleaved, so a change in machine load hits every case alike
        for name, argv in cases:
            results[name].append(measure(argv))
    limit = size / 2 + 64e6
    ref = statistics.median(w for w, _, _ in results[cases[0][0]])
    ref_cpu = statistics.median(c for _, _, c in results[cases[0][0]])
    print(f"runs: {a.runs} of each, interleaved; medians; load average {os.getloadavg()[0]:.1f}. "
          f"Peak RSS limit: {limit / 1e6:.0f} MB")
    print(f"{'case':<24} {'wall s':>8} {'vs python':>10} {'CPU s':>7} {'vs python':>10} "
          f"{'peak RSS MB':>12}  targets (speed on CPU time)")
    for name, _ in cases:
        wall = statistics.median(w for w, _, _ in results[name])
        rss = statistics.median(r for _, r, _ in results[name])
        cpu = statistics.median(c for _, _, c in results[name])
        speed = ref / wall if wall > 0 else float("inf")
        speed_cpu = ref_cpu / cpu if cpu > 0 else float("inf")
        verdict = ""
        if name != cases[0][0]:
            verdict = ("4x met" if speed_cpu >= 4 else "4x MISSED") + ", " + (
                "memory met" if rss <= limit else "memory MISSED")
        print(f"{name:<24} {wall:>8.3f} {speed:>9.1f}x {cpu:>7.2f} {speed_cpu:>9.1f}x "
              f"{rss / 1e6:>12.1f}  {verdict}")
    if not a.keep:
        for f in os.listdir(tmp):
            os.remove(os.path.join(tmp, f))
        os.rmdir(tmp)


if __name__ == "__main__":
    main()
