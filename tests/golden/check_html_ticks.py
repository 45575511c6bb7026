#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# The HTML chart's time axis in headless Chromium, for a run of 2 ms and one of 2 s: every tick
# label differs from the others (a 2 ms run printed "0.001 s" over and over), each lies inside the
# chart (the last one was clipped at the right edge), and they step evenly in a unit that suits
# the run. A script added to a copy of the page measures the rendered labels (every text of the
# chart that reads as a time) after the page's own script drew them.
#   check_html_ticks.py REPORT_EXE
# Exits 77 (skipped) when Chromium is not installed.
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_html import Dom, browser_args, chromium, fail  # noqa: E402

HEADER = {"cumemguard_log": 1, "tool": "0.1.0", "pid": 4242, "ppid": 1, "rank": -1, "host": "h",
          "start_unix_ns": 1764400000000000000, "argv": ["./prog"], "mode": "guard",
          "options": {}}

MEASURE = """<script>
(function(){const svg=document.getElementById('memory-chart');if(!svg)return;
const box=svg.getBoundingClientRect();const out=[];
for(const t of svg.querySelectorAll('text')){if(!/^[0-9.]+ (ns|\u00b5s|ms|s)$/.test(t.textContent))continue;
const b=t.getBoundingClientRect();
out.push({text:t.textContent,left:b.left-box.left,right:b.right-box.left});}
document.body.dataset.ticks=JSON.stringify(out);
document.body.dataset.chartWidth=String(box.width);})();
</script>"""


def log_of(length_ns):
    """Allocations and frees spread over `length_ns`."""
    recs, seq, n = [], 0, 40
    for i in range(n):
        seq += 1
        ts = length_ns * i // (n - 1)
        recs.append({"k": "call", "seq": seq, "ts": ts, "tid": 4242, "api": "cudaMalloc",
                     "res": 0, "args": {"ptr": hex(0x7f0000000000 + i * 4096), "size": 4096},
                     "dev": 0, "mem": "linear", "delta": 4096 * (1 + i % 3)})
    recs.append({"k": "end", "ts": length_ns})
    return "".join(json.dumps(r) + "\n" for r in [HEADER] + recs)


def main():
    exe = os.path.abspath(sys.argv[1])
    browser = chromium()
    if not browser:
        print("check_html_ticks: chromium is not installed (tools/dev test installs it): skipped")
        return 77
    tmp = tempfile.mkdtemp(prefix="cmg-html-ticks-")
    for length, unit in ((2_000_000, "ms"), (2_000_000_000, "s")):
        log = os.path.join(tmp, f"run{length}.log")
        with open(log, "w") as f:
            f.write(log_of(length))
        page = os.path.join(tmp, f"run{length}.html")
        p = subprocess.run([exe, "--no-symbolize", "--html", page, log], capture_output=True,
                           text=True, timeout=120)
        if p.returncode != 0:
            fail(f"report --html of a {length} ns run exited {p.returncode}: {p.stderr[-300:]}")
        src = open(page, encoding="utf-8").read()
        measured = os.path.join(tmp, f"measured{length}.html")
        with open(measured, "w", encoding="utf-8") as f:
            f.write(src.replace("</body>", MEASURE + "</body>"))
        r = subprocess.run([browser] + browser_args(os.path.join(tmp, f"profile{length}")) +
                           ["--window-size=1200,900", "--dump-dom", "file://" + measured],
                           capture_output=True, text=True, timeout=240)
        dom = Dom()
        dom.feed(r.stdout)
        body = dom.find("body")
        if not body or body[0].get("data-rendered") != "chart" or "data-ticks" not in body[0]:
            fail(f"{length} ns: the chart or the measuring script did not run: {r.stderr[-400:]}")
        ticks = json.loads(body[0]["data-ticks"])
        width = float(body[0]["data-chart-width"])
        texts = [t["text"] for t in ticks]
        if len(texts) < 3 or len(set(texts)) != len(texts):
            fail(f"{length} ns: tick labels {texts} (fewer than 3, or repeated)")
        if any(not t.endswith(" " + unit) for t in texts):
            fail(f"{length} ns: tick labels {texts} are not in {unit}")
        values = [float(t.split()[0]) for t in texts]
        steps = {round(b - a, 9) for a, b in zip(values, values[1:])}
        if len(steps) != 1 or values[0] < 0 or values[-1] > length / (1e6 if unit == "ms" else 1e9):
            fail(f"{length} ns: ticks {texts} do not step evenly within the run")
        for t in ticks:
            if t["left"] < 0 or t["right"] > width:
                fail(f"{length} ns: the label {t['text']!r} is clipped ({t['left']:.1f}.."
                     f"{t['right']:.1f} of {width:.0f} px)")
        print(f"check_html_ticks: {length} ns run: {', '.join(texts)}")
    shutil.rmtree(tmp, ignore_errors=True)
    print("check_html_ticks: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
