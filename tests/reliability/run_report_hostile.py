#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Hostile logs handed to `cumemguard report` (suite reliability): a `module` record naming a FIFO
# or a device, control characters meant for the terminal, values nested 100,000 deep, and an output
# slot filled with a log by a glob. Each case failed before the reader was made to resist it (the
# report hung, printed escape sequences raw, died of a stack overflow, or overwrote the log).
import argparse
import json
import os
import subprocess
import sys
import tempfile

HEADER = {"cumemguard_log": 1, "tool": "0.1.0", "pid": 4242, "ppid": 1, "rank": -1,
          "host": "h", "start_unix_ns": 1764400000000000000, "argv": ["./prog"], "mode": "guard",
          "options": {}}


class Failure(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Failure(msg)


def write_log(path, records, header=None):
    with open(path, "w") as f:
        f.write(json.dumps(header or HEADER) + "\n")
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")


def report(exe, args, timeout=60):
    try:
        p = subprocess.run([exe, "report"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"cumemguard report {' '.join(args)}: no exit within {timeout} s (hung)")
    return p.returncode, p.stdout, p.stderr


def case_fifo_module(exe, tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    log = os.path.join(tmp, "fifo.log")
    write_log(log, [
        {"k": "module", "path": fifo, "base": "0x1000", "size": 4096},
        {"k": "module", "path": "/dev/zero", "base": "0x10000", "size": 4096},
        {"k": "stack", "id": 1, "pcs": ["0x1010", "0x10010"]},
        {"k": "finding", "seq": 1, "ts": 1, "tid": 4242, "class": "double-free",
         "api": "cudaFree", "action": "skip", "stack": 1},
        {"k": "end", "ts": 2}])
    rc, out, err = report(exe, [log], timeout=30)
    expect(rc == 1, f"exit status {rc}, expected 1 (one finding): {err[-500:]}")
    text = out.decode()
    expect(f"{fifo}: not a regular file" in text, "no warning for the FIFO module:\n" + text)
    expect("/dev/zero: not a regular file" in text, "no warning for the device module")
    expect("#0 fifo+0x10" in text, "the FIFO module's frame is not module+offset:\n" + text)


def case_escapes(exe, tmp):
    evil = "\x1b]0;owned\x07\x1b[2J\x9b31m"
    log = os.path.join(tmp, "esc.log")
    hdr = dict(HEADER, argv=["./prog" + evil, "a\nfake line"], host="h" + evil,
               options={"CUMEMGUARD_STACKS": "8" + evil})
    write_log(log, [
        {"k": "note", "ts": 1, "level": "warn", "msg": "note" + evil},
        {"k": "call", "seq": 1, "ts": 2, "tid": 4242, "api": "cudaMalloc" + evil, "res": 0,
         "args": {"ptr": "0x10" + evil}, "dev": 0, "mem": "linear", "delta": 16},
        {"k": "finding", "seq": 2, "ts": 3, "tid": 4242, "class": "double-free" + evil,
         "api": "cudaFree", "action": "skip" + evil, "msg": "msg" + evil,
         "args": {"ptr": "0x10" + evil}, "state": {"s": evil}},
        {"k": "end", "ts": 4}], header=hdr)
    for args in ([log], ["--html", os.path.join(tmp, "esc.html"), log]):
        rc, out, err = report(exe, args)
        expect(rc == 1, f"exit status {rc}, expected 1")
        for stream, name in ((out, "stdout"), (err, "stderr")):
            bad = [b for b in stream if b < 0x20 and b not in (0x0a,) or b == 0x7f]
            expect(not bad, f"{name} carries control bytes {sorted(set(bad))[:8]}")
            expect(b"\xc2\x9b" not in stream, f"{name} carries a C1 control (U+009B)")
        expect(b"fake line" not in out.replace(b"\\x0afake line", b""),
               "a newline from the log started a line of its own")
        expect(b"\\x1b]0;owned" in out, "the escape sequence is not shown escaped")
    with open(os.path.join(tmp, "esc.html"), "rb") as f:
        html = f.read()
    expect(b"\x1b" not in html and b"<script>alert" not in html, "raw control bytes in the page")


def case_deep_nesting(exe, tmp):
    deep = "[" * 100000 + "]" * 100000
    log = os.path.join(tmp, "deep.log")
    with open(log, "w") as f:
        h = json.dumps(HEADER)[:-len('"options": {}}')] + '"options": {"X": ' + deep + "}}"
        f.write(h + "\n")
        f.write('{"k":"finding","seq":1,"ts":1,"tid":1,"class":"double-free","api":"cudaFree",'
                '"args":{"a":' + deep + '},"state":' + deep + ',"related":[{"what":' + deep +
                "}]}\n")
        f.write('{"k":"call","seq":2,"ts":2,"tid":1,"api":"cudaMalloc","res":0,"args":{"s":' +
                deep + "}}\n")
        f.write('{"k":"end","ts":3}\n')
    size = os.path.getsize(log)
    for args in ([log], ["--json", log], ["--trace", os.path.join(tmp, "deep.trace.json"), log]):
        rc, out, err = report(exe, args)
        expect(rc == 1, f"{args[0]}: exit status {rc}, expected 1 (one finding): {err[-300:]!r}")
        expect(len(out) < size, f"{args[0]}: {len(out)} bytes of output from {size} of log")
        if args[0] == "--json":
            doc = json.loads(out)
            state = doc["findings"]["classes"][0]["groups"][0]["example"]["state"]
            flat = json.dumps(state)
            expect("nested deeper than 32 levels: cut" in flat, "no marker where the value was cut")
        elif args[0] == "--trace":
            with open(args[1]) as t:
                json.load(t)
        else:
            expect(b"nested deeper than" in out, "the text output has no truncation marker")


def case_no_overwrite(exe, tmp):
    a, b = os.path.join(tmp, "cumemguard.a.1.log"), os.path.join(tmp, "cumemguard.b.2.log")
    write_log(a, [{"k": "end", "ts": 1}])
    write_log(b, [{"k": "end", "ts": 1}], header=dict(HEADER, pid=4343))
    with open(a, "rb") as f:
        before = f.read()
    # `cumemguard report --trace cumemguard.*.log`: the glob fills the output slot.
    for opt in ("--trace", "--html", "-o"):
        rc, out, err = report(exe, [opt, a, b])
        expect(rc == 64, f"{opt}: exit status {rc}, expected 64 (usage)")
        lines = err.decode().strip().splitlines()
        expect(len(lines) == 1 and "cumemguard event log" in lines[0],
               f"{opt}: not one line saying why: {err!r}")
        with open(a, "rb") as f:
            expect(f.read() == before, f"{opt}: the log was overwritten")
    # An output that is not a log is written as asked.
    out_path = os.path.join(tmp, "trace.json")
    with open(out_path, "w") as f:
        f.write("old trace\n")
    rc, _, err = report(exe, ["--trace", out_path, a])
    expect(rc == 0, f"--trace over a non-log: exit status {rc}: {err!r}")
    with open(out_path) as f:
        json.load(f)


CASES = {
    "fifo-module": case_fifo_module,
    "escapes": case_escapes,
    "deep-nesting": case_deep_nesting,
    "no-overwrite": case_no_overwrite,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("case", choices=sorted(CASES))
    a = ap.parse_args()
    exe = os.path.join(os.path.abspath(a.build), "tools", "cumemguard")
    with tempfile.TemporaryDirectory(prefix=f"cmg-report-{a.case}-") as tmp:
        try:
            CASES[a.case](exe, tmp)
        except Failure as e:
            print(f"report-{a.case}: FAIL: {e}")
            return 1
    print(f"report-{a.case}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
