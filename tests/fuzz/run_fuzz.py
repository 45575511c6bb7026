#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs one libFuzzer target for a fixed time on a scratch copy of its corpus (the seeds in the
# repository are never written), then replays the saved regressions. A crash leaves its input in
# the artifacts directory and prints how to turn it into a regression test.
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fuzzer")
    ap.add_argument("--name", required=True)
    ap.add_argument("--seconds", type=int, default=20)
    ap.add_argument("--corpus", action="append", default=[], help="seed directory (read only)")
    ap.add_argument("--regressions", required=True)
    ap.add_argument("--artifacts", required=True)
    ap.add_argument("--dict")
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--keep-corpus", help="copy the grown corpus here afterwards")
    a = ap.parse_args()
    seconds = int(os.environ.get("CMG_FUZZ_SECONDS", a.seconds))
    os.makedirs(a.artifacts, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"cmg-fuzz-{a.name}-")
    try:
        cmd = [a.fuzzer, f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
               f"-max_len={a.max_len}", "-print_final_stats=1", "-print_pcs=0",
               f"-artifact_prefix={os.path.join(a.artifacts, a.name)}-", work]
        if a.dict:
            cmd.insert(1, f"-dict={a.dict}")
        cmd += [d for d in a.corpus if os.path.isdir(d)]
        print("+", " ".join(cmd), flush=True)
        # Fake stacks for use-after-return cost more than they find in these parsers: executions
        # per second count more when a target runs for seconds.
        env = dict(os.environ)
        env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":detect_stack_use_after_return=0"
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", env=env)
        out = p.stdout
        stats = dict(re.findall(r"^stat::(\w+):\s+(\d+)", out, re.M))
        cov = re.findall(r"cov: (\d+) ft: (\d+) corp: (\d+)", out)
        print(f"{a.name}: {seconds} s, {stats.get('number_of_executed_units', '?')} runs, "
              f"{stats.get('peak_rss_mb', '?')} MB peak, coverage {cov[-1][0] if cov else '?'} "
              f"edges, corpus {cov[-1][2] if cov else '?'} inputs")
        if p.returncode != 0:
            print(out[-6000:])
            arts = re.findall(r"Test unit written to (\S+)", out)
            print(f"FAIL {a.name}: the fuzzer stopped with status {p.returncode}")
            for art in arts:
                print(f"  input: {art}\n  to keep it as a regression test:\n"
                      f"    cp {art} {a.regressions}/\n  and fix the code until "
                      f"'meson test fuzz-replay-{a.name}' passes")
            return 1
        if a.keep_corpus:
            os.makedirs(a.keep_corpus, exist_ok=True)
            for f in os.listdir(work):
                shutil.copy(os.path.join(work, f), a.keep_corpus)
        # The saved crashes must all pass now.
        regs = [os.path.join(a.regressions, f) for f in sorted(os.listdir(a.regressions))
                if not f.startswith(".")]
        if regs:
            r = subprocess.run([a.fuzzer, "-runs=0"] + regs, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace")
            if r.returncode != 0:
                print(r.stdout[-4000:])
                print(f"FAIL {a.name}: a saved regression input fails again")
                return 1
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
