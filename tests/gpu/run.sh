#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The gpu suite: the same test programs against the real driver, with and without the shim, and
# PyTorch/NCCL workloads under `cumemguard run`. Exits 77 where there is no GPU.
#   tests/gpu/run.sh BUILD_DIR [OUT_DIR]
# CMG_GPU_PARTS picks parts (default all): conformance cases torch alloc ipc parts transport bench
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
out=${2:-$build/gpu-out}
mkdir -p "$out"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu suite: no GPU here; skipped"
  exit 77
fi
. "$here/libpath.sh"
status=0
parts=${CMG_GPU_PARTS:-conformance cases torch alloc ipc parts transport bench}
want() { case " $parts " in *" $1 "*) return 0 ;; esac; return 1; }
{
  echo "# gpu suite $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} > "$out/environment.txt" 2>&1
cat "$out/environment.txt"

if want conformance && [ -x "$build/tests/programs/conformance" ]; then
  "$build/tests/programs/conformance" > "$out/conformance.real.txt" 2>&1
  if diff -u <(grep -v '^#' "$here/../programs/conformance.expected") "$out/conformance.real.txt" > "$out/conformance.diff"; then
    echo "conformance: the real driver agrees with the fake's table"
  else
    echo "conformance: DIFFERS (see conformance.diff)"; cat "$out/conformance.diff"; status=1
  fi
fi

if want cases; then
: > "$out/cases.txt"
for c in $(python3 -c "import sys; sys.path.insert(0,'$here/../integration'); import run_case; print(' '.join(k for k,v in run_case.CASES.items() if v.get('real')))"); do
  python3 "$here/../integration/run_case.py" --build "$build" --real "$c" >> "$out/cases.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
done
grep -v '^ok ' "$out/cases.txt"; echo "cases: $(grep -c '^ok ' "$out/cases.txt") ok"
fi

if want torch; then
python3 "$here/run_torch.py" "$build" "$out" ${CMG_TORCH_MODES:-} 2>&1 | tee "$out/torch.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

if want alloc; then
python3 "$here/alloc_conf_agreement.py" "$build" "$out" > "$out/alloc-conf.log" 2>&1 || status=1
tail -3 "$out/alloc-conf.log"
fi

# Further parts of the suite (each: BUILD OUT, exit 77 when not applicable). They see which parts
# this run has, so none repeats what another part runs (CMG_GPU_PARTS_RUN).
export CMG_GPU_PARTS_RUN="$parts"
want parts && for part in "$here"/parts/*.sh; do
  [ -x "$part" ] || continue
  name=$(basename "$part" .sh)
  "$part" "$build" "$out" > "$out/$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc"; tail -5 "$out/$name.txt"
  [ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
done
# Legacy IPC on expandable-segment memory through the bridge, and its open latency for 1 GiB.
if want ipc; then
python3 "$here/ipc_bridge_pair.py" "$build" "$out/ipc_bridge" 2>&1 | tee "$out/ipc_bridge_pair.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
if want transport; then
"$here/transport.sh" "$build" "$out/transport" > "$out/transport.txt" 2>&1
rc=$?; echo "transport: exit $rc"; grep -E "^(ok|FAIL|mode|  )" "$out/transport.txt" | tail -20
[ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
fi
if want bench; then
"$here/bench.sh" "$build" "$out/bench" > "$out/bench.txt" 2>&1
rc=$?; echo "bench: exit $rc"; cat "$out/bench/bench.md" 2>/dev/null | head -40
[ $rc -eq 0 ] || [ $rc -eq 77 ] || status=1
fi
exit $status
