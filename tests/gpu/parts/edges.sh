#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The crash context, cuda_error records and the log's one-second promise on the real driver
# (docs/log-format.md):   edges.sh BUILD OUT
#  * crash-segv: the `crash` record names SIGSEGV, the faulting thread and address, and every
#    address of its stack lies in a `module` record, the first in the program (libcuda loaded);
#  * errors: cudaFree of an address never allocated gives one `cuda_error` record, 1
#    cudaErrorInvalidValue, not sticky, before its call record with the call's seq;
#  * idle-calls: 2,001 calls, SIGKILL 2 s later: all 2,001 call records are in the log.
set -u
build=$1
out=$2
prog="$build/tests/reliability/life_cases"
shim="$build/shim/libcumemguard.so"
[ -x "$prog" ] && [ -f "$shim" ] || { echo "life_cases or the shim not built"; exit 77; }
work=$(mktemp -d)
status=0
run() {  # CASE: run under the shim with a log in $work/CASE
  mkdir -p "$work/$1"
  LD_PRELOAD="$shim" CUMEMGUARD_LOG="$work/$1/log.%p" "$prog" "$1" > "$work/$1/out" 2>&1
}
run crash-segv
run errors
mkdir -p "$work/idle-calls"
LD_PRELOAD="$shim" CUMEMGUARD_LOG="$work/idle-calls/log.%p" "$prog" idle-calls > "$work/idle-calls/out" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q '^idle' "$work/idle-calls/out" && break; sleep 0.1; done
sleep 2
kill -KILL "$pid"
wait "$pid" 2>/dev/null
python3 - "$work" > "$out/edges-checks.txt" <<'EOF' || status=1
import glob, json, os, sys
work = sys.argv[1]
def recs(case):
    (p,) = glob.glob(os.path.join(work, case, "log.*"))
    lines = open(p, "rb").read().split(b"\n")
    return [json.loads(l) for l in lines if l.strip().startswith(b"{") and l.strip().endswith(b"}")]
def steps(case):
    return dict(l.split() for l in open(os.path.join(work, case, "out")) if len(l.split()) == 2)
bad = []
r, s = recs("crash-segv"), steps("crash-segv")
crash = [x for x in r if x.get("k") == "crash"]
if len(crash) != 1 or crash[0]["signal"] != 11 or crash[0].get("tid") != int(s["fault_tid"]) \
        or crash[0].get("addr") != hex(int(s["fault_addr"])):
    bad.append(f"crash record {crash} for {s}")
else:
    st = [x for x in r if x.get("k") == "stack" and x["id"] == crash[0].get("stack")]
    mods = [x for x in r if x.get("k") == "module"]
    where = []
    for pc in (st[0]["pcs"] if st else []):
        v = int(pc, 16)
        m = [x["path"] for x in mods if int(x["base"], 16) <= v < int(x["base"], 16) + x["size"]]
        where.append(m[-1] if m else None)
    print("crash stack modules:", [os.path.basename(w) if w else None for w in where])
    if not where or not all(where) or not where[0].endswith("/life_cases"):
        bad.append(f"crash stack {where}")
r = recs("errors")
errs = [(x["api"], x["res"], x.get("name"), x["sticky"]) for x in r if x.get("k") == "cuda_error"]
print("cuda_error records:", errs)
if errs != [("cudaFree", 1, "cudaErrorInvalidValue", False)]:
    bad.append(f"cuda_error records {errs}")
calls = [x for x in recs("idle-calls") if x.get("k") == "call"]
print("idle-calls: call records", len(calls), "of", steps("idle-calls").get("calls"))
if str(len(calls)) != steps("idle-calls").get("calls"):
    bad.append("idle-calls lost records")
print("edges:", "ok" if not bad else "FAILED: " + "; ".join(bad))
sys.exit(1 if bad else 0)
EOF
cat "$out/edges-checks.txt"
rm -rf "$work"
exit $status
