#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Golden report tests: runs cumemguard-report on a fixture log and compares stdout, stderr and the
# exit status with expected/. `run_golden.py --update EXE CASE...` rewrites the expected files.
import argparse
import difflib
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# case -> (arguments after --no-symbolize, expected exit status). Log paths are relative to this
# directory, which is the working directory, so reports name them the same way on every machine.
CASES = {
    'clean': (['logs/clean.log'], 0),
    'clean-json': (['--json', 'logs/clean.log'], 0),
    'double-free': (['logs/double-free.log'], 1),
    'double-free-json': (['--json', 'logs/double-free.log'], 1),
    'sleep-mode': (['logs/sleep-mode.log'], 1),
    'sleep-mode-json': (['--json', 'logs/sleep-mode.log'], 1),
    'ranks': (['logs/rank0.log', 'logs/rank1.log'], 1),
    'ranks-json': (['--json', 'logs/rank0.log', 'logs/rank1.log'], 1),
    'truncated': (['logs/truncated.log'], 1),
    'truncated-json': (['--json', 'logs/truncated.log'], 1),
    # Killed without a finding (SIGKILL, out of memory, a time limit): no end record, and its
    # process is not running here. Not a clean run: 1 (it was 0).
    'killed': (['logs/killed.log'], 1),
    'killed-json': (['--json', 'logs/killed.log'], 1),
    'killed-fail-on-leaks': (['--fail-on-leaks', 'logs/killed.log'], 1),
    'format2': (['logs/format2.log'], 66),
    'unknown': (['logs/unknown.log'], 0),
    'unknown-json': (['--json', 'logs/unknown.log'], 0),
    'leaks': (['logs/leaks.log'], 0),
    'leaks-fail': (['--fail-on-leaks', '--top', '3', 'logs/leaks.log'], 1),
    'leaks-json': (['--json', 'logs/leaks.log'], 0),
    'not-a-log': (['logs/not-a-log.txt'], 66),
    'not-a-log-json': (['--json', 'logs/not-a-log.txt'], 66),
    'missing': (['logs/missing.log', 'logs/clean.log'], 66),
    'errors-json': (['--json', 'logs/not-a-log.txt', 'logs/format2.log', 'logs/clean.log'], 66),
    'usage': (['--top', 'many', 'logs/clean.log'], 64),
    'crash': (['logs/crash.log'], 1),
    'crash-json': (['--json', 'logs/crash.log'], 1),
    'aborted': (['logs/aborted.log'], 1),
    # Strict mode stopped a double free with an allocation live: the first line and the Findings
    # heading count the same (the leak live at the abort included, and said so), and the calls
    # listed end with the stopped one, not with a call another thread made as the process died.
    'aborted-leak': (['logs/aborted-leak.log'], 1),
    'aborted-leak-json': (['--json', 'logs/aborted-leak.log'], 1),
    'suppressed': (['logs/suppressed.log'], 0),
    'suppressed-json': (['--json', 'logs/suppressed.log'], 0),
    # The rules were printed: 0, whatever the findings they are for (it was 1).
    'gen-suppressions': (['--gen-suppressions', 'logs/double-free.log', 'logs/sleep-mode.log'], 0),
    'hostile': (['logs/hostile.log'], 1),
    'hostile-json': (['--json', 'logs/hostile.log'], 1),
    'duplicate': (['logs/clean.log', 'logs/clean.log', './logs/clean.log'], 0),
    'python': (['logs/python.log'], 1),
    'python-json': (['--json', 'logs/python.log'], 1),
    # Every frame: the interpreter's below <module> too (`python` folds them into one line).
    'python-full-stacks': (['--full-stacks', 'logs/python.log'], 1),
    # --gen-suppressions: 0 when the rules were printed.
    'python-gen-suppressions': (['--gen-suppressions', 'logs/python.log'], 0),
    # The page and the trace are the outputs asked for: stdout gets the report's first line only
    # (it got the whole text report).
    'html-trace': (['--html', '/dev/null', '--trace', '/dev/null', 'logs/double-free.log'], 1),
    # A page that cannot be written: said before anything is printed, status 73, stdout empty
    # (the headline had been printed first).
    'html-unwritable': (['--html', '/nonexistent/r.html', 'logs/double-free.log'], 73),
    'nccl': (['logs/nccl.log'], 1),
    'nccl-json': (['--json', 'logs/nccl.log'], 1),
    # What is still resident: a sleep boundary's snapshot in two parts (what did not go to sleep
    # called out, by creator and site) and one asked for, with its caller's stack.
    'resident': (['logs/resident.log'], 0),
    'resident-json': (['--json', 'logs/resident.log'], 0),
    # --diff by site: the last snapshot of a log against one named by label (new, grew, gone).
    'diff': (['--diff', 'logs/resident.log@sleep', 'logs/resident-b.log'], 0),
    'diff-json': (['--json', '--diff', 'logs/resident.log@sleep', 'logs/resident-b.log'], 0),
    # Two snapshots of one log by number: nothing changed.
    'diff-one-log': (['--diff', 'logs/resident.log@1', 'logs/resident.log@2'], 0),
    # A snapshot the log does not have: said on stderr with the ones it has, 66.
    'diff-missing': (['--diff', 'logs/resident.log@9', 'logs/resident-b.log'], 66),
    'diff-usage': (['--diff', 'logs/resident.log'], 64),
    'diff-with-logs': (['--diff', 'logs/resident.log', 'logs/resident-b.log', 'logs/clean.log'], 64),
    # One snapshot on both sides, by number or as each log's last: nothing to compare, refused as
    # the other diffs that cannot say anything are (it printed "0 sites" and exited 0).
    'diff-same': (['--diff', 'logs/resident.log@1', 'logs/resident.log@1'], 64),
    'diff-same-last': (['--diff', 'logs/resident.log', './logs/resident.log'], 64),
    # Every CUDA call failed with 35 (no driver): the first line says nothing was checked, and
    # What happened says why and where the fake stack is (it read "no findings" as a clean run).
    'no-driver': (['logs/no-driver.log'], 0),
    'no-driver-json': (['--json', 'logs/no-driver.log'], 0),
    # Finding records that do not parse while the summary counts them: the first line says so
    # and how many records were unreadable, status 1 (it said "no findings" beside status 1).
    'corrupt-finding': (['logs/corrupt-finding.log'], 1),
    # A cut call record and nothing else: not clean either, 1 (it was "no findings" and 0).
    'corrupt-call': (['logs/corrupt-call.log'], 1),
    'corrupt-call-json': (['--json', 'logs/corrupt-call.log'], 1),
}


def expected_paths(case):
    return (os.path.join(HERE, 'expected', case + '.out'),
            os.path.join(HERE, 'expected', case + '.err'))


def read(path):
    try:
        with open(path, encoding='utf-8') as f:
            return f.read()
    except FileNotFoundError:
        return ''


def run(exe, case):
    args, _ = CASES[case]
    p = subprocess.run([exe, '--no-symbolize'] + args, cwd=HERE, capture_output=True,
                       text=True, timeout=60)
    return p.stdout, p.stderr, p.returncode


def diff(name, want, got):
    return ''.join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                        'expected/' + name, 'actual/' + name))


def check(exe, case):
    out, err, rc = run(exe, case)
    out_path, err_path = expected_paths(case)
    problems = []
    want_rc = CASES[case][1]
    if rc != want_rc:
        problems.append(f'exit status {rc}, expected {want_rc}')
    for name, want, got in ((case + '.out', read(out_path), out), (case + '.err', read(err_path), err)):
        if want != got:
            problems.append(diff(name, want, got))
    if problems:
        print(f'{case}: FAIL')
        for p in problems:
            print(p)
        return False
    print(f'{case}: ok')
    return True


def update(exe, case):
    out, err, rc = run(exe, case)
    out_path, err_path = expected_paths(case)
    with open(out_path, 'w', encoding='utf-8') as f:
        f.write(out)
    if err:
        with open(err_path, 'w', encoding='utf-8') as f:
            f.write(err)
    elif os.path.exists(err_path):
        os.remove(err_path)
    print(f'{case}: written (exit status {rc}, expected {CASES[case][1]})')


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument('--update', action='store_true', help='rewrite the expected files')
    ap.add_argument('exe', help='the cumemguard-report executable')
    ap.add_argument('cases', nargs='*', help='cases to run (default: all)')
    a = ap.parse_args()
    cases = a.cases or sorted(CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print('unknown case(s): ' + ', '.join(unknown), file=sys.stderr)
        return 2
    if a.update:
        for c in cases:
            update(os.path.abspath(a.exe), c)
        return 0
    ok = all([check(os.path.abspath(a.exe), c) for c in cases])
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
