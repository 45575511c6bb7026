#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Runs test_python_api.py with the package as built (build/python) and the stand-in torch, on the
# fake CUDA stack, without (plain) or with (shim) libcumemguard.so preloaded.
#   run_python_tests.py BUILD plain|shim
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
build, mode = os.path.abspath(sys.argv[1]), sys.argv[2]
env = {k: v for k, v in os.environ.items()
       if not k.startswith(("CUMEMGUARD_", "FAKECUDA_", "PYTORCH_", "STANDIN_TORCH_"))}
env["PYTHONPATH"] = os.pathsep.join([os.path.join(build, "python"), os.path.join(here, "standin")])
env["LD_LIBRARY_PATH"] = os.path.join(build, "tests", "fakecuda")
env["CMG_TEST_BUILD"] = build
env["CMG_TEST_SHIM"] = "1" if mode == "shim" else "0"
env["PYTHONDONTWRITEBYTECODE"] = "1"
preload = [os.environ.get("CMG_PRELOAD_FIRST", "")]
if preload[0]:
    # A sanitized build links libstdc++ dynamically (shim/meson.build). AddressSanitizer resolves
    # its __cxa_throw interceptor when it starts; libstdc++ arriving later with
    # libcumemguard_policy.so (dlopen) would leave it unresolved, and the first throw fails its
    # CHECK. The preloaded shim brings libstdc++ at start; without it, preload libstdc++ itself.
    preload.append("libstdc++.so.6")
if mode == "shim":
    preload.append(os.path.join(build, "shim", "libcumemguard.so"))
env["LD_PRELOAD"] = ":".join(p for p in preload if p)
if not env["LD_PRELOAD"]:
    del env["LD_PRELOAD"]
timeout = 300 * float(os.environ.get("CMG_TIMEOUT_MULTIPLIER", "1"))
p = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_python_api"], cwd=here, env=env,
                   timeout=timeout)
sys.exit(p.returncode)
