#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The commands' --help, man pages and bash completion against each other and against the parsers:
# every option a command's parser compares an argument with is in its --help, its man page's
# OPTIONS and its completion; every option the help lists is accepted by the parser (not "unknown
# option"); the pages have NAME, SYNOPSIS, OPTIONS, EXIT STATUS and SEE ALSO, no self-reference,
# status 73 where the commands use it, and pass `groff -ww`, `man --warnings` and lexgrog without a
# word; the build tree's --help names the documents in the source tree's docs/, where they are;
# every usage line says "Usage:".
#   check_cli.py --cg CUMEMGUARD --build BUILD --source SOURCE_ROOT
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

FAILURES = []

# The parser of each command: the source file and the function the comparisons are in.
# run's parser reads its options from tools/run_options.def (as its table here does); the others
# compare arguments with literals in these functions, and config's reads run's table too (RUN_TOO:
# config --run takes run's options).
PARSERS = {"run": ("tools/run_options.def", None),
           "report": ("tools/report.cpp", "int report_main("),
           "config": ("tools/config_cmd.cpp", "bool parse_args(")}
RUN_TOO = {"config"}


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL " + msg)
    return cond


def run(argv, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=60, **kw)


def help_options(text):
    """Option names of the Options: section of a --help text."""
    out, inside = set(), False
    for line in text.splitlines():
        if line == "Options:":
            inside = True
            continue
        if inside and not line.strip():
            break
        if inside and line.startswith("  -"):
            label = line.strip().split("  ")[0]
            for part in label.split(","):
                out.add(part.strip().split(" ")[0])
    return out


def parser_options(source, cmd):
    """The option literals the command's parser compares an argument with: `== "--x"`,
    `"--x="` prefixes and `starts_with("--x")`; for run, the names of its options table (config
    reads them too)."""
    path, start = PARSERS[cmd]
    text = open(os.path.join(source, path)).read()
    if start is None:  # CMG_RUN_OPTION(id, "name", "alias", ...)
        return {n for pair in re.findall(r'^CMG_RUN_OPTION\(\w+,\s*"([^"]*)",\s*"([^"]*)"', text,
                                          re.M) for n in pair if n}
    if cmd in RUN_TOO:
        return parser_options(source, "run") | parser_options_in(text, start)
    return parser_options_in(text, start)


def parser_options_in(text, start):
    body = text[text.index(start):]
    # The function ends at the first line that is a lone closing brace.
    body = body[:body.index("\n}\n")]
    names = set(re.findall(r'==\s*"(--?[a-zA-Z][a-zA-Z0-9-]*)"', body))
    names |= set(re.findall(r'rfind\("(--[a-zA-Z][a-zA-Z0-9-]*)=",\s*0\)', body))
    names |= set(re.findall(r'starts_with\("(--[a-zA-Z][a-zA-Z0-9-]*)"', body))
    return names - {"--"}


def man_sections(page):
    return re.findall(r'^\.SH "?([A-Z ]+?)"?$', page, re.M)


def man_options(page):
    """Option names of the OPTIONS section: the bold names of each .TP entry."""
    sec = page.split(".SH OPTIONS\n", 1)[1].split("\n.SH ", 1)[0]
    out = set()
    for entry in sec.split(".TP\n")[1:]:
        head = entry.split("\n", 1)[0]
        out |= {n.replace("\\-", "-") for n in re.findall(r"\\fB(.*?)\\fR", head)}
    return out


def completion_options(comp, cmd):
    """The words the completion offers for `cumemguard CMD -`."""
    script = (f"source {comp}; COMP_WORDS=(cumemguard {cmd} -); COMP_CWORD=2; _cumemguard; "
              "printf '%s\\n' \"${COMPREPLY[@]}\"")
    return set(run(["bash", "-c", script]).stdout.split()) - {"--"}


def completion_values(comp, words, cwd):
    """The words the completion offers for the last of `words` (after `cumemguard`), in cwd."""
    quoted = " ".join("'" + w + "'" for w in ["cumemguard"] + words)
    script = (f"source {comp}; COMP_WORDS=({quoted}); COMP_CWORD={len(words)}; _cumemguard; "
              "printf '%s\\n' \"${COMPREPLY[@]}\"")
    return set(run(["bash", "-c", script], cwd=cwd).stdout.split())


def completion_values_check(comp, source):
    """An output slot never offers an event log (`report --trace <TAB>` offered *.log: the
    mistake of `report --trace LOG`); --torch-version offers the releases the judge knows."""
    d = tempfile.mkdtemp(prefix="cmg-cli-")
    try:
        for f in ("cumemguard.a.1.log", "trace.json", "page.html", "notes.txt"):
            open(os.path.join(d, f), "w").close()
        os.mkdir(os.path.join(d, "out"))
        for words, want in ((["report", "--trace", ""], {"trace.json", "out"}),
                            (["report", "--html", ""], {"page.html", "out"}),
                            (["report", "-o", ""], {"trace.json", "page.html", "notes.txt", "out"}),
                            (["report", "--output", ""],
                             {"trace.json", "page.html", "notes.txt", "out"}),
                            (["report", ""], {"cumemguard.a.1.log", "out"})):
            got = completion_values(comp, words, d)
            check(got == want, f"completion of cumemguard {' '.join(words)}<TAB>: {sorted(got)}, "
                               f"expected {sorted(want)}")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    rows = open(os.path.join(source, "policy", "torch_releases.def")).read()
    releases = set(re.findall(r'^TORCH_RELEASE\("([^"]+)"', rows, re.M))
    got = completion_values(comp, ["config", "--torch-version", ""], source)
    check(releases and got == releases,
          f"completion of config --torch-version: {sorted(got)}, expected {sorted(releases)}")
    got = completion_values(comp, ["config", "--torch-version", "2.1"], source)
    check(got == {r for r in releases if r.startswith("2.1")},
          f"completion of config --torch-version 2.1: {sorted(got)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cg", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    a = ap.parse_args()
    a.cg = os.path.abspath(a.cg)
    tools = os.path.join(os.path.abspath(a.build), "tools")
    comp = os.path.join(tools, "completion", "cumemguard")
    groff = shutil.which("groff")
    lexgrog = shutil.which("lexgrog")
    check(groff and lexgrog, "groff and lexgrog are needed to check the man pages (tools/dev "
                             "test installs groff-base and man-db)")

    # An unknown command: 64, one line, with the command meant when one is that close.
    for typo, says in (("reprot", "unknown command 'reprot' (did you mean report?) (see "
                                  "cumemguard --help)"),
                       ("xyzzy", "unknown command 'xyzzy' (see cumemguard --help)")):
        p = subprocess.run([a.cg, typo], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.returncode == 64 and p.stderr == "cumemguard: " + says + "\n" and not p.stdout,
              f"cumemguard {typo}: rc {p.returncode} {p.stderr!r}")

    # `version` takes --version too (refused with 64 before), and its --help has its statuses.
    p = subprocess.run([a.cg, "version", "--version"], capture_output=True, text=True)
    check(p.returncode == 0 and re.fullmatch(r"cumemguard \S+\n", p.stdout) and not p.stderr,
          f"cumemguard version --version: {p.returncode} {p.stdout!r} {p.stderr!r}")
    p = subprocess.run([a.cg, "version", "--help"], capture_output=True, text=True)
    check(p.returncode == 0 and "Exit status:" in p.stdout, f"version --help: {p.stdout!r}")

    for cmd in ("", "run", "report", "config"):
        label = cmd or "cumemguard"
        argv = [a.cg] + ([cmd] if cmd else []) + ["--help"]
        h = run(argv)
        check(h.returncode == 0 and not h.stderr, f"{label} --help: {h.returncode} {h.stderr!r}")
        check(h.stdout.startswith("Usage: cumemguard" + (" " + cmd if cmd else "") + " "),
              f"{label} --help does not start with 'Usage: cumemguard {cmd}': "
              f"{h.stdout[:80]!r}")
        check("usage:" not in h.stdout, f"{label} --help has a lower-case usage: line")
        check(max(len(l) for l in h.stdout.splitlines()) <= 79,
              f"{label} --help has a line over 79 columns")
        helped = help_options(h.stdout)
        check({"-h", "--help", "--version"} <= helped, f"{label} --help options {helped}")
        # The build tree's commands name the documents where they are before an install: the
        # source tree's docs/, never the installed directory (nothing is there yet; the installed
        # commands are checked by check_install.py), and every document named is there.
        text = " ".join(h.stdout.split())  # the help wraps its lines
        named = re.findall(r"([\w-]+\.md) in the documentation directory, (\S+?)\)", text)
        check(cmd not in ("report", "config") or named,
              f"{label} --help names no document: {text[:300]!r}")
        # The top-level help names the directory itself (the README says it does; it did not).
        if not cmd:
            m = re.search(r"The documents \([^)]*\): (\S+?)\.(?:\s|$)", text)
            check(m and m.group(1) == os.path.join(os.path.abspath(a.source), "docs"),
                  f"cumemguard --help names no documents directory: {text[-400:]!r}")
        for doc, where in named:
            check(where == os.path.join(os.path.abspath(a.source), "docs") and
                  os.path.isfile(os.path.join(where, doc)),
                  f"{label} --help names {doc} in {where}, not in the source tree's docs/")

        page_name = "cumemguard" + ("-" + cmd if cmd else "")
        page = open(os.path.join(tools, page_name + ".1")).read()
        secs = man_sections(page)
        for s in ("NAME", "SYNOPSIS", "OPTIONS", "EXIT STATUS", "SEE ALSO"):
            check(s in secs, f"{page_name}(1) has no {s} section: {secs}")
        check(len(secs) == len(set(secs)), f"{page_name}(1) has a section twice: {secs}")
        see_also = page.split('.SH "SEE ALSO"\n', 1)[1]
        check(f".BR {page_name.replace('-', chr(92) + '-')} (1)" not in see_also,
              f"{page_name}(1) names itself in SEE ALSO")
        check(man_options(page) == helped,
              f"{page_name}(1) OPTIONS {sorted(man_options(page) ^ helped)} differ from --help")
        if groff:
            g = run([groff, "-ww", "-z", "-b", "-man", "-Tutf8"], input=page)
            check(g.returncode == 0 and not g.stderr.strip(),
                  f"groff -ww on {page_name}(1): {g.stderr.strip()[:400]}")
        if shutil.which("man"):
            mw = run(["man", "--warnings", "-l", os.path.join(tools, page_name + ".1")],
                     env=dict(os.environ, MANPAGER="cat", MANWIDTH="80"))
            check(mw.returncode == 0 and not mw.stderr.strip() and "EXIT STATUS" in mw.stdout,
                  f"man --warnings {page_name}(1): {mw.returncode} {mw.stderr.strip()[:400]}")
        if lexgrog:
            path = os.path.join(tools, page_name + ".1")
            lx = run([lexgrog, path])
            check(lx.returncode == 0 and f'"{page_name} - ' in lx.stdout,
                  f"lexgrog {page_name}(1): {lx.returncode} {lx.stdout.strip()!r}")

        if cmd:
            parsed = parser_options(a.source, cmd)
            check(parsed, f"{cmd}: no option found in its parser (has it moved? update PARSERS)")
            check(parsed <= helped, f"{cmd}: the parser accepts {sorted(parsed - helped)}, which "
                                    "--help does not list (add them to tools/cli_table.cpp)")
            offered = completion_options(comp, cmd)
            check(offered == helped, f"{cmd}: the completion offers "
                                     f"{sorted(offered ^ helped)} unlike --help")
            for opt in sorted(helped - {"-h", "--help", "--version"}):
                p = run([a.cg, cmd, opt, "x"], stdin=subprocess.DEVNULL, cwd=a.build)
                check("unknown option" not in p.stderr,
                      f"{cmd} {opt}: --help lists it, the parser does not know it: {p.stderr!r}")

    completion_values_check(comp, os.path.abspath(a.source))

    # One wording for an option a command does not know: run's, with its --help named.
    for cmd in ("run", "report", "config"):
        p = run([a.cg, cmd, "--bogus", "x"], stdin=subprocess.DEVNULL, cwd=a.build)
        want = f"cumemguard {cmd}: unknown option '--bogus' (see cumemguard {cmd} --help)\n"
        check(p.returncode == 64 and p.stderr == want and not p.stdout,
              f"{cmd} --bogus: rc {p.returncode} {p.stderr!r} {p.stdout[:200]!r}")

    # One exit-status table: cumemguard --help, cumemguard(1) and the README list the same codes
    # with the same meanings (the README's table is gen_cli's output, word for word), and every
    # code a command's own --help lists is among them.
    def exit_codes(text):
        block = text.split("Exit status", 1)[1].split("\n\n", 1)[0]
        return re.findall(r"^  (\S+) ", block, re.M)
    top = run([a.cg, "--help"]).stdout
    codes = exit_codes(top)
    want = run([os.path.join(tools, "gen_cli"), "exits-md", "/dev/stdout"]).stdout
    readme = open(os.path.join(a.source, "README.md")).read()
    check(want and want in readme, "README.md's exit status table is not gen_cli exits-md's:\n" +
          want)
    check([r.split("`")[1] for r in want.splitlines()[2:]] == codes,
          f"cumemguard --help lists exit statuses {codes}, the README table others")
    page = open(os.path.join(tools, "cumemguard.1")).read()
    man_exits = page.split('.SH "EXIT STATUS"\n', 1)[1].split(".SH", 1)[0]
    man_codes = re.findall(r"^\.TP\n\.B (\S+)", man_exits, re.M)
    check(man_codes == codes, f"cumemguard(1) EXIT STATUS {man_codes}, --help {codes}")
    for cmd in ("run", "report", "config"):
        own = exit_codes(run([a.cg, cmd, "--help"]).stdout)
        check(set(own) <= set(codes), f"cumemguard {cmd} --help has exit statuses "
                                      f"{sorted(set(own) - set(codes))} that cumemguard --help lacks")

    # Every command's own table has status 0, in --help and in its man page.
    for cmd in ("", "run", "report", "config"):
        own = exit_codes(run([a.cg] + ([cmd] if cmd else []) + ["--help"]).stdout)
        check("0" in own, f"{cmd or 'cumemguard'} --help: no exit status 0 in {own}")
        page = open(os.path.join(tools, "cumemguard" + ("-" + cmd if cmd else "") + ".1")).read()
        exits = page.split('.SH "EXIT STATUS"\n', 1)[1].split(".SH", 1)[0]
        check(re.search(r"^\.TP\n\.B 0$", exits, re.M),
              f"{cmd or 'cumemguard'}(1): no exit status 0")

    # -e and --env complete every option a user sets, from the options table, with no installed
    # cumemguard to ask (PATH without it); the launcher's internal variables are not offered.
    table = open(os.path.join(a.source, "policy", "options.def")).read().split("CMG_OPTION(")[1:]
    internal = {"CUMEMGUARD_" + re.match(r'\w+, "(\w+)"', r).group(1) for r in table
                if r.rstrip().endswith("Internal)")}
    names = {o["name"] for o in json.loads(run([a.cg, "config", "--json"]).stdout)["options"]}
    want = {n + "=" for n in names - internal} | {"CUMEMGUARD_OPTIONS="}
    check(internal and len(names) > len(internal), f"options table: {sorted(internal)}")
    for cmd, opt in (("run", "-e"), ("config", "--env")):
        script = (f"source {comp}; COMP_WORDS=(cumemguard {cmd} {opt} CUMEMGUARD_); COMP_CWORD=3; "
                  "_cumemguard; printf '%s\\n' \"${COMPREPLY[@]}\"")
        got = set(run(["bash", "-c", script], env=dict(os.environ, PATH="/usr/bin:/bin")).stdout
                  .split())
        check(got == want, f"{cmd} {opt} CUMEMGUARD_<TAB>: missing {sorted(want - got)}, extra "
                           f"{sorted(got - want)}")

    # Exit status 73 is in the tables of the commands that use it.
    for cmd in ("", "run", "report"):
        h = run([a.cg] + ([cmd] if cmd else []) + ["--help"]).stdout
        check(re.search(r"^  73 ", h, re.M), f"{cmd or 'cumemguard'} --help: no exit status 73")

    if FAILURES:
        print(f"{len(FAILURES)} failed")
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
