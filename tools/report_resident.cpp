// SPDX-License-Identifier: Apache-2.0
// The "Resident" section (see report_resident.h): snapshot records read and added up, and each
// snapshot shown by device and kind, by creator and by site, largest first.
#include "report_resident.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "logfields.h"
#include "report_fmt.h"
#include "report_model.h"
#include "resident_view.h"

namespace cmg::report {
namespace {
namespace od = simdjson::ondemand;
using fields::i64_of;
using fields::key_of;
using fields::str_of;
using fields::u64_of;
using simdjson::SUCCESS;

bool read_run(od::value v, Snapshot::Run &r) {
  od::object o;
  if (v.get_object().get(o) != SUCCESS) return false;
  for (auto f : o) {
    std::string_view k;
    if (!key_of(f, k)) return false;
    od::value x;
    if (f.value().get(x) != SUCCESS) return false;
    if (k == "what")
      r.what = str_of(x).value_or("");
    else if (k == "seq")
      r.seq = u64_of(x).value_or(0);
    else if (k == "tid")
      r.tid = i64_of(x).value_or(0);
    else if (k == "ranges")
      r.ranges = i64_of(x).value_or(0);
    else if (k == "bytes")
      r.bytes = i64_of(x).value_or(0);
    else if (k == "failed") {
      bool b = false;
      r.failed = x.get_bool().get(b) == SUCCESS && b;
    }
  }
  return true;
}

// [dev,"kind","state",stack,graph,count,bytes]
bool read_row(od::value v, SnapshotRow &row) {
  od::array a;
  if (v.get_array().get(a) != SUCCESS) return false;
  int i = 0;
  for (auto e : a) {
    od::value x;
    if (e.get(x) != SUCCESS) return false;
    switch (i++) {
      case 0:
        row.dev = i64_of(x).value_or(-1);
        break;
      case 1:
        row.kind = str_of(x).value_or("");
        break;
      case 2:
        row.state = str_of(x).value_or("");
        break;
      case 3:
        row.stack = u64_of(x).value_or(0);
        break;
      case 4:
        row.graph = u64_of(x).value_or(0);
        break;
      case 5:
        row.count = i64_of(x).value_or(0);
        break;
      case 6:
        row.bytes = i64_of(x).value_or(0);
        break;
      default:
        break;  // a later version's fields
    }
  }
  return i >= 7 && !row.kind.empty() && !row.state.empty();
}

std::string row_key(const SnapshotRow &r) {
  return fmt::format("{}|{}|{}|{}|{}", r.dev, r.kind, r.state, r.stack, r.graph);
}

}  // namespace

void ResidentModel::add_line(std::size_t log, std::string_view line) {
  simdjson::padded_string text(line);
  od::parser parser;
  od::document doc;
  od::object obj;
  if (parser.iterate(text).get(doc) != SUCCESS || doc.get_object().get(obj) != SUCCESS) {
    ++malformed_;
    return;
  }
  std::optional<std::uint64_t> id, part;
  Snapshot head;
  std::vector<SnapshotRow> rows;
  bool end = false, ok = true;
  for (auto f : obj) {
    std::string_view k;
    if (!key_of(f, k)) {
      ok = false;
      break;
    }
    od::value x;
    if (f.value().get(x) != SUCCESS) {
      ok = false;
      break;
    }
    if (k == "id")
      id = u64_of(x);
    else if (k == "part")
      part = u64_of(x);
    else if (k == "after_seq")
      head.after_seq = u64_of(x).value_or(0);
    else if (k == "ts")
      head.ts = i64_of(x).value_or(0);
    else if (k == "tid")
      head.tid = i64_of(x).value_or(0);
    else if (k == "label")
      head.label = clean(str_of(x).value_or(""), 256);
    else if (k == "trigger")
      head.trigger = clean(str_of(x).value_or(""), 64);
    else if (k == "stack")
      head.stack = u64_of(x);
    else if (k == "run") {
      Snapshot::Run r;
      if (read_run(x, r)) head.run = std::move(r);
    } else if (k == "rows") {
      od::array a;
      if (x.get_array().get(a) != SUCCESS) {
        ok = false;
        break;
      }
      for (auto e : a) {
        od::value rv;
        SnapshotRow row;
        if (e.get(rv) != SUCCESS || !read_row(rv, row)) {
          ok = false;
          break;
        }
        rows.push_back(std::move(row));
      }
    } else if (k == "end") {
      bool b = false;
      end = x.get_bool().get(b) == SUCCESS && b;
    } else if (k == "objects")
      head.objects = i64_of(x).value_or(0);
    else if (k == "dur")
      head.dur = i64_of(x).value_or(0);
    else if (k == "incomplete") {
      bool b = false;
      head.incomplete = x.get_bool().get(b) == SUCCESS && b;
    }
  }
  if (!ok || !id || !part) {
    ++malformed_;
    return;
  }
  auto [it, fresh] = at_.try_emplace({log, *id}, snaps_.size());
  if (fresh) {
    if (snaps_.size() >= kMaxSnapshots) {
      at_.erase(it);
      ++dropped_;
      return;
    }
    head.log = log;
    head.id = *id;
    snaps_.push_back(std::move(head));
    rows_at_.emplace_back();
  }
  Snapshot &s = snaps_[it->second];
  // A second first part of a known id (a damaged or spliced log): its rows are still added.
  if (*part == 0 && !fresh) ++malformed_;
  ++s.parts;
  if (end) {
    s.ended = true;
    s.objects = head.objects;
    s.dur = head.dur;
    s.incomplete = head.incomplete;
  }
  auto &index = rows_at_[it->second];
  for (SnapshotRow &r : rows) {
    const std::string key = row_key(r);
    if (auto at = index.find(key); at != index.end()) {
      SnapshotRow &have = s.rows[at->second];
      have.count = sat_add(have.count, r.count);
      have.bytes = sat_add(have.bytes, r.bytes);
    } else if (s.rows.size() < kMaxRows) {
      index.emplace(key, s.rows.size());
      s.rows.push_back(std::move(r));
    } else {
      ++s.rows_dropped;
    }
  }
}

void ResidentModel::finish() {
  rows_at_.clear();
  at_.clear();
  std::stable_sort(snaps_.begin(), snaps_.end(), [](const Snapshot &a, const Snapshot &b) {
    return a.log != b.log ? a.log < b.log : a.id < b.id;
  });
}

// ---- the text section -------------------------------------------------------------------------

namespace {

std::string plural(std::int64_t n, const char *one, const char *many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

std::string join(const std::vector<std::string> &v) {
  std::string out;
  for (const auto &s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::size_t shown(std::size_t n, std::size_t top) {
  return top == 0 ? n : std::min(n, top);
}

void print_sites(const Model &m, const ReportOptions &opt, std::ostream &out,
                 const std::vector<SiteView> &sites, const char *objects) {
  const std::size_t n = shown(sites.size(), opt.top);
  for (std::size_t i = 0; i < n; ++i) {
    const SiteView &s = sites[i];
    out << fmt::format("  [{}] {} in {}: {} {} on {}, created by {}{}{}\n", i + 1,
                       bytes_text(s.bytes), plural(s.count, "object", objects), s.kind, s.state,
                       devs_text(s.devs), s.creator, python_text(s),
                       s.graph ? fmt::format(", for a CUDA graph (capture {})", s.graph) : "");
    print_stack(out, m.stack(s.log, s.stack), "        ", opt.full_stacks);
  }
  if (n < sites.size()) out << fmt::format("  ({} more sites)\n", sites.size() - n);
}

}  // namespace

void resolve_resident(const Model &m, const ReportOptions &opt) {
  for (const Snapshot &s : m.resident.snapshots()) {
    const SnapView v = view_of(m, s);
    for (const auto *list : {&v.sites, &v.asleep_sites})
      for (std::size_t i = 0; i < shown(list->size(), opt.top); ++i)
        m.stack((*list)[i].log, (*list)[i].stack);
    if (s.stack) m.stack(s.log, s.stack);
  }
}

void write_resident_text(const Model &m, const ReportOptions &opt, std::ostream &out) {
  const auto &snaps = m.resident.snapshots();
  if (snaps.empty()) return;
  out << fmt::format("\n== Resident: {}{}\n", plural(snaps.size(), "snapshot", "snapshots"),
                     m.resident.dropped() ? fmt::format(" ({} more not read)", m.resident.dropped())
                                          : std::string());
  for (const Snapshot &s : snaps) {
    const SnapView v = view_of(m, s);
    out << fmt::format(
        "\n[{} #{}] \"{}\" at {} ({}), thread {}: resident {} in {}, asleep {} in "
        "{}\n",
        m.label(s.log), s.id, s.label, fmt_time(m.time(s.log, s.ts)), trigger_text(s), s.tid,
        human(v.resident), plural(v.resident_count, "object", "objects"), human(v.asleep),
        plural(v.asleep_count, "range", "ranges"));
    // The sleep ends at the first call that is not part of it, and the snapshot is taken then:
    // a range freed before that call (the demo's free while asleep) is not asleep in it, which
    // read as a contradiction of the header's count.
    if (after_sleep(s) && s.run && v.asleep_count < s.run->ranges) {
      const std::int64_t gone = s.run->ranges - v.asleep_count;
      out << fmt::format(
          "    {} of the {} put to sleep {} no longer asleep: freed (or mapped again) before the "
          "first call that is not part of the sleep, when this snapshot was taken\n",
          gone, plural(s.run->ranges, "range", "ranges"), gone == 1 ? "is" : "are");
    }
    if (!s.ended)
      out << "    incomplete: the log ends inside this snapshot (the process was cut off)\n";
    if (s.incomplete)
      out << "    incomplete: the VMM model or the graph allocations stayed locked while the "
             "snapshot was taken\n";
    if (s.stack) {
      out << "    asked for at\n";
      print_stack(out, m.stack(s.log, s.stack), "        ", opt.full_stacks);
    }
    if (!v.devices.empty()) {
      std::vector<std::string> parts;
      for (const TotalView &t : v.devices)
        parts.push_back(fmt::format("dev {} {} {} {} ({})", dev_text(t.dev), t.kind, t.state,
                                    human(t.bytes), t.count));
      out << "    by device and kind: " << join(parts) << "\n";
    }
    if (!v.creators.empty()) {
      std::vector<std::string> parts;
      for (const CreatorView &c : v.creators)
        parts.push_back(fmt::format("{} {} ({})", c.creator, human(c.bytes), c.count));
      out << "    by creator:         " << join(parts) << "\n";
    }
    if (after_sleep(s)) {
      out << fmt::format("  did not go to sleep: {} in {} at {}{}\n", human(v.resident),
                         plural(v.resident_count, "object", "objects"),
                         plural(v.sites.size(), "site", "sites"),
                         v.resident ? ", largest first" : "");
    } else if (!v.sites.empty()) {
      out << fmt::format("  resident by site, largest first ({}):\n",
                         plural(v.sites.size(), "site", "sites"));
    }
    print_sites(m, opt, out, v.sites, "objects");
    if (!v.asleep_sites.empty()) {
      out << fmt::format("  asleep: {} in {}, put to sleep at {}\n", human(v.asleep),
                         plural(v.asleep_count, "range", "ranges"),
                         plural(v.asleep_sites.size(), "site", "sites"));
      print_sites(m, opt, out, v.asleep_sites, "ranges");
    }
  }
}

}  // namespace cmg::report

// ---- JSON ----------------------------------------------------------------------------------

namespace cmg::report {
namespace {

using Json = nlohmann::ordered_json;

Json frames_json(const ResolvedStack &s) {
  if (!s.id) return nullptr;
  Json frames = Json::array();
  for (const Frame &f : s.frames) {
    Json j = {{"module", f.module.empty() ? Json(nullptr) : Json(f.module)},
              {"offset", hex(f.offset)}};
    if (!f.function.empty()) j["function"] = f.function;
    if (!f.file.empty()) {
      j["file"] = f.file;
      j["line"] = f.line;
    }
    if (f.inlined) j["inlined"] = true;
    frames.push_back(std::move(j));
  }
  return {{"id", *s.id}, {"missing", s.missing}, {"frames", std::move(frames)}};
}

Json sites_json(const Model &m, const std::vector<SiteView> &sites, std::size_t top) {
  Json out = Json::array();
  for (std::size_t i = 0; i < shown(sites.size(), top); ++i) {
    const SiteView &s = sites[i];
    out.push_back({{"bytes", s.bytes},
                   {"count", s.count},
                   {"kind", s.kind},
                   {"state", s.state},
                   {"devs", Json(std::vector<std::int64_t>(s.devs.begin(), s.devs.end()))},
                   {"graph", s.graph ? Json(s.graph) : Json(nullptr)},
                   {"creator", s.creator},
                   {"module", s.module},
                   {"python", s.python ? Json{{"file", s.python->file},
                                              {"function", s.python->function},
                                              {"line", s.python->line}}
                                       : Json(nullptr)},
                   {"stack", frames_json(m.stack(s.log, s.stack))}});
  }
  return out;
}

}  // namespace

Json snapshot_json(const Model &m, const ReportOptions &opt, const Snapshot &s) {
  const SnapView v = view_of(m, s);
  Json devices = Json::array();
  for (const TotalView &t : v.devices)
    devices.push_back({{"dev", t.dev},
                       {"kind", t.kind},
                       {"state", t.state},
                       {"bytes", t.bytes},
                       {"count", t.count}});
  Json creators = Json::array();
  for (const CreatorView &c : v.creators)
    creators.push_back({{"creator", c.creator}, {"bytes", c.bytes}, {"count", c.count}});
  Json run = nullptr;
  if (s.run)
    run = {{"what", s.run->what},     {"seq", s.run->seq},     {"tid", s.run->tid},
           {"ranges", s.run->ranges}, {"bytes", s.run->bytes}, {"failed", s.run->failed}};
  Json not_asleep = nullptr;
  if (after_sleep(s))
    not_asleep = {{"bytes", v.resident},
                  {"count", v.resident_count},
                  {"sites_total", v.sites.size()},
                  {"sites", sites_json(m, v.sites, opt.top)}};
  return {{"log", s.log},
          {"log_label", m.label(s.log)},
          {"id", s.id},
          {"label", s.label},
          {"trigger", s.trigger},
          {"after_seq", s.after_seq},
          {"t_ns", m.time(s.log, s.ts)},
          {"tid", s.tid},
          {"complete", s.ended && !s.incomplete},
          {"objects", s.objects},
          {"dur_ns", s.dur},
          {"asked_at", s.stack ? frames_json(m.stack(s.log, s.stack)) : Json(nullptr)},
          {"run", std::move(run)},
          {"resident_bytes", v.resident},
          {"resident_count", v.resident_count},
          {"asleep_bytes", v.asleep},
          {"asleep_count", v.asleep_count},
          {"by_device", std::move(devices)},
          {"by_creator", std::move(creators)},
          {"sites_total", v.sites.size()},
          {"sites", sites_json(m, v.sites, opt.top)},
          {"not_asleep", std::move(not_asleep)},
          {"asleep_sites", sites_json(m, v.asleep_sites, opt.top)}};
}

Json resident_json(const Model &m, const ReportOptions &opt) {
  Json snaps = Json::array();
  for (const Snapshot &s : m.resident.snapshots()) snaps.push_back(snapshot_json(m, opt, s));
  return {{"snapshots", std::move(snaps)},
          {"not_read", m.resident.dropped()},
          {"malformed", m.resident.malformed()}};
}

}  // namespace cmg::report

// ---- HTML: one chart per snapshot ------------------------------------------------------------

namespace cmg::report {
namespace {

void sites_html(const Model &m, const ReportOptions &opt, std::ostream &out,
                const std::vector<SiteView> &sites) {
  for (std::size_t i = 0; i < shown(sites.size(), opt.top); ++i) {
    const SiteView &x = sites[i];
    out << fmt::format(
        "<div class=\"group resident-site\"><b>{}</b> in {} {}: {} {} on {}, "
        "created by <code>{}</code>{}{}",
        html_escape(bytes_text(x.bytes)), x.count, x.count == 1 ? "object" : "objects",
        html_escape(x.kind), html_escape(x.state), html_escape(devs_text(x.devs)),
        html_escape(x.creator), html_escape(python_text(x)),
        x.graph ? fmt::format(", for a CUDA graph (capture {})", x.graph) : std::string());
    stack_html(out, m.stack(x.log, x.stack));
    out << "</div>\n";
  }
}

}  // namespace

// A bar chart of the snapshot as inline SVG (no script needed): one bar per creator of resident
// bytes, then one for what is asleep, widths to the largest.
void write_snapshot_chart(std::ostream &out, const Snapshot &s, const SnapView &v) {
  struct Bar {
    std::string name;
    std::int64_t bytes;
    const char *color;
  };
  std::vector<Bar> bars;
  for (const CreatorView &c : v.creators) bars.push_back({c.creator, c.bytes, "#3366cc"});
  if (v.asleep) bars.push_back({"asleep", v.asleep, "#9aa3b2"});
  if (bars.empty()) {
    out << "<div class=\"sub\">nothing resident, nothing asleep</div>";
    return;
  }
  std::int64_t most = 1;
  for (const Bar &b : bars) most = std::max(most, b.bytes);
  const int row = 22, label_w = 240, bar_w = 620, h = static_cast<int>(bars.size()) * row + 8;
  out << fmt::format(
      "<svg class=\"snapshot-chart\" data-snapshot=\"{}\" width=\"{}\" "
      "height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\">",
      s.id, label_w + bar_w + 120, h, label_w + bar_w + 120, h);
  for (std::size_t i = 0; i < bars.size(); ++i) {
    const Bar &b = bars[i];
    const int y = static_cast<int>(i) * row + 4;
    const double w =
        std::max(1.0, static_cast<double>(b.bytes) / static_cast<double>(most) * bar_w);
    out << fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\" font-size=\"12\">{}</text>",
                       label_w - 8, y + 14, html_escape(b.name));
    out << fmt::format(
        "<rect class=\"bar\" data-name=\"{}\" data-bytes=\"{}\" x=\"{}\" y=\"{}\" "
        "width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {}</title></rect>",
        html_escape(b.name), b.bytes, label_w, y, w, row - 6, b.color, html_escape(b.name),
        html_escape(bytes_text(b.bytes)));
    out << fmt::format("<text x=\"{:.1f}\" y=\"{}\" font-size=\"12\" fill=\"#5b6475\">{}</text>",
                       label_w + w + 6, y + 14, html_escape(human(b.bytes)));
  }
  out << "</svg>";
}

void write_resident_html(const Model &m, const ReportOptions &opt, std::ostream &out) {
  const auto &snaps = m.resident.snapshots();
  if (snaps.empty()) return;
  out << fmt::format("<h2 id=\"resident\">Resident: {} snapshot{}</h2>\n", snaps.size(),
                     snaps.size() == 1 ? "" : "s");
  for (const Snapshot &s : snaps) {
    const SnapView v = view_of(m, s);
    out << fmt::format(
        "<section class=\"snapshot\" data-trigger=\"{}\"><h3>{} #{} \"{}\" at {}"
        "</h3><div class=\"sub\">{}, resident {}, asleep {}</div>",
        html_escape(s.trigger), html_escape(m.label(s.log)), s.id, html_escape(s.label),
        fmt_time(m.time(s.log, s.ts)), html_escape(trigger_text(s)), html_escape(human(v.resident)),
        html_escape(human(v.asleep)));
    write_snapshot_chart(out, s, v);
    if (after_sleep(s))
      out << fmt::format("<div class=\"{}\">did not go to sleep: {}</div>",
                         v.resident ? "bad" : "ok", html_escape(bytes_text(v.resident)));
    sites_html(m, opt, out, v.sites);
    out << "</section>\n";
  }
}

}  // namespace cmg::report
