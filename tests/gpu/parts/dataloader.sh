#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# DataLoader workers on the real driver (dataloader_workers.py): forked workers end with os._exit,
# through the shim's _exit; the shim's threads are past their set-up at each fork. The program's
# output must be the same without and with the shim, under `cumemguard run` with a log per process;
# the parent's log is complete (one `end`, no `_exit`), a worker's log, where one exists (a worker
# that reached the shim), ends with an `_exit` end.
#   dataloader.sh BUILD OUT
set -u
build=$1
out=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cg="$build/tools/cumemguard"
nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU"; exit 77; }
python3 -c "import torch" 2>/dev/null || { echo "no torch"; exit 77; }
status=0
mkdir -p "$out/dataloader"
d="$out/dataloader"
timeout 300 python3 "$here/dataloader_workers.py" > "$d/plain.txt" 2> "$d/plain.err" \
  || { echo "FAIL dataloader without the shim"; status=1; }
timeout 300 "$cg" run --log "$d/dl.%p.log" -- python3 "$here/dataloader_workers.py" \
  > "$d/shim.txt" 2> "$d/shim.err" || { echo "FAIL dataloader under cumemguard run"; status=1; }
diff <(grep -v '^pid' "$d/plain.txt") <(grep -v '^pid' "$d/shim.txt") > "$d/diff.txt" \
  || { echo "FAIL dataloader output differs"; cat "$d/diff.txt"; status=1; }
parent=$(sed -n 's/^pid //p' "$d/shim.txt")
python3 - "$d" "$parent" <<'PY' || status=1
import glob, json, sys
d, parent = sys.argv[1], int(sys.argv[2] or 0)
bad = 0
logs = sorted(glob.glob(f"{d}/dl.*.log"))
for p in logs:
    recs = [json.loads(l) for l in open(p)]
    ends = [r for r in recs if r.get("k") == "end"]
    pid = recs[0]["pid"]
    ok = len(ends) == 1 and recs[-1] is ends[0] and any(r.get("k") == "summary" for r in recs)
    quick = bool(ends and ends[0].get("_exit"))
    want_quick = pid != parent
    print(f"{p.split('/')[-1]}: pid {pid}{' (parent)' if pid == parent else ''}, "
          f"{len(recs)} records, end {'_exit' if quick else 'exit'}: {'ok' if ok and quick == want_quick else 'FAIL'}")
    bad += not (ok and quick == want_quick)
if not any(json.loads(open(p).readline())["pid"] == parent for p in logs):
    print("FAIL no log of the parent"); bad += 1
sys.exit(1 if bad else 0)
PY
cat "$d/shim.txt"; grep -c . "$d/shim.err" | sed 's/^/stderr lines: /'
exit $status
