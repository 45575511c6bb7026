#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Validates Chrome trace-event JSON (the object form Perfetto and chrome://tracing open): every
# event's required fields and types. With --report EXE it first writes the trace of LOG... with
# `EXE --trace`, and checks it says what the JSON report says (processes, findings, final bytes).
# Standard library only.
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

PHASES = set('BEXiICbnestfPNODMVvRc()')
METADATA = {'process_name', 'thread_name', 'process_sort_index', 'thread_sort_index',
            'process_labels'}


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return (isinstance(v, (int, float)) and not isinstance(v, bool)
            and math.isfinite(v))


def validate(doc):
    errors = []
    if not isinstance(doc, dict) or not isinstance(doc.get('traceEvents'), list):
        return ['the top level must be an object with a "traceEvents" array']
    if doc.get('displayTimeUnit', 'ms') not in ('ms', 'ns'):
        errors.append('displayTimeUnit must be "ms" or "ns"')
    for i, e in enumerate(doc['traceEvents']):
        where = f'event {i} ({e.get("name") if isinstance(e, dict) else e!r})'
        if not isinstance(e, dict):
            errors.append(f'{where}: not an object')
            continue
        ph = e.get('ph')
        if not isinstance(e.get('name'), str) or not e['name']:
            errors.append(f'{where}: "name" must be a non-empty string')
        if ph not in PHASES:
            errors.append(f'{where}: "ph" {ph!r} is not a trace-event phase')
        if not is_num(e.get('ts')) or e['ts'] < 0:
            errors.append(f'{where}: "ts" must be a non-negative number (microseconds)')
        for k in ('pid', 'tid'):
            if not is_int(e.get(k)):
                errors.append(f'{where}: "{k}" must be an integer')
        if 'args' in e and not isinstance(e['args'], dict):
            errors.append(f'{where}: "args" must be an object')
        if 'cat' in e and not isinstance(e['cat'], str):
            errors.append(f'{where}: "cat" must be a string')
        if ph == 'X' and (not is_num(e.get('dur')) or e['dur'] < 0):
            errors.append(f'{where}: a complete event needs a non-negative "dur"')
        if ph in ('i', 'I') and e.get('s', 't') not in ('g', 'p', 't'):
            errors.append(f'{where}: instant scope "s" must be g, p or t')
        if ph == 'C':
            args = e.get('args')
            if not isinstance(args, dict) or not args or not all(is_num(v) for v in args.values()):
                errors.append(f'{where}: a counter needs "args" with numeric values only')
        if ph == 'M':
            args = e.get('args') if isinstance(e.get('args'), dict) else {}
            if e.get('name') not in METADATA:
                errors.append(f'{where}: unknown metadata event')
            elif e['name'].endswith('_name') and not isinstance(args.get('name'), str):
                errors.append(f'{where}: needs a string args.name')
            elif e['name'].endswith('_sort_index') and not is_int(args.get('sort_index')):
                errors.append(f'{where}: needs an integer args.sort_index')
    return errors


def check_against_report(trace, report, expect_processes):
    errors = []
    events = trace['traceEvents']
    names = [e for e in events if e['ph'] == 'M' and e['name'] == 'process_name']
    pids = {e['pid'] for e in names}
    nlogs = len(report['logs'])
    if len(names) != nlogs or len(pids) != nlogs:
        errors.append(f'{len(names)} process_name events over {len(pids)} pids for {nlogs} logs')
    if expect_processes is not None and nlogs != expect_processes:
        errors.append(f'{nlogs} logs reported, expected {expect_processes}')
    for log in report['logs']:
        want = (f'(rank {log["rank"]}, ' if log['rank'] >= 0 else '(') + f'pid {log["pid"]})'
        if not any(e['args']['name'].endswith(want) for e in names):
            errors.append(f'no process track is named "... {want}"')

    findings = [e for e in events if e['ph'] == 'i' and e.get('cat') == 'finding']
    if len(findings) != report['findings']['count']:
        errors.append(f'{len(findings)} finding instants, the report has '
                      f'{report["findings"]["count"]} findings')
    nccl = [e for e in events if e['ph'] == 'i' and e.get('cat') == 'nccl']
    if len(nccl) != len(report['nccl']['events']):
        errors.append(f'{len(nccl)} NCCL instants for {len(report["nccl"]["events"])} NCCL events')

    # The last sample of each counter must be the report's current bytes for that device and kind.
    pid_of = {}
    for e in events:
        if e['ph'] == 'M' and e['name'] == 'process_sort_index':
            pid_of[e['args']['sort_index']] = e['pid']
    if len(pid_of) != nlogs:
        errors.append(f'{len(pid_of)} process_sort_index events for {nlogs} logs')
    last = {}
    for e in events:
        if e['ph'] == 'C':
            key = (e['pid'], e['name'])
            if key not in last or e['ts'] >= last[key][0]:
                last[key] = (e['ts'], e['args']['bytes'])
    for row in report['memory']:
        if row['current'] is None:
            continue
        dev = row['dev']
        name = f'bytes {row["mem"]} ' + (f'dev{dev}' if dev >= 0 else '(no device)')
        got = last.get((pid_of.get(row['log']), name))
        if got is None or got[1] != row['current']:
            errors.append(f'counter "{name}" of log {row["log"]} ends at '
                          f'{got[1] if got else None}, the report says {row["current"]}')
    return errors


def self_test():
    """The validator must reject what Perfetto would misread; each case breaks one rule."""
    good = {'name': 'bytes', 'ph': 'C', 'ts': 1.5, 'pid': 1, 'tid': 1, 'args': {'bytes': 1}}
    bad = [
        dict(good, ph='Z'), dict(good, ts='1'), dict(good, pid=1.0), dict(good, tid=True),
        dict(good, args={'bytes': '1'}), dict(good, args={}), {k: v for k, v in good.items() if k != 'name'},
        {'name': 'x', 'ph': 'X', 'ts': 0, 'pid': 1, 'tid': 1},
        {'name': 'x', 'ph': 'i', 'ts': 0, 'pid': 1, 'tid': 1, 's': 'q'},
        {'name': 'process_name', 'ph': 'M', 'ts': 0, 'pid': 1, 'tid': 0, 'args': {}},
        {'name': 'process_sort_index', 'ph': 'M', 'ts': 0, 'pid': 1, 'tid': 0, 'args': {'sort_index': 'a'}},
    ]
    problems = validate({'traceEvents': [good], 'displayTimeUnit': 'ns'})
    for i, e in enumerate(bad):
        if not validate({'traceEvents': [e]}):
            problems.append(f'bad event {i} passed: {e}')
    return problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--report', help='cumemguard-report executable: make the trace from LOG...')
    ap.add_argument('--expect-processes', type=int)
    ap.add_argument('files', nargs='+', help='trace files, or logs with --report')
    a = ap.parse_args()

    errors = self_test()
    if errors:
        pass
    elif not a.report:
        for path in a.files:
            with open(path, encoding='utf-8') as f:
                errors += [f'{path}: {e}' for e in validate(json.load(f))]
    else:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, 'trace.json')
            p = subprocess.run([a.report, '--no-symbolize', '--json', '--trace', out, *a.files],
                               capture_output=True, text=True, timeout=120)
            if p.returncode not in (0, 1):
                sys.exit(f'FAIL: the report exited {p.returncode}\n{p.stderr}')
            report = json.loads(p.stdout)
            with open(out, encoding='utf-8') as f:
                trace = json.load(f)
            errors = validate(trace)
            if not errors:
                errors = check_against_report(trace, report, a.expect_processes)
            kinds = {e['ph'] for e in trace['traceEvents']}
            print(f'{len(trace["traceEvents"])} events, phases {"".join(sorted(kinds))}')
    for e in errors:
        print('FAIL: ' + e)
    if not errors:
        print('ok: every event has the required fields and types')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
