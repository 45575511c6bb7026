# SPDX-License-Identifier: Apache-2.0
# Sourced by the gpu scripts: puts the toolkit's and the Python wheels' runtime libraries
# (libcudart.so.13, libnccl.so.2) on LD_LIBRARY_PATH; the driver comes from the system.
libs=$(python3 - <<'PY'
import glob, os
dirs = []
for pat in ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]:
    if glob.glob(pat + "/libcudart.so.13*"): dirs.append(pat)
try:
    import nvidia, os.path
    for base in nvidia.__path__:
        for lib in glob.glob(os.path.join(base, "*", "lib")) + glob.glob(os.path.join(base, "*", "*", "lib")):
            if glob.glob(lib + "/libcudart.so.13*") or glob.glob(lib + "/libnccl.so.2*"):
                dirs.append(lib)
except Exception:
    pass
print(":".join(dict.fromkeys(dirs)))
PY
)
# A bundle's own libraries (tools/gpu-bundle): BUILD is the sourcing script's $build or its $1.
for d in "${build:-}" "${1:-}"; do
  if [ -n "$d" ] && [ -d "$d/lib" ]; then libs="$(cd "$d/lib" && pwd)${libs:+:$libs}"; break; fi
done
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
