#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Static checks of the built shim and of the documentation that mirrors its tables:
#  * exports: exactly the rows of the symbol lists (plus dlsym, exit, _exit and _Exit), unversioned,
#    nothing of libstdc++, spdlog or fmt (a named version node would silently lose interposition: interposers.md 9.1);
#  * dependencies: libc only, no CUDA library (case P26: it must load where no cudart exists);
#  * it loads into a process that never touches CUDA and stays silent (P26);
#  * the README lists every CUMEMGUARD_* option and every finding class.
#   check_shim.py SOURCE_DIR SHIM CUMEMGUARD
import os
import re
import subprocess
import sys


def fail(msg):
    print("FAIL " + msg)
    sys.exit(1)


def def_names(path, macro):
    names = []
    with open(path) as f:
        for line in f:
            m = re.match(r"\s*%s\(\s*([A-Za-z_][A-Za-z0-9_]*)" % macro, line)
            if m:
                names.append(m.group(1))
    return names


def main():
    src, shim, cg = sys.argv[1], sys.argv[2], sys.argv[3]
    want = {"dlsym", "exit", "_exit", "_Exit"}
    for f, macro in [("api_driver.def", "CMG_DRV"), ("api_runtime.def", "CMG_RT"),
                     ("api_nccl.def", "CMG_NCCL"), ("api_public.def", "CMG_PUBLIC"),
                     ("api_env.def", "CMG_ENV")]:
        p = os.path.join(src, "shim", f)
        if os.path.exists(p):
            want.update(def_names(p, macro))
    out = subprocess.run(["nm", "-D", "--defined-only", shim], stdout=subprocess.PIPE,
                         text=True, check=True).stdout
    got = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] in "TtWwiBDdRr":
            got.add(parts[2])
    versioned = [g for g in got if "@" in g]
    if versioned:
        fail(f"versioned exports: {versioned[:5]}")
    missing, extra = sorted(want - got), sorted(got - want)
    if missing:
        fail(f"not exported: {missing}")
    if extra:
        fail(f"exported but not in a symbol list: {extra[:10]} ({len(extra)} in all)")
    dyn = subprocess.run(["readelf", "-d", shim], stdout=subprocess.PIPE, text=True,
                         check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    # A sanitized shim (tools/dev sanitize) links its runtime, and libstdc++ dynamically
    # (shim/meson.build says why); the normal shim links nothing beyond libc.
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    allowed = r"(libc\.so|ld-linux|libm\.so)"
    if first:
        allowed = r"(libc\.so|ld-linux|libm\.so|lib[at]san\.|libubsan\.|libstdc\+\+\.|libgcc_s\.)"
    bad = [n for n in needed if not re.match(allowed, n)]
    if bad:
        fail(f"link-time dependencies beyond libc: {bad}")
    # P26: a process that never touches CUDA loads the shim and stays silent.
    env = dict(os.environ, LD_PRELOAD=":".join(filter(None, [first, os.path.abspath(shim)])))
    for k in list(env):
        if k.startswith("CUMEMGUARD_"):
            del env[k]
    env["CUMEMGUARD_SUMMARY"] = "1"
    p = subprocess.run([sys.executable, "-c", "import ctypes, sys; sys.exit(0)"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0 or p.stdout or p.stderr:
        fail(f"python3 under the shim: rc {p.returncode}, output {p.stdout!r} {p.stderr!r}")
    # The README mirrors the option and finding tables.
    readme = open(os.path.join(src, "README.md")).read()
    cfg = subprocess.run([cg, "config", "--json"], stdout=subprocess.PIPE, text=True)
    import json
    options = [o["name"] for o in json.loads(cfg.stdout)["options"]]
    for name in options:
        if name.startswith("CUMEMGUARD_ACTION_"):
            if "CUMEMGUARD_ACTION_<CLASS>" not in readme:
                fail("README lacks the CUMEMGUARD_ACTION_<CLASS> row")
            continue
        if f"`{name}`" not in readme:
            fail(f"README lacks option {name}")
    findings_def = "".join(l for l in open(os.path.join(src, "policy", "findings.def"))
                           if not l.lstrip().startswith("//"))
    for cls in re.findall(r'CMG_FINDING\(\s*\w+,\s*"([a-z-]+)"', findings_def):
        if f"`{cls}`" not in readme:
            fail(f"README lacks finding class {cls}")
    print(f"ok: {len(got)} exports, NEEDED {needed}, {len(options)} options documented")


if __name__ == "__main__":
    main()
