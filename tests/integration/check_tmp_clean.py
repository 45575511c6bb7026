#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The suite leaves nothing in TMPDIR: each command (the test scripts that used to leave their
# directories: cases without a log, a capture case's trace, the torch cases, counts, the
# launcher, the VMM race) runs with TMPDIR set to a fresh directory, must pass, and must leave
# that directory empty. CMG_KEEP_TMP=1 is the one way to keep a test's files.
#   check_tmp_clean.py COMMAND... [--- COMMAND...]...
import os
import shutil
import subprocess
import sys
import tempfile


def main():
    commands, cur = [], []
    for arg in sys.argv[1:]:
        if arg == "---":
            commands.append(cur)
            cur = []
        else:
            cur.append(arg)
    commands.append(cur)
    env = {k: v for k, v in os.environ.items() if k != "CMG_KEEP_TMP"}
    failures = 0
    for cmd in filter(None, commands):
        fresh = tempfile.mkdtemp(prefix="cmg-tmpdir-")
        try:
            p = subprocess.run(cmd, env=dict(env, TMPDIR=fresh), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               timeout=600)
            left = sorted(os.listdir(fresh))
            name = os.path.basename(cmd[1]) + " " + cmd[-1]
            if p.returncode != 0:
                failures += 1
                print(f"FAIL {name}: exit {p.returncode}\n{p.stdout[-2000:]}")
            elif left:
                failures += 1
                print(f"FAIL {name}: left {left} in TMPDIR")
            else:
                print(f"ok {name}")
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
    print(f"{failures} failed" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
