#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# One source of truth for counts: the exit summary `cumemguard run` prints, the report of the same
# log and `cumemguard config --run` say the same thing. The program's calls per API agree (the
# quarantine's own releases at exit are logged with `released_from` and shown apart, never as the
# program's calls: the report said `cudaFree 3` where the summary said 2); findings by class agree,
# and leaks at exit are counted apart in every one of them (the summary's `leaks: 1`, the JSON's
# leaks.count, the text's `1 leak at exit`, never among the findings: the text report's headline
# said `1 finding (leak 1)` where the JSON said 0 findings); and what config
# --run lists as set by the launcher is what the launcher exports (CUMEMGUARD_LOG and
# CUMEMGUARD_SUMMARY showed as defaults).
#   check_counts.py --cg CUMEMGUARD --build BUILD
import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)
    return cond


def pairs(text):
    """'cudaFree 2 cudaMalloc 1' or 'double-free 1, leak 1 (live at exit)' -> dict."""
    text = re.sub(r"\([^)]*\)", "", text)
    return {k: int(v) for k, v in re.findall(r"([A-Za-z][\w-]*) (\d+)", text)}


def summary(stderr, at="exit"):
    """The summary's calls, findings and leaks, as printed (the calls may wrap onto indented
    lines). `at`: "exit", or "the abort" after strict mode's (the report's words; the summary said
    "live at exit" there)."""
    lines = stderr.splitlines()
    calls, findings, released, leaks = "", "", None, 0
    for i, l in enumerate(lines):
        if l.strip().startswith("calls:"):
            calls = l.split("calls:", 1)[1]
            for more in lines[i + 1:]:
                if not more.startswith("         "):
                    break
                calls += " " + more
        if l.strip().startswith("findings:"):
            findings = l.split("findings:", 1)[1].strip()
        lk = re.fullmatch(r"  leaks: (\d+) \(live at " + at + r"\)", l)
        if lk:
            leaks = int(lk.group(1))
        m = re.search(r"quarantine: .*; (\d+) frees? \((\S+ \S+)\) held at " + at +
                      r", returned to the driver with the process", l)
        if m:
            released = (int(m.group(1)), m.group(2))
    return pairs(calls), ({} if findings == "none" else pairs(findings)), released, leaks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cg", required=True)
    ap.add_argument("--build", required=True)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    a.cg = os.path.abspath(a.cg)
    prog = os.path.join(build, "tests", "integration", "runtime_cases")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUMEMGUARD_")}
    env["LD_LIBRARY_PATH"] = os.path.join(build, "tests", "fakecuda")
    first = os.environ.get("CMG_PRELOAD_FIRST", "")
    env.pop("LD_PRELOAD", None)
    if first:
        env["LD_PRELOAD"] = first
    tmp = tempfile.mkdtemp(prefix="cmg-counts-")

    # P29: a double free (the first free held in the debug profile's quarantine, still held at
    # exit: the exit path makes no CUDA call, so it goes back with the process); leak: an
    # allocation live at exit.
    # leak_double in strict mode: stopped at the double free with an allocation live, which the
    # abort writes as a leak: one finding and one leak everywhere (the text report said
    # `2 findings (double-free 1, leak 1 live at the abort)`, its JSON 1 finding).
    for case, mode, want_calls, want_findings, want_leaks in (
            ("P29", "guard", {"cudaMalloc": 1, "cudaFree": 2}, {"double-free": 1}, 0),
            ("leak", "guard", {"cudaMalloc": 1}, {}, 1),
            ("leak_double", "strict", {"cudaMalloc": 2, "cudaFree": 2}, {"double-free": 1}, 1)):
        log = os.path.join(tmp, case + ".log")
        p = subprocess.run([a.cg, "run", "--mode", mode, "--log", log, "--", prog, case], env=env,
                           cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=120)
        want_rc = -6 if mode == "strict" else 0  # strict mode's abort: the launcher dies of it
        check(p.returncode == want_rc, f"{case}: run exited {p.returncode}: {p.stderr[-400:]}")
        at = "the abort" if mode == "strict" else "exit"
        calls, findings, released, leaks = summary(p.stderr, at)
        check(f"  live at {at}: " in p.stderr, f"{case}: no 'live at {at}' line: {p.stderr[-600:]}")
        check(calls == want_calls and findings == want_findings and leaks == want_leaks,
              f"{case}: the summary says calls {calls}, findings {findings}, leaks {leaks}")
        r = subprocess.run([a.cg, "report", "--json", log], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        doc = json.loads(r.stdout)
        rcalls = {c["api"]: c["count"] for c in doc["calls"]}
        # The call strict mode stops has no call record, only its finding: the report counts it
        # from the finding, as the summary does.
        check(rcalls == calls, f"{case}: the report's calls {rcalls}, the summary's {calls}")
        check(all(c["at_exit"] == c["count"] for c in doc["calls"]),
              f"{case}: calls and calls at exit differ: {doc['calls']}")
        rel = [(s["from"], s["api"], s["count"]) for s in doc["shim_releases"]]
        # Nothing is released by the shim during these runs; what the quarantine holds at exit is
        # said by the summary and its record alike.
        check(rel == [], f"{case}: releases {rel}")
        rec = [json.loads(x) for x in open(log) if '"k":"summary"' in x]
        held = rec[0].get("held_at_exit", {}) if rec else None
        if case in ("P29", "leak_double"):
            check(released == (1, "1.0 MiB") and
                  held == {"quarantine": {"frees": 1, "bytes": 1 << 20}},
                  f"{case}: held at exit: summary {released}, record {held}")
        else:
            check(released is None and not held, f"{case}: held at exit {released} {held}")
        by_class = {c["class"]: c["count"] for c in doc["findings"]["classes"] if c["count"]}
        total = sum(findings.values())
        check(by_class == findings and doc["findings"]["count"] == total and
              doc["leaks"]["count"] == leaks,
              f"{case}: the report's findings {by_class} ({doc['findings']['count']}), leaks "
              f"{doc['leaks']['count']}; the summary's {findings}, leaks {leaks}")
        t = subprocess.run([a.cg, "report", log], stdout=subprocess.PIPE, text=True, timeout=120)
        head = t.stdout.splitlines()[0]
        want_head = "cumemguard report: 1 log, " + (
            f"{total} finding{'s' if total != 1 else ''} (" +
            ", ".join(f"{k} {v}" for k, v in findings.items()) + ")" if total else "no findings")
        if leaks:
            want_head += f", {leaks} leak{'s' if leaks != 1 else ''} " + (
                "live at the abort, ABORTED" if mode == "strict" else "at exit")
        check(head == want_head, f"{case}: headline {head!r}, expected {want_head!r}")
        check("by the shim" not in t.stdout,
              f"{case}: the text report's line for the quarantine's releases:\n{t.stdout}")

    # config --run lists what run exports, as set by it.
    c = subprocess.run([a.cg, "config", "--run", "--json"], env=env, cwd=tmp,
                       stdout=subprocess.PIPE, text=True, timeout=120)
    opts = {o["name"]: o for o in json.loads(c.stdout)["options"]}
    e = subprocess.run([a.cg, "run", "--no-summary", "--", "sh", "-c",
                        "env | grep '^CUMEMGUARD_[A-Z]*=' | grep -v RUN_ID"],
                       env=env, cwd=tmp, stdout=subprocess.PIPE, text=True, timeout=120)
    exported = dict(l.split("=", 1) for l in e.stdout.splitlines())
    exported.pop("CUMEMGUARD_SUMMARY", None)  # --no-summary here: checked below
    for name in ("CUMEMGUARD_PROFILE", "CUMEMGUARD_LOG"):
        o = opts[name]
        got = o["effective"].replace("cumemguard.PROGRAM.", "cumemguard.sh.")
        check(o["source"] == "cumemguard run" and got == exported.get(name),
              f"config --run {name}: {o['effective']!r} ({o['source']}); run exports "
              f"{exported.get(name)!r}")
    s = opts["CUMEMGUARD_SUMMARY"]
    e2 = subprocess.run([a.cg, "run", "--no-log", "--", "sh", "-c", "echo $CUMEMGUARD_SUMMARY"],
                        env=env, cwd=tmp, stdout=subprocess.PIPE, text=True, timeout=120)
    check(s["source"] == "cumemguard run" and s["effective"] == "1" and
          e2.stdout.strip() == "1", f"config --run SUMMARY {s}; run exports {e2.stdout!r}")
    # What the user sets stays theirs, in both.
    c = subprocess.run([a.cg, "config", "--run", "--json"], env=dict(env, CUMEMGUARD_SUMMARY="0"),
                       cwd=tmp, stdout=subprocess.PIPE, text=True, timeout=120)
    s = {o["name"]: o for o in json.loads(c.stdout)["options"]}["CUMEMGUARD_SUMMARY"]
    e3 = subprocess.run([a.cg, "run", "--no-log", "--", "sh", "-c", "echo $CUMEMGUARD_SUMMARY"],
                        env=dict(env, CUMEMGUARD_SUMMARY="0"), cwd=tmp, stdout=subprocess.PIPE,
                        text=True, timeout=120)
    check(s["source"] == "environment" and s["effective"] == "0" and e3.stdout.strip() == "0",
          f"user's SUMMARY=0: config {s}, run exports {e3.stdout!r}")
    t = subprocess.run([a.cg, "config", "--run"], env=env, cwd=tmp, stdout=subprocess.PIPE,
                       text=True, timeout=120).stdout
    for name in ("CUMEMGUARD_LOG", "CUMEMGUARD_SUMMARY", "CUMEMGUARD_PROFILE"):
        check(re.search(rf"^{name}=\S+  \(set by cumemguard run\)$", t, re.M),
              f"config --run text: {name} not shown as set by cumemguard run")

    # config --run takes run's own options (the same table) and shows what they export: each
    # CUMEMGUARD_* variable the program gets has the effective value config lists, and what config
    # says cumemguard run set is among them. config rejected them all (unknown option '--log').
    with open(os.path.join(tmp, "s.supp"), "w") as f:
        f.write("double-free:vendor_*\n")
    own = ("CUMEMGUARD_RUN_ID", "CUMEMGUARD_STATUS_DIR", "CUMEMGUARD_SAID")
    for opts in (["--log", "x.log"], ["--log=sub.%p.log", "--no-summary"], ["--no-log"],
                 ["--brief", "--mode", "report", "--stacks", "4"], ["--suppressions", "s.supp"],
                 ["-e", "CUMEMGUARD_WARN_LIMIT=5", "-e", "CUMEMGUARD_OPTIONS=ipc=deny"],
                 ["--error-exitcode", "3", "--fail-on-leaks"]):
        c = subprocess.run([a.cg, "config", "--run", "--json"] + opts, env=env, cwd=tmp,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        if not check(c.returncode == 0, f"config --run {opts}: rc {c.returncode} {c.stderr!r}"):
            continue
        doc = json.loads(c.stdout)
        listed = {o["name"]: o for o in doc["options"]}
        e4 = subprocess.run([a.cg, "run"] + opts + ["--", "sh", "-c", "export -p"], env=env,
                            cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=120)
        got = {}  # the shell's own listing, quoted as the shell quotes it
        for l in e4.stdout.splitlines():
            words = shlex.split(l) if l.startswith("export CUMEMGUARD_") else []
            name, _, value = words[1].partition("=") if len(words) == 2 else ("", "", "")
            if name and name not in own:
                got[name] = value
        for name, value in got.items():
            if name == "CUMEMGUARD_OPTIONS":
                continue
            shown = listed[name]["effective"].replace("cumemguard.PROGRAM.", "cumemguard.sh.")
            check(shown == value, f"config --run {opts}: {name}={shown!r} "
                                  f"({listed[name]['source']}); run exports {value!r}")
        by_run = sorted(n for n, o in listed.items() if o["source"] == "cumemguard run")
        # The run's id and status directory are made at each launch: listed as run's, not
        # compared by value.
        check(set(by_run) - set(own) <= set(got),
              f"config --run {opts}: set by run {by_run}, run exports {sorted(got)}")
        # An -e value is the user's, given to run: labelled so (it read "environment").
        by_e = sorted(n for n, o in listed.items() if o["source"] == "run -e")
        want_e = sorted(x.split("=")[0] for x in opts if x.startswith("CUMEMGUARD_") and
                        not x.startswith("CUMEMGUARD_OPTIONS="))
        check(by_e == want_e, f"config --run {opts}: set by -e {by_e}, want {want_e}")
        gate = {"error_exitcode": 3, "fail_on_leaks": True} if "--error-exitcode" in opts else \
            {"error_exitcode": None, "fail_on_leaks": False}
        check(doc["run"] == gate, f"config --run {opts}: run {doc['run']}")
    c = subprocess.run([a.cg, "config", "--run", "--json", "--log", "x.log"], env=env, cwd=tmp,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    log = {o["name"]: o for o in json.loads(c.stdout or "{}").get("options", [])}.get(
        "CUMEMGUARD_LOG", {})
    check(c.returncode == 0 and log.get("effective") == os.path.join(os.path.realpath(tmp),
                                                                      "x.log") and
          log.get("source") == "cumemguard run",
          f"config --run --log x.log: rc {c.returncode} {log} {c.stderr!r}")
    # Without --run, run's options are a usage error that says so; what run refuses of them,
    # config --run refuses with run's line.
    for opts, line in ((["--log", "x.log"], "cumemguard config: --log is an option of cumemguard "
                        "run: give --run with it (see cumemguard config --help)"),
                       (["--run", "--log", "a.log", "-e", "CUMEMGUARD_LOG=b.log"],
                        "cumemguard config: --log and -e CUMEMGUARD_LOG=b.log both set "
                        "CUMEMGUARD_LOG; give one of them (refused: cumemguard run would not "
                        "start the program)"),
                       (["--run", "-e", "CUMEMGUARD_RUN_ID=x"],
                        "cumemguard config: -e CUMEMGUARD_RUN_ID=x: CUMEMGUARD_RUN_ID is set by "
                        "the launcher and the shim themselves; -e cannot give it to the program; "
                        "refused: cumemguard run would not start the program"),
                       (["--run", "--error-exitcode", "256"],
                        "cumemguard config: --error-exitcode must be 0 to 255, not '256'")):
        c = subprocess.run([a.cg, "config"] + opts, env=env, cwd=tmp, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=120)
        check(c.returncode == 64 and c.stdout == "" and c.stderr.splitlines() == [line],
              f"config {opts}: rc {c.returncode} {c.stderr!r} {c.stdout[:200]!r}")

    if FAILURES:
        print(f"{len(FAILURES)} failed (files kept in {tmp})")
        sys.exit(1)
    if os.environ.get("CMG_KEEP_TMP") == "1":
        print(f"files kept in {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    print("ok")


if __name__ == "__main__":
    main()
