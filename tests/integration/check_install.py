#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `meson install` into a DESTDIR: the files a packager and a user expect (the tool, the shim, the
# header, pkg-config, a man page per command, bash completion), and the installed `cumemguard`
# preloading the installed library, never the build tree's, unless CUMEMGUARD_SHIM_PATH says so;
# the Python package where README says, importable with the PYTHONPATH it gives.
#   check_install.py --meson MESON --build DIR --prefix P --libdir L --runtime-cases PROG
import argparse
import json
import os
import re
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


def main():
    ap = argparse.ArgumentParser()
    for a in ("--meson", "--build", "--prefix", "--libdir", "--runtime-cases"):
        ap.add_argument(a, required=True)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    dest = tempfile.mkdtemp(prefix="cmg-install-")
    try:
        p = subprocess.run([a.meson, "install", "-C", build, "--no-rebuild", "--quiet",
                            "--destdir", dest], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
        if not check(p.returncode == 0, f"meson install: {p.returncode} {p.stdout[-2000:]}"):
            sys.exit(1)
        root = dest + a.prefix
        libdir = a.libdir if os.path.isabs(a.libdir) else os.path.join(a.prefix, a.libdir)
        lib = dest + libdir
        cg = os.path.join(root, "bin", "cumemguard")
        shim = os.path.join(lib, "libcumemguard.so")
        want = [cg, shim, os.path.join(root, "include", "cumemguard.h"),
                os.path.join(lib, "pkgconfig", "cumemguard.pc"),
                os.path.join(root, "share", "bash-completion", "completions", "cumemguard")]
        pages = ["cumemguard", "cumemguard-run", "cumemguard-report", "cumemguard-config"]
        want += [os.path.join(root, "share", "man", "man1", n + ".1") for n in pages]
        # The documents --help names, where it names them.
        docdir = os.path.join(a.prefix, "share", "doc", "cumemguard")
        want += [dest + os.path.join(docdir, n) for n in ("report-schema.md", "config-json.md",
                                                          "log-format.md")]
        for f in want:
            check(os.path.isfile(f), f"installed file missing: {f}")

        # The installed commands' --help names the installed documentation directory, never a
        # path of the build or source tree, and every document it names is in the install.
        src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for sub in ([], ["run"], ["report"], ["config"]):
            h = subprocess.run([cg] + sub + ["--help"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            label = " ".join(["cumemguard"] + sub)
            text = " ".join(h.stdout.split())  # the help wraps its lines
            check(h.returncode == 0 and build not in text and src not in text and
                  "docs/" not in text, f"installed {label} --help: {h.returncode} {text[:300]!r}")
            for doc in re.findall(r"([\w-]+\.md) in the documentation directory, (\S+?)\)", text):
                check(doc[1] == docdir and os.path.isfile(dest + os.path.join(docdir, doc[0])),
                      f"installed {label} --help names {doc[0]} in {doc[1]}: not installed there "
                      f"(docdir {docdir})")
        # Every docs/NAME.md an installed document or --help cites is in the documentation
        # directory, as NAME.md (the installed directory is the docs/ tree).
        cited = {}
        texts = {label: subprocess.run([cg] + label.split()[1:] + ["--help"],
                                       stdout=subprocess.PIPE, text=True).stdout
                 for label in ("cumemguard", "cumemguard run", "cumemguard report",
                               "cumemguard config")}
        for base, _, names in os.walk(dest + docdir):
            for n in names:
                if n.endswith(".md"):
                    with open(os.path.join(base, n), errors="replace") as fh:
                        texts[os.path.join(base, n)] = fh.read()
        for where, text in texts.items():
            for doc in re.findall(r"docs/([\w/.-]+?\.md)", text):
                cited.setdefault(doc, where)
        check(len(cited) > 10, f"installed documents cite {sorted(cited)}")
        for doc, where in sorted(cited.items()):
            check(os.path.isfile(dest + os.path.join(docdir, doc)),
                  f"{where} cites docs/{doc}: not in the installed {docdir}")
        helps = [subprocess.run([cg, c, "--help"], stdout=subprocess.PIPE, text=True).stdout
                 for c in ("report", "config")]
        check(all(docdir in " ".join(t.split()) for t in helps),
              f"installed report/config --help do not name {docdir}")

        # pkg-config names the installed shim and header.
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(lib, "pkgconfig"))
        env.pop("PKG_CONFIG_LIBDIR", None)
        q = lambda *args: subprocess.run(["pkg-config"] + list(args) + ["cumemguard"], env=env,
                                         stdout=subprocess.PIPE, text=True).stdout.strip()
        check(q("--variable=shim") == os.path.join(libdir, "libcumemguard.so"),
              f"pkg-config shim: {q('--variable=shim')!r}")
        check(q("--cflags") == "-I" + os.path.join(a.prefix, "include"),
              f"pkg-config cflags: {q('--cflags')!r}")
        check(q("--libs") == "", f"pkg-config libs (the shim is not linked): {q('--libs')!r}")
        check(q("--modversion") != "", "pkg-config --modversion")

        # Man pages: one per command, made from the table --help prints (check_cli.py compares
        # them option by option), with the exit status, and the environment where it applies.
        for n in pages:
            text = open(os.path.join(root, "share", "man", "man1", n + ".1")).read()
            check(f".TH {n.upper().replace('-', chr(92) + '-')} 1 " in text,
                  f"{n}.1 title: {text[:200]!r}")
            check('.SH "EXIT STATUS"' in text, f"{n}.1 lacks the exit status section")
            if n in ("cumemguard", "cumemguard-run"):
                check("CUMEMGUARD_SHIM_PATH" in text, f"{n}.1 lacks the environment")
        run_page = open(os.path.join(root, "share", "man", "man1", "cumemguard-run.1")).read()
        check("\\-\\-error\\-exitcode" in run_page and "cumemguard\\-run \\-" in run_page,
              "cumemguard-run.1 does not list run's options")

        # The installed launcher preloads the installed shim.
        base = {k: v for k, v in os.environ.items()
                if not k.startswith("CUMEMGUARD_") and k != "LD_PRELOAD"}
        first = os.environ.get("CMG_PRELOAD_FIRST", "")
        if first:
            base["LD_PRELOAD"] = first
        show = [cg, "run", "--no-summary", "--no-log", "--", "sh", "-c", 'echo "$LD_PRELOAD"']
        out = subprocess.run(show, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        parts = out.stdout.strip().split(":")
        check(out.returncode == 0 and os.path.realpath(shim) in parts and
              not any(p.startswith(build) for p in parts),
              f"installed launcher preloads {out.stdout!r} {out.stderr!r}")
        # It runs a CUDA program with it (fake stack), and its version is the build's.
        fake = os.path.join(build, "tests", "fakecuda")
        with tempfile.TemporaryDirectory() as d:
            r = subprocess.run([cg, "run", "--no-summary", "--log", os.path.join(d, "l.log"), "--",
                                os.path.abspath(a.runtime_cases), "P29"],
                               env=dict(base, LD_LIBRARY_PATH=fake), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
            check(r.returncode == 0 and "warning: double-free" in r.stderr,
                  f"installed run of P29: {r.returncode} {r.stderr[-300:]!r}")
        v = subprocess.run([cg, "--version"], stdout=subprocess.PIPE, text=True).stdout
        bv = subprocess.run([os.path.join(build, "tools", "cumemguard"), "--version"],
                            stdout=subprocess.PIPE, text=True).stdout
        check(v == bv and v.startswith("cumemguard "), f"versions {v!r} {bv!r}")
        # Told: CUMEMGUARD_SHIM_PATH wins. Without an installed shim there is no fallback to the
        # build tree: the run stops with 66 and says where it looked.
        told = subprocess.run(show, env=dict(base, CUMEMGUARD_SHIM_PATH=os.path.join(
            build, "shim", "libcumemguard.so")), stdout=subprocess.PIPE, text=True).stdout
        check(os.path.join(build, "shim", "libcumemguard.so") in told.split(":")[-1] or
              os.path.join(build, "shim", "libcumemguard.so") in told,
              f"CUMEMGUARD_SHIM_PATH not used: {told!r}")
        os.unlink(shim)
        gone = subprocess.run(show, env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        check(gone.returncode == 66 and "cannot find libcumemguard.so" in gone.stderr and
              build not in gone.stderr, f"without the installed shim: {gone.returncode} "
              f"{gone.stdout!r} {gone.stderr!r}")

        # The Python package where README "Installing" says: <prefix>/lib/python3.X/site-packages
        # (Debian's python3: <prefix>/lib/python3/dist-packages), importable from there with
        # PYTHONPATH from another working directory, as README gives it.
        inits = [os.path.join(b, "__init__.py") for b, _, n in os.walk(dest)
                 if os.path.basename(b) == "cumemguard" and "__init__.py" in n]
        pkg_re = re.escape(root) + r"/lib/python3(\.\d+)?/(site|dist)-packages/cumemguard/__init__\.py"
        if check(len(inits) == 1 and re.fullmatch(pkg_re, inits[0]),
                 f"the Python package is not under {a.prefix}/lib/python3*/(site|dist)-packages: "
                 f"{inits}"):
            where = os.path.dirname(os.path.dirname(inits[0]))
            imp = subprocess.run([sys.executable, "-c", "import cumemguard; print(cumemguard.__file__)"],
                                 env=dict(base, PYTHONPATH=where), cwd=dest,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            check(imp.returncode == 0 and imp.stdout.strip() == inits[0],
                  f"PYTHONPATH={where} import cumemguard: {imp.returncode} {imp.stdout!r} "
                  f"{imp.stderr[-300:]!r}")

        # bash completion: subcommands, run's options and values, option names from config.
        comp = os.path.join(root, "share", "bash-completion", "completions", "cumemguard")

        def complete(*words):
            script = (f"source {comp}; COMP_WORDS=({' '.join(repr(w) for w in (cg,) + words)}); "
                      f"COMP_CWORD={len(words)}; _cumemguard; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
            return subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE,
                                  text=True).stdout.split()
        check(complete("r") == ["run", "report"], f"complete 'r': {complete('r')}")
        check(complete("run", "--mo") == ["--mode"], f"complete 'run --mo': {complete('run', '--mo')}")
        check(complete("run", "--mode", "") == ["guard", "report", "strict"],
              f"complete --mode: {complete('run', '--mode', '')}")
        check(complete("run", "-e", "CUMEMGUARD_PROF") == ["CUMEMGUARD_PROFILE="],
              f"complete -e: {complete('run', '-e', 'CUMEMGUARD_PROF')}")
        check("--gen-suppressions" in complete("report", "--") or "--json" in complete("report", "--"),
              f"complete report: {complete('report', '--')}")
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
