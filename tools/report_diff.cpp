// SPDX-License-Identifier: Apache-2.0
// `cumemguard report --diff A B`: two snapshots of what is resident compared by site (the creating
// stack by module and offset, the memory kind and state): what is new, what grew, what shrank and
// what is gone, largest change first. A and B may be snapshots of one log or of two (two ranks, two
// runs of one program: the same code is the same site in every process).
#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "log_files.h"
#include "report_fmt.h"
#include "report_model.h"
#include "report_resident.h"
#include "resident_view.h"

namespace cmg::report {
namespace {

using Json = nlohmann::ordered_json;

struct Operand {
  std::string text, path, selector;  // selector: "" (the last), a number, or a label
};

Operand parse_operand(const std::string &text) {
  Operand o{text, text, ""};
  struct stat st {};
  if (::stat(text.c_str(), &st) == 0) return o;  // a file of that name: the whole of it
  const auto at = text.rfind('@');
  if (at != std::string::npos && at > 0) {
    o.path = text.substr(0, at);
    o.selector = text.substr(at + 1);
  }
  return o;
}

bool all_digits(const std::string &s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// The snapshot an operand names in log `log`, or nullptr (with why).
const Snapshot *select(const Model &m, std::size_t log, const Operand &o, std::string &why) {
  const Snapshot *found = nullptr;
  std::size_t n = 0;
  for (const Snapshot &s : m.resident.snapshots()) {
    if (s.log != log) continue;
    ++n;
    if (o.selector.empty() || (all_digits(o.selector) && std::to_string(s.id) == o.selector) ||
        (!all_digits(o.selector) && s.label == o.selector))
      found = &s;  // the last that matches
  }
  if (!found)
    why = n == 0 ? "the log has no snapshot"
                 : fmt::format(
                       "no snapshot {} among its {} (name one by number, LOG@1, or by "
                       "label, LOG@sleep)",
                       o.selector.empty() ? "" : "'" + clean(o.selector) + "'", n);
  return found;
}

struct Change {
  const SiteView *a = nullptr, *b = nullptr;
  std::int64_t delta = 0;
  const char *status = "same";
  const SiteView &site() const { return b ? *b : *a; }
};

using SiteKey = std::tuple<StackKey, std::string, std::string, std::uint64_t>;

std::vector<Change> changes(const SnapView &va, const SnapView &vb) {
  std::map<SiteKey, Change> by;
  for (const auto *list : {&va.sites, &va.asleep_sites})
    for (const SiteView &s : *list) by[{s.key, s.kind, s.state, s.graph}].a = &s;
  for (const auto *list : {&vb.sites, &vb.asleep_sites})
    for (const SiteView &s : *list) by[{s.key, s.kind, s.state, s.graph}].b = &s;
  std::vector<Change> out;
  for (auto &[k, c] : by) {
    const std::int64_t a = c.a ? c.a->bytes : 0, b = c.b ? c.b->bytes : 0;
    c.delta = sat_sub(b, a);
    c.status = !c.a          ? "new"
               : !c.b        ? "gone"
               : c.delta > 0 ? "grew"
               : c.delta < 0 ? "shrank"
                             : "same";
    out.push_back(c);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Change &x, const Change &y) { return x.delta > y.delta; });
  return out;
}

std::string snap_text(const Model &m, const Snapshot &s, const SnapView &v) {
  // "in 1 object", as the resident report says it ("in 1 objects" before).
  return fmt::format("{} #{} \"{}\" at {} ({}): resident {} in {} {}, asleep {}",
                     m.logs[s.log].file, s.id, s.label, fmt_time(m.time(s.log, s.ts)),
                     trigger_text(s), human(v.resident), v.resident_count,
                     v.resident_count == 1 ? "object" : "objects", human(v.asleep));
}

std::string signed_human(std::int64_t d) {
  return (d > 0 ? "+" : d < 0 ? "-" : "") + human(d < 0 ? (d == INT64_MIN ? INT64_MAX : -d) : d);
}

void print_change(const Model &m, std::ostream &out, std::size_t i, const Change &c, bool full) {
  const SiteView &s = c.site();
  const std::int64_t ab = c.a ? c.a->bytes : 0, bb = c.b ? c.b->bytes : 0;
  const std::int64_t an = c.a ? c.a->count : 0, bn = c.b ? c.b->count : 0;
  out << fmt::format(
      "  [{}] {:<6} {} bytes ({}): {} -> {} in {} -> {} {}, {} {} on {}, "
      "created by {}\n",
      i, c.status, c.delta > 0 ? fmt::format("+{}", c.delta) : fmt::format("{}", c.delta),
      signed_human(c.delta), human(ab), human(bb), an, bn, bn == 1 ? "object" : "objects",
      s.kind, s.state, devs_text(s.devs), s.creator);
  print_stack(out, m.stack(s.log, s.stack), "        ", full);
}

void write_text(const Model &m, const ReportOptions &opt, std::ostream &out, const Snapshot &a,
                const Snapshot &b, const SnapView &va, const SnapView &vb,
                const std::vector<Change> &ch) {
  out << "cumemguard report --diff\n";
  out << "  A: " << snap_text(m, a, va) << "\n";
  out << "  B: " << snap_text(m, b, vb) << "\n";
  out << fmt::format("  resident {} ({} -> {}), asleep {} ({} -> {})\n",
                     signed_human(sat_sub(vb.resident, va.resident)), human(va.resident),
                     human(vb.resident), signed_human(sat_sub(vb.asleep, va.asleep)),
                     human(va.asleep), human(vb.asleep));
  std::vector<const Change *> up, down;
  std::size_t same = 0;
  for (const Change &c : ch) {
    if (c.delta > 0)
      up.push_back(&c);
    else if (c.delta < 0)
      down.push_back(&c);
    else
      ++same;
  }
  std::reverse(down.begin(), down.end());  // the largest decrease first
  auto list = [&](const std::vector<const Change *> &v, const char *title) {
    const std::size_t n = opt.top ? std::min(opt.top, v.size()) : v.size();
    out << fmt::format("\n== {}: {} site{}{}\n", title, v.size(), v.size() == 1 ? "" : "s",
                       n < v.size() ? fmt::format(" (top {} shown)", n) : "");
    for (std::size_t i = 0; i < n; ++i) print_change(m, out, i + 1, *v[i], opt.full_stacks);
  };
  list(up, "What grew or is new");
  list(down, "What shrank or is gone");
  out << fmt::format("\n{} site{} the same\n", same, same == 1 ? "" : "s");
}

Json change_json(const Model &m, const Change &c) {
  const SiteView &s = c.site();
  const ResolvedStack &st = m.stack(s.log, s.stack);
  Json frames = Json::array();
  for (const Frame &f : st.frames) {
    Json j = {{"module", f.module.empty() ? Json(nullptr) : Json(f.module)},
              {"offset", hex(f.offset)}};
    if (!f.function.empty()) j["function"] = f.function;
    if (!f.file.empty()) {
      j["file"] = f.file;
      j["line"] = f.line;
    }
    frames.push_back(std::move(j));
  }
  return {{"status", c.status},
          {"delta_bytes", c.delta},
          {"a_bytes", c.a ? c.a->bytes : 0},
          {"b_bytes", c.b ? c.b->bytes : 0},
          {"a_count", c.a ? c.a->count : 0},
          {"b_count", c.b ? c.b->count : 0},
          {"kind", s.kind},
          {"state", s.state},
          {"devs", Json(std::vector<std::int64_t>(s.devs.begin(), s.devs.end()))},
          {"creator", s.creator},
          {"stack", st.id ? Json(std::move(frames)) : Json(nullptr)}};
}

}  // namespace

int diff_main(const std::string &a_text, const std::string &b_text, const ReportOptions &opt) {
  const Operand oa = parse_operand(a_text), ob = parse_operand(b_text);
  // One reader per distinct file: A and B may be two snapshots of one log.
  std::vector<std::unique_ptr<LogReader>> readers;
  std::vector<std::string> paths;
  std::map<std::pair<dev_t, ino_t>, std::size_t> seen;
  auto open = [&](const Operand &o, std::size_t &index) -> bool {
    struct stat st {};
    if (::stat(o.path.c_str(), &st) == 0)
      if (auto it = seen.find({st.st_dev, st.st_ino}); it != seen.end()) {
        index = it->second;
        return true;
      }
    auto r = open_log_file(o.path);
    if (!r->open()) {
      std::cerr << "cumemguard report: " << clean(o.path) << ": " << r->error() << "\n";
      return false;
    }
    r->log().file = clean(o.path);
    index = readers.size();
    seen[{st.st_dev, st.st_ino}] = index;
    readers.push_back(std::move(r));
    paths.push_back(o.path);
    return true;
  };
  std::size_t ia = 0, ib = 0;
  if (!open(oa, ia) || !open(ob, ib)) return kExitNoInput;
  Model m = read_model(std::move(readers), {}, opt);
  std::string why;
  const Snapshot *a = select(m, ia, oa, why);
  if (!a) {
    std::cerr << "cumemguard report: --diff " << clean(oa.text) << ": " << why << "\n";
    return kExitNoInput;
  }
  const Snapshot *b = select(m, ib, ob, why);
  if (!b) {
    std::cerr << "cumemguard report: --diff " << clean(ob.text) << ": " << why << "\n";
    return kExitNoInput;
  }
  // One snapshot on both sides (LOG@1 LOG@1, LOG LOG, or a copy of the log): a diff of nothing,
  // which printed "0 sites" and exit 0 as if two moments had been compared. Refused as the other
  // diff requests that cannot say anything are (usage, 64).
  const Header &ha = m.logs[a->log].header, &hb = m.logs[b->log].header;
  if (a == b || (a->id == b->id && ha.pid == hb.pid && ha.host == hb.host &&
                 ha.start_unix_ns == hb.start_unix_ns && ha.start_unix_ns != 0)) {
    std::cerr << fmt::format(
        "cumemguard report: --diff {} {}: both name snapshot {} \"{}\" of one process's log "
        "({}): nothing to compare; name two snapshots (LOG@N, LOG@LABEL) (see cumemguard report "
        "--help)\n",
        clean(oa.text), clean(ob.text), a->id, a->label, m.logs[a->log].file);
    return kExitUsage;
  }
  const SnapView va = view_of(m, *a), vb = view_of(m, *b);
  const std::vector<Change> ch = changes(va, vb);

  int status = 0;
  // "-" is standard output; the page there is the diff asked for, unless -o names a file for the
  // text or JSON (report_main refuses two outputs on standard output).
  const bool html_stdout = opt.html_path == "-";
  if (!opt.html_path.empty()) {
    std::ofstream page_file;
    if (!html_stdout) page_file.open(opt.html_path, std::ios::binary | std::ios::trunc);
    std::ostream &html = html_stdout ? std::cout : page_file;
    if (html) {
      html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
              "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
              "style-src 'unsafe-inline'\"><title>cumemguard report --diff</title>"
              "<style>body{font:14px/1.45 system-ui,sans-serif;margin:24px auto;max-width:1100px}"
              "td,th{padding:2px 10px 2px 0;text-align:left}td.n{text-align:right}</style></head>"
              "<body><h1>cumemguard report --diff</h1>\n";
      for (const auto &[s, v, name] : {std::tuple{a, &va, "A"}, std::tuple{b, &vb, "B"}}) {
        html << "<h2>" << name << ": " << html_escape(snap_text(m, *s, *v)) << "</h2>";
        write_snapshot_chart(html, *s, *v);
      }
      html << "<h2>Changes by site</h2><table><tr><th>status</th><th class=\"n\">change</th>"
              "<th class=\"n\">A</th><th class=\"n\">B</th><th>kind</th><th>creator</th></tr>";
      for (const Change &c : ch) {
        if (c.delta == 0) continue;
        html << fmt::format(
            "<tr class=\"change\" data-status=\"{}\"><td>{}</td><td class=\"n\">"
            "{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{} {}</td>"
            "<td><code>{}</code></td></tr>",
            c.status, c.status, html_escape(signed_human(c.delta)),
            html_escape(human(c.a ? c.a->bytes : 0)), html_escape(human(c.b ? c.b->bytes : 0)),
            html_escape(c.site().kind), html_escape(c.site().state), html_escape(c.site().creator));
      }
      html << "</table></body></html>\n";
      if (html_stdout)
        html.flush();
      else
        page_file.close();
    }
    if (!html) {
      std::cerr << "cumemguard report: "
                << (html_stdout ? std::string("standard output") : clean(opt.html_path))
                << ": cannot write the HTML page\n";
      status = kExitCantCreate;
    }
    if (html_stdout && opt.output_path.empty()) return status;
  }
  std::ofstream file;
  if (!opt.output_path.empty() && opt.output_path != "-") {
    file.open(opt.output_path, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::cerr << "cumemguard report: " << clean(opt.output_path) << ": cannot write the diff\n";
      return kExitCantCreate;
    }
  }
  std::ostream &out = opt.output_path.empty() || opt.output_path == "-"
                          ? std::cout
                          : static_cast<std::ostream &>(file);
  if (opt.json) {
    Json rows = Json::array();
    for (const Change &c : ch) rows.push_back(change_json(m, c));
    Json j = {{"schema_version", 1},
              {"a", snapshot_json(m, opt, *a)},
              {"b", snapshot_json(m, opt, *b)},
              {"resident_delta_bytes", sat_sub(vb.resident, va.resident)},
              {"asleep_delta_bytes", sat_sub(vb.asleep, va.asleep)},
              {"changes", std::move(rows)}};
    out << j.dump(2, ' ', false, Json::error_handler_t::replace) << '\n';
  } else {
    write_text(m, opt, out, *a, *b, va, vb, ch);
  }
  out.flush();
  if (!out) {
    std::cerr << "cumemguard report: cannot write the diff\n";
    return kExitCantCreate;
  }
  return status;
}

}  // namespace cmg::report
