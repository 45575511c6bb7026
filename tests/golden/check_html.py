#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# `cumemguard report --html`: the page is self-contained (no network, no external script, font or
# image), and headless Chromium, with its network off, renders the chart and the findings: the
# DOM after the page's script ran has one series path per (log, device, kind) the data holds, the
# legend names them, and every finding group, stack frame and process row is there.
#
#   check_html.py REPORT_EXE [--screenshot OUT.png] LOG...
# Exits 77 (skipped) when Chromium is not installed.
import argparse
import html.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


class Dom(html.parser.HTMLParser):
    """Elements with their attributes, and the text under each id'd element."""

    def __init__(self):
        super().__init__()
        self.elements = []  # (tag, attrs dict)
        self.text = []
        self.data_json = None
        self._in_data = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append((tag, a))
        self._in_data = tag == "script" and a.get("id") == "cmg-data"

    def handle_endtag(self, tag):
        self._in_data = False

    def handle_data(self, data):
        if self._in_data:
            self.data_json = (self.data_json or "") + data
        self.text.append(data)

    def find(self, tag=None, **attrs):
        return [a for t, a in self.elements
                if (tag is None or t == tag) and all(a.get(k.replace("_", "-")) == v
                                                      for k, v in attrs.items())]


def fail(msg):
    print("check_html: FAIL: " + msg)
    sys.exit(1)


def chromium():
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


def browser_args(profile):
    # No network at all: no background requests, no proxy that answers, no name resolves.
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run",
            "--disable-default-apps", "--disable-extensions", f"--user-data-dir={profile}",
            "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
            "--virtual-time-budget=10000"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("exe")
    ap.add_argument("--screenshot")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cmg-html-")
    page = os.path.join(tmp, "report.html")
    p = subprocess.run([os.path.abspath(a.exe), "--no-symbolize", "--html", page] + a.logs,
                       cwd=HERE, capture_output=True, text=True, timeout=120)
    if p.returncode not in (0, 1) or not os.path.exists(page):
        fail(f"report --html exited {p.returncode}: {p.stderr[-500:]}")
    src = open(page, encoding="utf-8").read()

    # Self-contained: nothing the page could fetch.
    for bad in ("<link", " src=", "@import", "url(", "<iframe", "<img"):
        if bad in src:
            fail(f"the page refers to something outside it: {bad!r}")
    for url in re.findall(r"https?://[^\s\"'`<>]+", src):
        if url != "http://www.w3.org/2000/svg":  # the SVG namespace name, never fetched
            fail(f"the page names a URL: {url}")

    static = Dom()
    static.feed(src)
    data = json.loads(static.data_json)
    want_series = [s["name"] for s in data["series"] if s["points"]]
    if not want_series:
        fail("the page's data has no memory series")

    browser = chromium()
    if not browser:
        print("check_html: chromium is not installed (tools/dev test installs it): skipped")
        shutil.rmtree(tmp, ignore_errors=True)
        return 77
    profile = os.path.join(tmp, "profile")
    r = subprocess.run([browser] + browser_args(profile) + ["--dump-dom", "file://" + page],
                       capture_output=True, text=True, timeout=240)
    if r.returncode != 0 or "<body" not in r.stdout:
        fail(f"chromium --dump-dom exited {r.returncode}: {r.stderr[-800:]}")
    dom = Dom()
    dom.feed(r.stdout)

    body = dom.find("body")
    if not body or body[0].get("data-rendered") != "chart":
        fail(f"the page's script did not draw the chart (body {body[:1]})")
    if not dom.find("svg", id="memory-chart"):
        fail("no svg#memory-chart in the rendered page")
    paths = dom.find("path", **{"class": "series"})
    names = [pth.get("data-name") for pth in paths]
    if names != want_series:
        fail(f"series drawn {names}, expected {want_series}")
    for pth in paths:
        if not re.match(r"M[\d.]+ [\d.]+( H[\d.]+ V[\d.]+)* H[\d.]+$", pth.get("d", "")):
            fail(f"series {pth.get('data-name')} has no step line: {pth.get('d', '')[:80]}")
    legend = [s.get("data-name") for s in dom.find("span") if s.get("data-name")]
    if legend != want_series:
        fail(f"legend {legend}, expected {want_series}")

    # The findings, as the JSON report counts them, each group with its count and its stack.
    j = json.loads(subprocess.run([os.path.abspath(a.exe), "--no-symbolize", "--json"] + a.logs,
                                  cwd=HERE, capture_output=True, text=True, timeout=120).stdout)
    want_groups = sorted((c["class"], g["count"]) for c in j["findings"]["classes"]
                         for g in c["groups"])
    got_groups = sorted((g["data-class"], int(g["data-count"]))
                        for g in dom.find("div") if "finding" in g.get("class", "").split())
    if got_groups != want_groups:
        fail(f"finding groups rendered {got_groups}, expected {want_groups}")
    text = "".join(dom.text)
    for c in j["findings"]["classes"]:
        for g in c["groups"]:
            if g["stack"] and g["stack"]["frames"]:
                f = g["stack"]["frames"][0]
                frame = f"{os.path.basename(f['module'])}+{f['offset']}" if f["module"] else f["pc"]
                if frame not in text:
                    fail(f"the {c['class']} stack frame {frame} is not on the page")
    rows = dom.find("tr", **{"class": "process"})
    if len(rows) != len(j["logs"]):
        fail(f"{len(rows)} process rows, expected {len(j['logs'])}")
    if any(l["outcome"]["explained"] for l in j["logs"]) and "What happened" not in text:
        fail("a process that did not end well, and no 'What happened' section")

    if a.screenshot:
        s = subprocess.run([browser] + browser_args(profile + "-shot") +
                           ["--window-size=1120,1500", "--hide-scrollbars",
                            f"--screenshot={os.path.abspath(a.screenshot)}", "file://" + page],
                           capture_output=True, text=True, timeout=240)
        if s.returncode != 0 or not os.path.exists(a.screenshot):
            fail(f"chromium --screenshot exited {s.returncode}: {s.stderr[-500:]}")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"check_html: ok ({len(paths)} series, {len(got_groups)} finding groups, "
          f"{len(rows)} processes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
