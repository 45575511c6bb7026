// SPDX-License-Identifier: Apache-2.0
// `cumemguard report --html OUT.html`: one self-contained page (no network, no external script,
// font or image): memory per device and kind over time as an inline SVG chart drawn by an inline
// script from the data embedded in the page, then what happened, findings with their symbolized
// stacks, suppressed findings, leaks, top allocation sites and the runs and ranks, merged.
#include <fmt/format.h>

#include "json_bounded.h"
#include "report_fmt.h"
#include "report_model.h"

namespace cmg::report {

// Text is clean() already (no control characters); here it only has to stay text.
std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

std::string esc(std::string_view s) { return html_escape(s); }

constexpr const char *kStyle = R"(
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#1d2330;padding:0 16px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #d5dae3;
padding-bottom:4px}h3{font-size:15px;margin:16px 0 4px}
.sub{color:#5b6475}.bad{color:#b3261e;font-weight:600}.ok{color:#1e7b34;font-weight:600}
table{border-collapse:collapse;margin:6px 0}td,th{padding:3px 10px 3px 0;text-align:left;
vertical-align:top}th{font-weight:600;color:#5b6475;border-bottom:1px solid #d5dae3}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,.stack{font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",monospace}
.group{border:1px solid #d5dae3;border-radius:6px;padding:8px 12px;margin:8px 0;background:#fafbfc}
ol.stack{margin:2px 0 6px;padding-left:34px}ol.stack li{white-space:pre-wrap;word-break:break-all}
.what{border-left:4px solid #b3261e;padding:4px 12px;margin:8px 0;background:#fdf3f2}
#chart svg{background:#fff;border:1px solid #d5dae3;border-radius:6px}
.legend span{display:inline-block;margin:2px 14px 2px 0;cursor:pointer;user-select:none}
.legend span.off{opacity:.35}.legend i{display:inline-block;width:12px;height:12px;
margin-right:5px;vertical-align:-1px;border-radius:2px}
)";

// Draws the chart from #cmg-data: one step line per (log, device, kind) through the peak of each
// bucket, axes in seconds and bytes, a legend that hides and shows series.
constexpr const char *kScript = R"(
(function(){
const data=JSON.parse(document.getElementById('cmg-data').textContent);
const box=document.getElementById('chart');
const NS='http://www.w3.org/2000/svg';
const series=data.series.filter(s=>s.points.length>0);
if(!series.length){box.textContent='No call record changed tracked memory.';
document.body.dataset.rendered='empty';return;}
const W=1060,H=340,L=78,R=16,T=14,B=40;
let t0=Infinity,t1=-Infinity,y1=0;
for(const s of series)for(const p of s.points){t0=Math.min(t0,p[0]);t1=Math.max(t1,p[0]);
y1=Math.max(y1,p[1]);}
if(t1<=t0)t1=t0+1;if(y1<=0)y1=1;
const x=t=>L+(t-t0)/(t1-t0)*(W-L-R),y=v=>H-B-v/y1*(H-T-B);
const el=(n,a)=>{const e=document.createElementNS(NS,n);for(const k in a)e.setAttribute(k,a[k]);return e;};
const svg=el('svg',{width:W,height:H,viewBox:`0 0 ${W} ${H}`,id:'memory-chart',role:'img'});
const units=[[2**40,'TiB'],[2**30,'GiB'],[2**20,'MiB'],[2**10,'KiB'],[1,'B']];
const fmtB=v=>{for(const [u,n] of units)if(v>=u||u===1)return (v/u).toFixed(v%u?1:0)+' '+n;};
for(let i=0;i<=4;i++){const v=y1*i/4,yy=y(v);
svg.appendChild(el('line',{x1:L,x2:W-R,y1:yy,y2:yy,stroke:'#e6e9ef'}));
const tx=el('text',{x:L-6,y:yy+4,'text-anchor':'end','font-size':11,fill:'#5b6475'});
tx.textContent=fmtB(v);svg.appendChild(tx);}
// Time ticks at a round step (1, 2 or 5 times a power of ten) in a unit the run's length suits,
// with as many decimals as the step needs: a 2 ms run printed "0.001 s" three times before. The
// labels at the edges are anchored inside the chart instead of clipped.
const span=t1-t0,raw=span/5,p10=10**Math.floor(Math.log10(raw));
const step=[1,2,5,10].map(m=>m*p10).find(v=>v>=raw);
const [us,un]=span>=1e9?[1e9,'s']:span>=1e6?[1e6,'ms']:span>=1e3?[1e3,'\u00b5s']:[1,'ns'];
const dec=Math.max(0,-Math.floor(Math.log10(step/us)+1e-9));
for(let k=Math.ceil(t0/step);k*step<=t1+step*1e-9;k++){const t=k*step,xx=x(t);
const anchor=xx>W-R-40?'end':xx<L+40?'start':'middle';
const tx=el('text',{x:xx,y:H-B+16,'text-anchor':anchor,'font-size':11,fill:'#5b6475',
class:'tick-x'});
tx.textContent=(t/us).toFixed(dec)+' '+un;svg.appendChild(tx);}
const ax=el('text',{x:(L+W-R)/2,y:H-6,'text-anchor':'middle','font-size':11,fill:'#5b6475'});
ax.textContent='report time (peak bytes per interval)';svg.appendChild(ax);
const colors=['#3366cc','#dc3912','#ff9900','#109618','#990099','#0099c6','#dd4477','#66aa00',
'#b82e2e','#316395','#994499','#22aa99'];
const legend=document.createElement('div');legend.className='legend';
series.forEach((s,i)=>{const c=colors[i%colors.length];let d='';
s.points.forEach((p,j)=>{d+=(j?` H${x(p[0]).toFixed(1)} V`:`M${x(p[0]).toFixed(1)} `)+y(p[1]).toFixed(1);});
d+=` H${x(t1).toFixed(1)}`;
const path=el('path',{d:d,fill:'none',stroke:c,'stroke-width':1.6,class:'series',
'data-name':s.name,'data-peak':s.peak});
const ti=el('title',{});ti.textContent=s.name+': peak '+fmtB(s.peak);path.appendChild(ti);
svg.appendChild(path);
const item=document.createElement('span');item.dataset.name=s.name;
item.innerHTML=`<i style="background:${c}"></i>`;item.appendChild(document.createTextNode(
s.name+' (peak '+fmtB(s.peak)+')'));
item.onclick=()=>{const off=item.classList.toggle('off');path.style.display=off?'none':'';};
legend.appendChild(item);});
box.appendChild(svg);box.appendChild(legend);
document.body.dataset.rendered='chart';
})();
)";

}  // namespace

void stack_html(std::ostream &out, const ResolvedStack &s) {
  if (!s.id) {
    out << "<div class=\"sub\">(no stack recorded)</div>";
    return;
  }
  if (s.missing) {
    out << fmt::format("<div class=\"sub\">(stack {} is not in the log)</div>", *s.id);
    return;
  }
  out << "<ol class=\"stack\" start=\"0\">";
  for (const Frame &f : s.frames)
    out << "<li>" << esc(frame_text(f)) << (f.inlined ? " [inlined]" : "") << "</li>";
  out << "</ol>";
}

namespace {

std::string labels_of(const Model &m, const std::set<std::size_t> &logs) {
  std::string out;
  for (auto li : logs) out += (out.empty() ? "" : ", ") + m.label(li);
  return out;
}

void chart_data(const Model &m, std::ostream &out) {
  std::string j = "{\"series\":[";
  bool first = true;
  for (const auto &r : m.memory) {
    if (!r.from_events) continue;
    if (!first) j += ',';
    first = false;
    j += "{\"name\":";
    append_json_string(j, fmt::format("{} dev {} {}", m.label(r.log), dev_text(r.dev), r.mem));
    j += fmt::format(",\"peak\":{},\"points\":[", r.peak);
    for (std::size_t i = 0; i < r.series.points.size(); ++i) {
      const auto &p = r.series.points[i];
      j += fmt::format("{}[{},{},{}]", i ? "," : "", p.t, p.max, p.last);
    }
    j += "]}";
  }
  j += "]}";
  out << "<script id=\"cmg-data\" type=\"application/json\">" << j << "</script>\n";
}

void outcomes_html(const Model &m, std::ostream &out) {
  bool any = false;
  for (const auto &o : m.outcomes) any = any || o.explain();
  if (!any) return;
  out << "<h2 id=\"what-happened\">What happened</h2>\n";
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Outcome &o = m.outcomes[i];
    if (!o.explain()) continue;
    out << "<div class=\"what\"><b>" << esc(m.label(i)) << "</b> <span class=\"sub\">"
        << esc(m.logs[i].file) << "</span> &mdash; status <span class=\"bad\">"
        << (o.status == Status::Truncated && o.running ? "still running" : status_name(o.status))
        << (o.signal_name.empty() ? "" : " (" + esc(o.signal_name) + ")")
        << "</span>";
    if (o.all_failed)
      out << "<div class=\"bad\">nothing was checked: " << esc(all_failed_long(*o.all_failed))
          << "</div>";
    if (o.crash) {
      out << fmt::format("<div>killed by {} in thread {} at</div>", esc(o.signal_name),
                         o.crash->tid);
      stack_html(out, m.stack(i, o.crash->stack));
    }
    const ErrorPoint *first = o.first_sticky ? &*o.first_sticky
                              : o.errors.empty() ? nullptr
                                                 : &o.errors.front();
    if (first) {
      out << fmt::format("<div>first CUDA error {} ({}) at {} seq {} in thread {}</div>",
                         first->error.res, esc(first->error.name), esc(first->error.api),
                         first->seq, first->tid);
      stack_html(out, m.stack(i, first->stack));
    }
    if (!o.lifecycle.empty()) {
      out << "<div>memory lifecycle calls "
          << (o.lifecycle_before_error ? "before the first sticky CUDA error"
              : o.lifecycle_to_abort   ? "up to strict mode's abort"
                                       : "before the end of the log")
          << ":</div><table><tr><th>seq</th><th>thread</th><th>call</th><th>res</th></tr>";
      for (const auto &l : o.lifecycle)
        out << fmt::format("<tr><td class=\"n\">{}</td><td class=\"n\">{}</td><td><code>{}</code>"
                           "</td><td class=\"n\">{}</td></tr>",
                           l.seq, l.tid, esc(call_text(l.api, l.args)), l.res);
      out << "</table>";
    }
    if (!o.asleep.empty()) {
      out << fmt::format("<div>VMM ranges asleep {}: {}</div><ul>",
                         o.asleep_at_error ? "when the first sticky CUDA error was returned"
                                           : "at the end of the log",
                         o.asleep_total);
      for (const auto &a : o.asleep)
        out << fmt::format("<li><code>{} +{}</code> in reservation <code>{}</code>, unmapped at "
                           "seq {}</li>",
                           hex(a.ptr), a.size, hex(a.reservation), a.unmap_seq);
      out << "</ul>";
    }
    out << "</div>\n";
  }
}

void findings_html(const Model &m, std::ostream &out) {
  out << fmt::format("<h2 id=\"findings\">Findings: {}</h2>\n", m.finding_count);
  if (m.findings.empty() && not_checked_count(m))
    out << "<p class=\"bad\">none: " << esc(not_checked_text(m)) << "</p>\n";
  else if (m.findings.empty())
    out << "<p class=\"ok\">none</p>\n";
  for (const auto &c : m.findings) {
    out << fmt::format("<section class=\"finding-class\" data-class=\"{}\"><h3>{}: {}</h3>",
                       esc(c.cls), esc(c.cls), c.count);
    if (!c.help.empty()) out << "<div class=\"sub\">" << esc(c.help) << "</div>";
    for (const auto &g : c.groups) {
      const Finding &f = g.finding();
      const Event &e = g.example.event;
      out << fmt::format(
          "<div class=\"group finding\" data-class=\"{}\" data-count=\"{}\"><div><b>{} time{}</b>"
          " in {}, first at {}, last at {}</div>",
          esc(c.cls), g.count, g.count, g.count == 1 ? "" : "s", esc(labels_of(m, g.logs)),
          fmt_time(g.first_t), fmt_time(g.last_t));
      out << fmt::format("<div><code>{} -&gt; {}</code>, action {}; thread {} seq {}</div>",
                         esc(call_text(f.api, f.args)), f.res, esc(f.action), e.tid, e.seq);
      if (!f.msg.empty()) out << "<div>" << esc(f.msg) << "</div>";
      stack_html(out, m.stack(g.stack));
      for (const auto &r : f.related) {
        out << fmt::format("<div class=\"sub\">{}: {}{}</div>", esc(r.what.empty() ? "related" : r.what),
                           esc(r.api), r.seq ? fmt::format(", seq {}", *r.seq) : "");
        stack_html(out, m.stack(g.example.log, r.stack));
      }
      out << "</div>";
    }
    out << "</section>\n";
  }
  if (!m.suppressed.empty()) {
    out << fmt::format("<h3>Suppressed: {} finding{} by {} rule{}</h3><ul>", m.suppressed_count,
                       m.suppressed_count == 1 ? "" : "s", m.suppressed.size(),
                       m.suppressed.size() == 1 ? "" : "s");
    for (const auto &r : m.suppressed)
      out << fmt::format("<li><code>{}:{}</code> {}</li>", esc(r.cls), esc(r.pattern), r.count);
    out << "</ul>\n";
  }
}

void leaks_html(const Model &m, const ReportOptions &opt, std::ostream &out) {
  out << fmt::format("<h2 id=\"leaks\">Leaks at exit: {} object{}, {}</h2>\n", m.leak_count,
                     m.leak_count == 1 ? "" : "s", esc(bytes_text(m.leak_bytes)));
  for (std::size_t i = 0; i < m.logs.size(); ++i)
    if (m.outcomes[i].status != Status::Complete)
      out << "<p>" << esc(m.label(i))
          << ": not known: the process did not exit normally</p>\n";
  const std::size_t n = opt.top ? std::min(opt.top, m.leaks.size()) : m.leaks.size();
  for (std::size_t i = 0; i < n; ++i) {
    const LeakGroup &g = m.leaks[i];
    out << fmt::format("<div class=\"group leak\"><b>{} object{}</b> via <code>{}</code>, {} in {}",
                       g.count, g.count == 1 ? "" : "s", esc(g.api), esc(bytes_text(g.bytes)),
                       esc(labels_of(m, g.logs)));
    stack_html(out, m.stack(g.stack));
    out << "</div>\n";
  }
}

void sites_html(const Model &m, const ReportOptions &opt, std::ostream &out) {
  if (m.sites.empty()) return;
  const std::size_t n = opt.top ? std::min(opt.top, m.sites.size()) : m.sites.size();
  out << fmt::format("<h2 id=\"sites\">Top allocation sites ({} of {})</h2>\n", n, m.sites.size());
  for (std::size_t i = 0; i < n; ++i) {
    const SiteRow &s = m.sites[i];
    std::string apis;
    for (const auto &a : s.apis) apis += (apis.empty() ? "" : ", ") + a;
    out << fmt::format("<div class=\"group site\"><b>{}</b> in {} call{} ({}) in {}",
                       esc(bytes_text(s.bytes)), s.count, s.count == 1 ? "" : "s", esc(apis),
                       esc(labels_of(m, s.logs)));
    stack_html(out, m.stack(s.stack));
    out << "</div>\n";
  }
}

void tables_html(const Model &m, std::ostream &out) {
  out << "<h2 id=\"processes\">Runs and ranks</h2>\n<table><tr><th>log</th><th>program</th>"
         "<th>process</th><th>host</th><th>mode</th><th>status</th><th class=\"n\">records</th>"
         "<th>file</th></tr>";
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Log &l = m.logs[i];
    std::string argv;
    for (const auto &a : l.header.argv) argv += (argv.empty() ? "" : " ") + a;
    // A log without its end record whose process is alive on this host (the text report's rule).
    const bool running = l.status() == Status::Truncated && l.running;
    out << fmt::format(
        "<tr class=\"process\"><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>"
        "<td>{}</td><td class=\"{}\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
        esc(m.label(i)), esc(argv), esc(log_label(l)), esc(l.header.host), esc(l.header.mode),
        l.status() == Status::Complete || running ? "ok" : "bad",
        running ? "still running" : status_name(l.status()), l.records, esc(l.file));
  }
  out << "</table>\n";
  if (!m.memory.empty()) {
    out << "<h2 id=\"memory\">Memory by device and kind</h2>\n<table><tr><th>log</th><th>dev</th>"
           "<th>kind</th><th class=\"n\">current</th><th class=\"n\">peak</th>"
           "<th class=\"n\">peak at</th><th class=\"n\">allocated</th><th class=\"n\">freed</th>"
           "</tr>";
    for (const auto &r : m.memory) {
      if (!r.from_events) continue;
      out << fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td>"
                         "<td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td>"
                         "<td class=\"n\">{}</td></tr>",
                         esc(m.label(r.log)), dev_text(r.dev), esc(r.mem), r.current, r.peak,
                         fmt_time(r.peak_t), r.allocated, r.freed);
    }
    out << "</table>\n";
  }
  if (!m.calls.empty()) {
    out << "<h2 id=\"calls\">Calls per API</h2>\n<table><tr><th>api</th><th class=\"n\">calls</th>"
           "<th class=\"n\">errors</th><th class=\"n\">skipped</th><th class=\"n\">total time</th>"
           "</tr>";
    for (const auto &c : m.calls)
      out << fmt::format("<tr><td><code>{}</code></td><td class=\"n\">{}</td><td class=\"n\">{}"
                         "</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                         esc(c.api), c.count, c.errors, c.skipped, fmt_duration(c.dur_total));
    out << "</table>\n";
  }
}

}  // namespace

void write_html(const Model &m, const ReportOptions &opt, std::ostream &out) {
  m.resolve_shown(opt);
  std::string state;
  for (const auto &o : m.outcomes)
    if (o.status != Status::Complete) state = ", not every process exited normally";
  out << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
         "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
      << "<title>cumemguard report</title>\n<style>" << kStyle << "</style></head>\n<body>\n";
  // The first line says what the text report's does: nothing checked, findings the shim counted
  // whose records cannot be read, records that did not parse ("0 findings" read as a clean run).
  const std::vector<std::string> counted = m.counted_not_read();
  const std::string unchecked = not_checked_text(m);
  std::string counted_text;
  for (const auto &c : counted) counted_text += (counted_text.empty() ? "" : ", ") + c;
  std::string findings =
      m.finding_count == 0 && !counted.empty()
          ? "0 finding records (the shim counted " + counted_text + ")"
      : m.finding_count == 0 && !unchecked.empty() && not_checked_count(m) == m.logs.size()
          ? unchecked
          : fmt::format("{} finding{}", m.finding_count, m.finding_count == 1 ? "" : "s");
  if (!unchecked.empty() && findings != unchecked) findings += "; " + unchecked;
  if (const std::size_t n = m.unreadable_records())
    state += fmt::format("; {} unreadable record{}: not clean", n, n == 1 ? "" : "s");
  out << fmt::format(
      "<h1>cumemguard report</h1>\n<div class=\"sub\" id=\"summary\">{} log{}, {}, {} "
      "leak{}{}</div>\n",
      m.logs.size(), m.logs.size() == 1 ? "" : "s", esc(findings), m.leak_count,
      m.leak_count == 1 ? "" : "s", esc(state));
  outcomes_html(m, out);
  out << "<h2 id=\"memory-over-time\">Memory over time, per device and kind</h2>\n"
         "<div id=\"chart\"><noscript>The chart needs scripts; the tables below have the "
         "figures.</noscript></div>\n";
  findings_html(m, out);
  write_resident_html(m, opt, out);
  leaks_html(m, opt, out);
  sites_html(m, opt, out);
  tables_html(m, out);
  chart_data(m, out);
  out << "<script>" << kScript << "</script>\n</body></html>\n";
}

}  // namespace cmg::report
