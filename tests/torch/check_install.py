#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `python3 -c "import cumemguard"` from an install: meson install into a staging directory
# (DESTDIR), then the staged package imports, finds libcumemguard_policy.so relative to itself and
# rewrites a configuration, importing nothing heavy.
#   check_install.py BUILD
import glob
import os
import shutil
import subprocess
import sys
import tempfile

build = os.path.abspath(sys.argv[1])
meson = shutil.which("meson")
if not meson:
    print("meson not on PATH")
    sys.exit(77)
stage = tempfile.mkdtemp(prefix="cmg-install-")
try:
    p = subprocess.run([meson, "install", "-C", build, "--no-rebuild", "--quiet", "--destdir", stage],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if p.returncode != 0:
        print(f"FAIL meson install: {p.stdout}")
        sys.exit(1)
    inits = glob.glob(os.path.join(stage, "**", "cumemguard", "__init__.py"), recursive=True)
    if len(inits) != 1:
        print(f"FAIL the package installed {len(inits)} times: {inits}")
        sys.exit(1)
    site = os.path.dirname(os.path.dirname(inits[0]))
    code = ("import sys, cumemguard, cumemguard._native as n\n"
            "print(cumemguard.__file__.startswith(sys.argv[1]))\n"
            "print(sorted(m for m in ('torch', 'ctypes', 'json') if m in sys.modules))\n"
            "p = cumemguard.torch_alloc_conf('expandable_segments:False')\n"
            "print(p['result'], p['error'])\n"
            "print(n.policy().origin.startswith(sys.argv[1]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTORCH_", "CUMEMGUARD_"))}
    env.pop("LD_PRELOAD", None)
    if os.environ.get("CMG_PRELOAD_FIRST"):  # and libstdc++: run_python_tests.py says why
        env["LD_PRELOAD"] = os.environ["CMG_PRELOAD_FIRST"] + ":libstdc++.so.6"
    env["PYTHONPATH"] = site
    env["PYTORCH_ALLOC_CONF"] = "max_split_size_mb:64,expandable_segments:True"
    out = subprocess.run([sys.executable, "-c", code, stage], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, timeout=120)
    want = ["True", "[]", "max_split_size_mb:64,expandable_segments:False None", "True"]
    if out.returncode != 0 or out.stdout.split("\n")[:4] != want:
        print(f"FAIL staged package: rc {out.returncode} {out.stdout!r} {out.stderr!r}")
        sys.exit(1)
    print(f"ok import from {site}")
finally:
    shutil.rmtree(stage, ignore_errors=True)
