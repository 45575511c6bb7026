// SPDX-License-Identifier: Apache-2.0
// The text report: what a user reads first when a CUDA free crashed or a run reported findings.
#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "report_fmt.h"
#include "report_model.h"

namespace cmg::report {
namespace {

// Columns sized to their widest cell; numbers right-aligned.
struct Table {
  std::vector<std::string> head;
  std::vector<bool> right;
  std::vector<std::vector<std::string>> rows;

  void print(std::ostream &out, const std::string &indent) const {
    std::vector<std::size_t> w(head.size());
    for (std::size_t c = 0; c < head.size(); ++c) w[c] = head[c].size();
    for (const auto &r : rows)
      for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
    auto line = [&](const std::vector<std::string> &r) {
      std::string s = indent;
      for (std::size_t c = 0; c < r.size(); ++c) {
        if (c) s += "  ";
        s += right[c] ? fmt::format("{:>{}}", r[c], w[c]) : fmt::format("{:<{}}", r[c], w[c]);
      }
      while (!s.empty() && s.back() == ' ') s.pop_back();
      out << s << '\n';
    };
    line(head);
    for (const auto &r : rows) line(r);
  }
};

std::string join(const std::vector<std::string> &v, const char *sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

std::string plural(std::size_t n, const char *one, const char *many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// "in r0, r1" when the report covers several logs; nothing for a single log.
std::string where(const Model &m, const std::set<std::size_t> &logs) {
  if (m.logs.size() < 2) return {};
  std::vector<std::string> names;
  for (auto li : logs) names.push_back(m.label(li));
  return " in " + join(names, ", ");
}

std::string utc(std::int64_t unix_ns) {
  std::time_t secs = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return fmt::format("{}.{:09}Z", buf, unix_ns % 1'000'000'000);
}

void print_stack(std::ostream &out, const ResolvedStack &s, const std::string &indent) {
  if (!s.id) {
    out << indent << "(no stack recorded)\n";
    return;
  }
  if (s.missing) {
    out << indent << fmt::format("(stack {} is not in the log)\n", *s.id);
    return;
  }
  if (s.frames.empty()) out << indent << "(empty stack)\n";
  for (std::size_t i = 0; i < s.frames.size(); ++i)
    out << indent
        << fmt::format("#{} {}{}\n", i, frame_text(s.frames[i]),
                       s.frames[i].inlined ? " [inlined]" : "");
}

void write_logs(const Model &m, std::ostream &out) {
  out << fmt::format("== Logs: {}\n", m.logs.size());
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Log &l = m.logs[i];
    const Header &h = l.header;
    out << fmt::format("[{}] {}\n", m.label(i), l.file);
    out << fmt::format("    program  {}\n", h.argv.empty() ? "?" : join(h.argv, " "));
    out << fmt::format("    process  {}, parent {}{}\n", log_label(l), h.ppid,
                       h.host.empty() ? "" : ", on " + h.host);
    std::vector<std::string> opts;
    for (const auto &[k, v] : h.options) opts.push_back(k + "=" + v);
    out << fmt::format("    mode     {}{}\n", h.mode.empty() ? "?" : h.mode,
                       opts.empty() ? "" : " (" + join(opts, " ") + ")");
    out << fmt::format("    started  {} (report time {})\n", utc(h.start_unix_ns),
                       fmt_time(h.start_unix_ns - m.t0));
    out << fmt::format("    log      format {}, written by cumemguard {}, {}\n", h.format,
                       h.tool.empty() ? "?" : h.tool, plural(l.records, "record", "records"));
    if (l.truncated()) {
      std::vector<std::string> why;
      if (!l.end_ts) why.push_back("no end record");
      if (l.partial_last_line) why.push_back("the last line is cut off");
      out << fmt::format(
          "    status   TRUNCATED ({}): the process ended before the log did; the "
          "report covers what was written\n",
          join(why, ", "));
    } else {
      out << "    status   complete\n";
    }
    if (!l.unknown_kinds.empty()) {
      std::vector<std::string> kinds;
      std::size_t n = 0;
      for (const auto &[k, c] : l.unknown_kinds) {
        kinds.push_back(fmt::format("{} x{}", k, c));
        n += c;
      }
      out << fmt::format("    skipped  {} of kinds this reader does not know ({})\n",
                         plural(n, "record", "records"), join(kinds, ", "));
    }
    if (l.malformed)
      out << fmt::format("    skipped  {} that did not parse\n",
                         plural(l.malformed, "malformed line", "malformed lines"));
    for (const auto &c : l.configs)
      out << fmt::format("    config   {}: '{}' -> '{}' ({}){}\n", c.var, c.original, c.result,
                         c.applied ? "applied" : "not applied", c.msg.empty() ? "" : ": " + c.msg);
    for (const auto &n : l.notes)
      out << fmt::format("    note     {} at {}: {}\n", n.level, fmt_time(m.time(i, n.ts)), n.msg);
    for (const auto &w : m.symbolizers[i].warnings()) out << fmt::format("    symbols  {}\n", w);
  }
}

void write_findings(const Model &m, std::ostream &out) {
  std::size_t classes = 0;
  for (const auto &c : m.findings)
    if (c.count) ++classes;
  if (m.findings.empty()) {
    out << "\n== Findings: none\n";
    return;
  }
  out << fmt::format("\n== Findings: {} in {}\n", m.finding_count,
                     plural(classes, "class", "classes"));
  for (const auto &c : m.findings) {
    std::string exit_note;
    if (c.at_exit && *c.at_exit != static_cast<std::int64_t>(c.count))
      exit_note = fmt::format(" (the shim counted {} at exit)", *c.at_exit);
    out << fmt::format("\n{}: {} at {}{}\n", c.cls, plural(c.count, "finding", "findings"),
                       plural(c.groups.size(), "stack", "stacks"), exit_note);
    if (!c.help.empty()) out << fmt::format("  {}\n", c.help);
    for (std::size_t gi = 0; gi < c.groups.size(); ++gi) {
      const FindingGroup &g = c.groups[gi];
      std::vector<std::string> actions;
      for (const auto &[a, n] : g.actions) actions.push_back(fmt::format("{} x{}", a, n));
      out << fmt::format("  [{}] {}{}, first at {}, last at {}; action {}\n", gi + 1,
                         plural(g.count, "time", "times"), where(m, g.logs), fmt_time(g.first_t),
                         fmt_time(g.last_t), join(actions, ", "));
      if (g.count > 1 && (g.bytes || g.blocked_ns)) {
        std::vector<std::string> sums;
        if (g.bytes) sums.push_back(bytes_text(*g.bytes));
        if (g.blocked_ns) sums.push_back("blocked " + fmt_duration(*g.blocked_ns));
        out << fmt::format("      total    {}\n", join(sums, ", "));
      }
      const Event &e = m.event(g.example);
      const Finding &f = std::get<Finding>(e.body);
      out << fmt::format("      example  {} -> {}, action {}; {} tid {} seq {} at {}\n",
                         call_text(f.api, f.args), f.res, f.action.empty() ? "?" : f.action,
                         m.label(g.example.log), e.tid, e.seq, fmt_time(m.time(g.example)));
      if (!f.msg.empty()) out << fmt::format("      message  {}\n", f.msg);
      if (f.bytes) out << fmt::format("      bytes    {}\n", bytes_text(*f.bytes));
      if (f.blocked_ns) out << fmt::format("      blocked  {}\n", fmt_duration(*f.blocked_ns));
      if (!f.state.is_null()) out << fmt::format("      state    {}\n", compact(f.state));
      out << "      stack\n";
      print_stack(out, g.stack, "        ");
      for (const auto &r : f.related) {
        std::vector<std::string> parts;
        if (!r.api.empty()) parts.push_back(r.api);
        if (r.tid) parts.push_back(fmt::format("tid {}", *r.tid));
        if (r.seq) parts.push_back(fmt::format("seq {}", *r.seq));
        if (r.ts) parts.push_back(fmt::format("at {}", fmt_time(m.time(g.example.log, *r.ts))));
        out << fmt::format("      {}: {}\n", r.what.empty() ? "related" : r.what,
                           parts.empty() ? "(no details)" : join(parts, ", "));
        print_stack(out, m.stack(g.example.log, r.stack), "        ");
      }
    }
  }
}

std::size_t shown(std::size_t n, std::size_t top) {
  return top == 0 ? n : std::min(n, top);
}

void write_leaks(const Model &m, const ReportOptions &opt, std::ostream &out) {
  if (m.leaks.empty()) {
    // Leak records come last in a log: a log cut off before them says nothing about leaks.
    std::size_t cut = 0;
    for (const auto &l : m.logs)
      if (l.truncated()) ++cut;
    if (cut)
      out << fmt::format("\n== Leaks at exit: none recorded ({} cut off before its exit records)\n",
                         plural(cut, "log was", "logs were"));
    else
      out << "\n== Leaks at exit: none\n";
    return;
  }
  const std::size_t n = shown(m.leaks.size(), opt.top);
  out << fmt::format("\n== Leaks at exit: {}, {} at {}{}\n",
                     plural(m.leak_count, "object", "objects"), bytes_text(m.leak_bytes),
                     plural(m.leaks.size(), "stack", "stacks"),
                     n < m.leaks.size() ? fmt::format(" (top {} shown)", n) : "");
  for (std::size_t i = 0; i < n; ++i) {
    const LeakGroup &g = m.leaks[i];
    std::vector<std::string> what;
    for (const auto &[w, c] : g.what) what.push_back(fmt::format("{} x{}", w, c));
    out << fmt::format("  [{}] {} via {}, {}{}: {}\n", i + 1, plural(g.count, "object", "objects"),
                       g.api.empty() ? "?" : g.api, bytes_text(g.bytes), where(m, g.logs),
                       join(what, ", "));
    const Leak &l = m.logs[g.example.first].leaks[g.example.second];
    std::string seq = l.seq ? fmt::format(", allocated at seq {}", *l.seq) : "";
    out << fmt::format("      e.g. {} {} {} of {} bytes on dev {}{}\n", l.what,
                       l.object_field.empty() ? "object" : l.object_field,
                       l.object.empty() ? "?" : l.object, l.size, l.dev, seq);
    out << "      allocated at\n";
    print_stack(out, g.stack, "        ");
  }
}

void write_memory(const Model &m, std::ostream &out) {
  if (m.memory.empty()) {
    out << "\n== Memory: no tracked bytes\n";
    return;
  }
  out << "\n== Memory by device and kind (bytes; 'at exit' from the summary record)\n";
  Table t{{"log", "dev", "kind", "current", "peak", "peak at", "allocated", "freed", "exit current",
           "exit peak", "exit total"},
          {false, true, false, true, true, true, true, true, true, true, true},
          {}};
  for (const auto &r : m.memory) {
    auto num = [&](std::int64_t v) { return r.from_events ? fmt::format("{}", v) : "-"; };
    auto ex = [&](std::int64_t SummaryBytes::*f) {
      return r.at_exit ? fmt::format("{}", (*r.at_exit).*f) : "-";
    };
    t.rows.push_back({m.label(r.log), fmt::format("{}", r.dev), r.mem, num(r.current), num(r.peak),
                      r.from_events && r.peak ? fmt_time(r.peak_t) : "-", num(r.allocated),
                      num(r.freed), ex(&SummaryBytes::current), ex(&SummaryBytes::peak),
                      ex(&SummaryBytes::total)});
  }
  t.print(out, "  ");
}

void write_sites(const Model &m, const ReportOptions &opt, std::ostream &out) {
  if (m.sites.empty()) return;
  const std::size_t n = shown(m.sites.size(), opt.top);
  out << fmt::format("\n== Top allocation sites by bytes ({} of {})\n", n, m.sites.size());
  for (std::size_t i = 0; i < n; ++i) {
    const SiteRow &s = m.sites[i];
    out << fmt::format(
        "  [{}] {} in {} ({}){}\n", i + 1, bytes_text(s.bytes), plural(s.count, "call", "calls"),
        join(std::vector<std::string>(s.apis.begin(), s.apis.end()), ", "), where(m, s.logs));
    print_stack(out, s.stack, "        ");
  }
}

void write_calls(const Model &m, std::ostream &out) {
  if (m.calls.empty()) {
    out << "\n== Calls: none recorded\n";
    return;
  }
  out << "\n== Calls per API ('at exit' from the summary record)\n";
  Table t{{"api", "calls", "errors", "skipped", "deferred", "total time", "max time", "at exit"},
          {false, true, true, true, true, true, true, true},
          {}};
  for (const auto &c : m.calls)
    t.rows.push_back({c.api, fmt::format("{}", c.count), fmt::format("{}", c.errors),
                      fmt::format("{}", c.skipped), fmt::format("{}", c.deferred),
                      fmt_duration(c.dur_total), fmt_duration(c.dur_max),
                      c.at_exit ? fmt::format("{}", *c.at_exit) : "-"});
  t.print(out, "  ");
}

void write_nccl(const Model &m, std::ostream &out) {
  if (m.nccl.empty()) return;
  out << "\n== NCCL communicators\n";
  Table t{{"time", "log", "event", "api", "comm", "rank", "nranks", "dev", "res", "live", ""},
          {true, false, false, false, false, true, true, true, true, true, false},
          {}};
  auto opt = [](const std::optional<std::int64_t> &v) {
    return v ? fmt::format("{}", *v) : std::string("-");
  };
  for (const EventRef &r : m.nccl) {
    const Nccl &n = std::get<Nccl>(m.event(r).body);
    t.rows.push_back({fmt_time(m.time(r)), m.label(r.log), n.event, n.api, n.comm, opt(n.rank),
                      opt(n.nranks), opt(n.dev), fmt::format("{}", n.res), opt(n.live),
                      n.suppressed ? "opportunistic cleanup suppressed from here" : ""});
  }
  t.print(out, "  ");
  for (const CommRow &c : m.comms) {
    std::string life;
    if (c.created) {
      const Nccl &n = std::get<Nccl>(m.event(*c.created).body);
      life = fmt::format("created at {} by {}", fmt_time(m.time(*c.created)), n.api);
    } else {
      life = "created before the log shows";
    }
    if (c.finalized) life += fmt::format(", finalized at {}", fmt_time(m.time(*c.finalized)));
    if (c.ended) {
      const Nccl &n = std::get<Nccl>(m.event(*c.ended).body);
      life += fmt::format(", {} at {}", n.event == "abort" ? "aborted" : "destroyed",
                          fmt_time(m.time(*c.ended)));
    } else {
      life +=
          m.logs[c.log].truncated() ? ", live when the log was cut off" : ", still live at exit";
    }
    out << fmt::format("  communicator {} in {}: {}\n", c.comm.empty() ? "?" : c.comm,
                       m.label(c.log), life);
  }
}

void write_notes(const Model &m, const ReportOptions &opt, std::ostream &out) {
  std::vector<std::string> notes;
  for (const auto &l : m.logs)
    if (l.truncated())
      notes.push_back(
          fmt::format("{} was cut off (the process crashed or was killed): findings, "
                      "bytes and calls cover what it wrote; leaks, written at exit, "
                      "may be missing",
                      l.file));
  for (const auto &e : m.errors) notes.push_back(fmt::format("{}: not read: {}", e.file, e.error));
  if (m.leak_count && !opt.fail_on_leaks)
    notes.push_back("leaks do not change the exit status (use --fail-on-leaks to make them)");
  if (notes.empty()) return;
  out << "\n== Notes\n";
  for (const auto &n : notes) out << "  " << n << '\n';
}

}  // namespace

void write_text(const Model &m, const ReportOptions &opt, std::ostream &out) {
  out << fmt::format("cumemguard report: {}, {}, {}{}\n", plural(m.logs.size(), "log", "logs"),
                     plural(m.finding_count, "finding", "findings"),
                     plural(m.leak_count, "leak", "leaks"), m.truncated_any() ? ", TRUNCATED" : "");
  write_logs(m, out);
  write_findings(m, out);
  write_leaks(m, opt, out);
  write_memory(m, out);
  write_sites(m, opt, out);
  write_calls(m, out);
  write_nccl(m, out);
  write_notes(m, opt, out);
}

}  // namespace cmg::report
