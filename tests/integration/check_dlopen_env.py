#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# A shim dlopen'ed by a program (tests/programs/dlopen_env.c) writes the environment only when it
# is the process's only thread: with a second thread reading the environment, the PyTorch variable
# CUMEMGUARD_TORCH_ALLOC_CONF would set and CUMEMGUARD_SAID stay unset, and the line saying so is
# printed; alone, both are written as at a preload. Also: a dlopen without static TLS room fails
# with the loader's own message (docs/limitations.md).
#   check_dlopen_env.py PROGRAM SHIM
import os
import subprocess
import sys

TUNABLE = "glibc.rtld.optional_static_tls=16384"
NOT_APPLIED = ("CUMEMGUARD_TORCH_ALLOC_CONF='expandable_segments:True' not applied: the shim was "
               "loaded while the program's threads were running (dlopen)")


def run(prog, shim, mode, tunable=True):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUMEMGUARD_", "PYTORCH_", "LD_PRELOAD", "GLIBC_TUNABLES"))}
    env["CUMEMGUARD_TORCH_ALLOC_CONF"] = "expandable_segments:True"
    env["CUMEMGUARD_STAKS"] = "3"  # a warning, so that the digest has something to say
    if tunable:
        env["GLIBC_TUNABLES"] = TUNABLE
    p = subprocess.run([prog, shim, mode], env=env, capture_output=True, text=True, timeout=60)
    vals = dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)
    return p, vals


def main():
    prog, shim = sys.argv[1], os.path.abspath(sys.argv[2])
    fails = []

    def expect(cond, msg):
        if not cond:
            fails.append(msg)

    p, v = run(prog, shim, "single")
    expect(p.returncode == 0, f"single: exit {p.returncode}: {p.stderr.strip()}")
    expect(v.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True",
           f"single: PYTORCH_CUDA_ALLOC_CONF={v.get('PYTORCH_CUDA_ALLOC_CONF')}")
    expect(len(v.get("CUMEMGUARD_SAID", "")) == 16, f"single: CUMEMGUARD_SAID={v.get('CUMEMGUARD_SAID')}")
    expect(NOT_APPLIED not in p.stderr, "single: said not applied")

    p, v = run(prog, shim, "threads")
    expect(p.returncode == 0, f"threads: exit {p.returncode}: {p.stderr.strip()}")
    expect(v.get("PYTORCH_CUDA_ALLOC_CONF") == "(unset)",
           f"threads: PYTORCH_CUDA_ALLOC_CONF={v.get('PYTORCH_CUDA_ALLOC_CONF')} (written while "
           "another thread reads the environment)")
    expect(v.get("CUMEMGUARD_SAID") == "(unset)", f"threads: CUMEMGUARD_SAID={v.get('CUMEMGUARD_SAID')}")
    expect(NOT_APPLIED in p.stderr, f"threads: no 'not applied' line: {p.stderr.strip()}")
    expect("unknown option CUMEMGUARD_STAKS" in p.stderr, "threads: the option warning was not said")

    p, v = run(prog, shim, "single", tunable=False)
    expect(p.returncode == 70 and "cannot allocate memory in static TLS block" in p.stderr,
           f"without the tunable: exit {p.returncode}: {p.stderr.strip()} (the limitation changed: "
           "update docs/limitations.md)")

    for f in fails:
        print("FAIL:", f)
    print(f"dlopen-env: 3 runs, {len(fails)} failed checks")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
