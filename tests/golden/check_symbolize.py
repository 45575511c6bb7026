#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# Symbolizes a real stack with libdw: symhelper writes a log of its own stack and module map, and
# the report must name its (demangled) functions with file:line, an inlined function as a frame of
# its own, stop the text stack at main (the JSON keeps the frames below it), fall back to
# module+offset when the module is missing or changed, and (with --expect-static) not need
# libdw/libelf at run time.
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


def report(exe, *args):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    if p.returncode != 1:  # the log holds one double-free finding
        sys.exit(f'FAIL: {exe} {" ".join(args)} exited {p.returncode}, expected 1\n{p.stderr}')
    return p.stdout


def rewrite_log(src, dst, path, change):
    with open(src, encoding='utf-8') as f, open(dst, 'w', encoding='utf-8') as out:
        for line in f:
            rec = json.loads(line)
            if rec.get('k') == 'module' and rec.get('path') == path:
                change(rec)
            out.write(json.dumps(rec) + '\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('report')
    ap.add_argument('helper')
    ap.add_argument('--expect-static', action='store_true')
    a = ap.parse_args()
    failures = []

    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, 'sym.log')
        p = subprocess.run([a.helper, log], capture_output=True, text=True, check=True)
        expected = [line.split('\t') for line in p.stdout.splitlines()]
        if len(expected) != 3:
            sys.exit(f'FAIL: the helper printed {p.stdout!r}')
        helper_path = os.path.realpath(a.helper)

        text = report(a.report, log)
        for i, (func, file, line, inlined) in enumerate(expected):
            pat = (f'#{i} ' + re.escape(func) + r' \(/.*/' + re.escape(file) + ':' + line + r'\)'
                   + (r' \[inlined\]' if inlined else '') + '\n')
            if not re.search(pat, text):
                failures.append(f'text report lacks "#{i} {func} (/.../{file}:{line})"'
                                + (' [inlined]' if inlined else ''))

        doc = json.loads(report(a.report, '--json', log))
        frames = doc['findings']['classes'][0]['groups'][0]['stack']['frames']
        # The text stops at main (valgrind's --show-below-main=no); the JSON keeps every frame.
        names = [f.get('function') for f in frames]
        if 'main' in names and names.index('main') + 1 < len(names):
            below = len(names) - names.index('main') - 1
            stack = text.split('      stack\n', 1)[1].split('\n\n', 1)[0]
            if not re.search(r'#\d+ main \(', stack) or \
                    re.search(r'#\d+ main \(.*\n\s+#\d+ ', stack):
                failures.append(f'the text stack goes on past main ({below} frames below it in '
                                'the JSON):\n' + stack)
        else:
            failures.append(f'the JSON stack has no frame below main: {names}')
        for i, (func, file, line, inlined) in enumerate(expected):
            fr = frames[i] if i < len(frames) else {}
            if (fr.get('function') != func or not fr.get('file', '').endswith('/' + file)
                    or str(fr.get('line')) != line or fr.get('module') != helper_path
                    or fr.get('inlined', False) != bool(inlined)):
                failures.append(f'JSON frame {i} is {fr}, expected {func} at {file}:{line}'
                                + (' inlined' if inlined else ''))
        if frames[0].get('pc') != frames[1].get('pc'):
            failures.append('the inlined frame and its caller must share one pc')

        raw = report(a.report, '--no-symbolize', log)
        if 'cmgtest::' in raw:
            failures.append('--no-symbolize still printed function names')
        if not re.search(re.escape(os.path.basename(helper_path)) + r'\+0x[0-9a-f]+', raw):
            failures.append('--no-symbolize printed no module+offset frame')

        moved = os.path.join(tmp, 'moved.log')
        rewrite_log(log, moved, helper_path, lambda r: r.update(path='/nonexistent/symhelper'))
        out = report(a.report, moved)
        if 'cmgtest::' in out or not re.search(r'#0 symhelper\+0x[0-9a-f]+\n', out) \
                or '/nonexistent/symhelper: not found here' not in out:
            failures.append('a missing module did not fall back to module+offset with a warning:\n'
                            + out)

        changed = os.path.join(tmp, 'changed.log')
        rewrite_log(log, changed, helper_path, lambda r: r.update(build_id='00' * 20))
        out = report(a.report, changed)
        if 'cmgtest::' in out or 'differs from the run' not in out:
            failures.append('a module with another build-id was symbolized anyway:\n' + out)

    if a.expect_static:
        readelf = shutil.which('readelf')
        if readelf:
            dyn = subprocess.run([readelf, '-d', a.report], capture_output=True, text=True).stdout
            needed = re.findall(r'\(NEEDED\).*\[(.*)\]', dyn)
            bad = [n for n in needed if re.match(r'lib(dw|elf|lzma|bz2|z)\.so', n)]
            if bad:
                failures.append(f'the report needs shared {bad}; libdw/libelf must be static')
        else:
            print('readelf not found: the static-link check is skipped')

    for f in failures:
        print('FAIL: ' + f)
    if not failures:
        print('ok: frames symbolized with file:line, fallbacks and static linking checked')
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main())
