// SPDX-License-Identifier: Apache-2.0
// The text report: what a user reads first when a CUDA free crashed or a run reported findings.
// Every string from a log or a module was escaped where it entered the report (clean() in
// logreader.h), so nothing here can reach the terminal as a control sequence.
#include <algorithm>
#include <ctime>

#include <fmt/format.h>

#include "options.h"
#include "program_frame.h"
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

// "complete", "crashed (SIGSEGV)", "aborted (strict mode)", "truncated (no end record): ..."
std::string status_text(const Log &l) {
  switch (l.status()) {
    case Status::Complete:
      return l.partial_last_line ? "complete (the last line is cut off)" : "complete";
    case Status::Crashed:
      return fmt::format("crashed ({})", l.end_signal_name.empty()
                                             ? fmt::format("signal {}", *l.end_signal)
                                             : l.end_signal_name);
    case Status::Aborted:
      return "aborted (strict mode stopped the process at a finding)";
    case Status::Truncated: {
      if (l.running)
        return fmt::format(
            "still running (no end record yet): pid {} is alive on this host; the report covers "
            "what was written so far",
            l.header.pid);
      return fmt::format(
          "ended without its end record (killed?){}: the report covers what was written",
          l.partial_last_line ? ", the last line cut off" : "");
    }
  }
  return "?";
}

// A variable the launcher or the shim set for itself (CUMEMGUARD_RUN_ID, CUMEMGUARD_STATUS_DIR):
// the header shows what the user set.
bool internal_option(std::string_view var) {
  if (!has_option_prefix(var)) return false;
  for (const OptionSpec &sp : option_specs())
    if (sp.internal && var.substr(kOptionPrefix.size()) == sp.name) return true;
  return false;
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
    for (const auto &[k, v] : h.options)
      if (!internal_option(k)) opts.push_back(k + "=" + v);
    out << fmt::format("    mode     {}{}\n", h.mode.empty() ? "?" : h.mode,
                       opts.empty() ? "" : " (" + join(opts, " ") + ")");
    out << fmt::format("    started  {} (report time {})\n", utc(h.start_unix_ns),
                       fmt_time(h.start_unix_ns - m.t0));
    out << fmt::format("    log      format {}, written by cumemguard {}, {}\n", h.format,
                       h.tool.empty() ? "?" : h.tool, plural(l.records, "record", "records"));
    out << fmt::format("    status   {}\n", status_text(l));
    if (l.summary && l.summary->bridge_count("exports")) {
      const auto &sm = *l.summary;
      const std::int64_t never = sm.bridge_count("never_requested");
      out << fmt::format("    bridge   {}{}\n", plural(sm.bridge_count("exports"), "export", "exports"),
                         never ? fmt::format(", {} never requested ({} bytes): a bridge handle opens "
                                             "only in a process under the shim, so the peer ran "
                                             "without it or never tried",
                                             never, sm.bridge_count("never_requested_bytes"))
                               : std::string(", every one requested by a peer"));
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
      out << fmt::format("    skipped  {} that did not parse{}\n",
                         plural(l.malformed, "malformed line", "malformed lines"),
                         l.overlong ? fmt::format(" ({} over {} MiB)", l.overlong, kMaxLine >> 20)
                                    : std::string());
    if (l.late)
      out << fmt::format("    order    {} came more than {} events late and were taken where read\n",
                         plural(l.late, "event", "events"), kReorderWindow);
    if (l.dropped)
      out << fmt::format("    skipped  {} past the first {} of their kind (notes, configs, modules)\n",
                         plural(l.dropped, "record", "records"), kMaxListed);
    for (const auto &c : l.configs)
      out << fmt::format("    config   {}: '{}' -> '{}' ({}){}\n", c.var, c.original, c.result,
                         c.applied ? "applied" : "not applied", c.msg.empty() ? "" : ": " + c.msg);
    for (const auto &n : l.notes)
      out << fmt::format("    note     {} at {}: {}\n", n.level, fmt_time(m.time(i, n.ts)), n.msg);
    for (const auto &w : m.symbolizer(i).warnings()) out << fmt::format("    symbols  {}\n", w);
  }
}

// The leak records of processes strict mode stopped: what they held when the abort came (the
// shim writes them as it aborts), not memory a finished program forgot.
std::size_t leaks_at_abort(const Model &m) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < m.logs.size() && i < m.log_leaks.size(); ++i)
    if (m.outcomes[i].status == Status::Aborted) n += m.log_leaks[i].first;
  return n;
}

// "2 leaks at exit", "1 leak live at the abort", "5 leaks at exit (2 live at the abort)".
std::string leaks_text(const Model &m) {
  const std::size_t aborted = leaks_at_abort(m);
  const std::string n = plural(m.leak_count, "leak", "leaks");
  if (aborted == 0) return n + " at exit";
  if (aborted == m.leak_count) return n + " live at the abort";
  return fmt::format("{} at exit ({} live at the abort)", n, aborted);
}

// The findings by class, leaks apart: the counts of the model (m.finding_count, m.leak_count)
// that the JSON report, the HTML page, the exit status and the exit summary give too ("findings:
// double-free 1" and "leaks: 1 (live at exit)"), so no output counts a leak as a finding.
std::vector<std::string> finding_classes(const Model &m) {
  std::vector<std::string> classes;
  for (const auto &c : m.findings)
    if (c.cls != "leak" && c.count) classes.push_back(fmt::format("{} {}", c.cls, c.count));
  return classes;
}

void write_findings(const Model &m, const ReportOptions &opt, std::ostream &out) {
  const std::vector<std::string> classes = finding_classes(m);
  const std::string leaks = m.leak_count ? "; " + leaks_text(m) + ": see Leaks at exit" : "";
  if (m.finding_count == 0) {
    // "none" is not a clean run when nothing was checked, or when the shim counted findings whose
    // records cannot be read.
    const std::vector<std::string> counted = m.counted_not_read();
    std::string why;
    if (!counted.empty())
      why = fmt::format(" in the records (the shim counted {})", join(counted, ", "));
    if (not_checked_count(m)) why += " (" + not_checked_text(m) + ": see What happened)";
    out << "\n== Findings: none" << why << leaks << "\n";
    if (m.findings.empty()) return;
  } else {
    out << fmt::format("\n== Findings: {} in {} ({}){}\n", m.finding_count,
                       plural(classes.size(), "class", "classes"), join(classes, ", "), leaks);
  }
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
      const Event &e = g.example.event;
      const Finding &f = g.finding();
      out << fmt::format("      example  {} -> {}, action {}; {} tid {} seq {} at {}\n",
                         call_text(f.api, f.args), f.res, f.action.empty() ? "?" : f.action,
                         m.label(g.example.log), e.tid, e.seq,
                         fmt_time(m.time(g.example.log, e.ts)));
      if (!f.msg.empty()) out << fmt::format("      message  {}\n", f.msg);
      if (f.bytes) out << fmt::format("      bytes    {}\n", bytes_text(*f.bytes));
      if (f.blocked_ns) out << fmt::format("      blocked  {}\n", fmt_duration(*f.blocked_ns));
      if (!f.state_json.empty()) out << fmt::format("      state    {}\n", f.state_json);
      out << "      stack\n";
      print_stack(out, m.stack(g.stack), "        ", opt.full_stacks);
      for (const auto &r : f.related) {
        std::vector<std::string> parts;
        if (!r.api.empty()) parts.push_back(r.api);
        if (r.tid) parts.push_back(fmt::format("tid {}", *r.tid));
        if (r.seq) parts.push_back(fmt::format("seq {}", *r.seq));
        if (r.ts) parts.push_back(fmt::format("at {}", fmt_time(m.time(g.example.log, *r.ts))));
        out << fmt::format("      {}: {}\n", r.what.empty() ? "related" : r.what,
                           parts.empty() ? "(no details)" : join(parts, ", "));
        print_stack(out, m.stack(g.example.log, r.stack), "        ", opt.full_stacks);
      }
    }
  }
}

std::size_t shown(std::size_t n, std::size_t top) {
  return top == 0 ? n : std::min(n, top);
}

// "dev 0 linear 1048576 bytes (1.0 MiB), dev - host 4096 bytes (4.0 KiB)": what the records of
// log `li` still hold at their end.
std::string live_at_end(const Model &m, std::size_t li) {
  std::vector<std::string> parts;
  for (const auto &r : m.memory)
    if (r.log == li && r.from_events && r.current != 0)
      parts.push_back(fmt::format("dev {} {} {}", dev_text(r.dev), r.mem, bytes_text(r.current)));
  return parts.empty() ? "no tracked bytes" : join(parts, ", ");
}

void write_leaks(const Model &m, const ReportOptions &opt, std::ostream &out) {
  // A process that crashed, aborted or was cut off wrote no leak records: what it held at exit
  // is not known, and "none" would be a claim the log cannot support.
  // Strict mode's abort writes what is live as it aborts: known, and said so below.
  // A process that ended by _exit() made no leak check either (the shim's writer there reads no
  // model: _exit may be called from a signal handler).
  std::vector<std::size_t> unknown, aborted;
  std::size_t quick = 0;
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const bool wrote = i < m.log_leaks.size() && m.log_leaks[i].first > 0;
    if (m.outcomes[i].status == Status::Aborted && wrote)
      aborted.push_back(i);
    else if (m.outcomes[i].status != Status::Complete || m.outcomes[i].quick_exit)
      unknown.push_back(i);
    quick += m.outcomes[i].quick_exit ? 1 : 0;
  }
  const std::string why = quick && quick == unknown.size()
                              ? "not known: the process ended with _exit (no leak check)"
                              : "not known: the process did not exit normally";
  if (m.leaks.empty() && !unknown.empty()) {
    if (m.logs.size() == 1) {
      out << "\n== Leaks at exit: " << why << "\n";
      out << fmt::format("  live at the end of the log: {}\n", live_at_end(m, 0));
    } else {
      out << fmt::format("\n== Leaks at exit: none recorded; {} for {}\n", why,
                         plural(unknown.size(), "log", "logs"));
    }
  } else if (m.leaks.empty()) {
    out << "\n== Leaks at exit: none\n";
  }
  if (m.leaks.empty() && (m.logs.size() == 1 || unknown.empty())) return;
  if (!m.leaks.empty()) {
    const std::size_t n = shown(m.leaks.size(), opt.top);
    out << fmt::format("\n== Leaks at exit: {}, {} at {}{}\n",
                       plural(m.leak_count, "object", "objects"), bytes_text(m.leak_bytes),
                       plural(m.leaks.size(), "stack", "stacks"),
                       n < m.leaks.size() ? fmt::format(" (top {} shown)", n) : "");
    for (std::size_t i = 0; i < n; ++i) {
      const LeakGroup &g = m.leaks[i];
      std::vector<std::string> what;
      for (const auto &[w, c] : g.what) what.push_back(fmt::format("{} x{}", w, c));
      out << fmt::format("  [{}] {} via {}, {}{}: {}\n", i + 1,
                         plural(g.count, "object", "objects"), g.api.empty() ? "?" : g.api,
                         bytes_text(g.bytes), where(m, g.logs), join(what, ", "));
      const Leak &l = g.example;
      std::string seq = l.seq ? fmt::format(", allocated at seq {}", *l.seq) : "";
      const std::string graph =
          l.capture ? fmt::format(", made for capture {} (the graph's)", *l.capture) : "";
      out << fmt::format("      e.g. {} {} {} of {} bytes on dev {}{}{}\n", l.what,
                         l.object_field.empty() ? "object" : l.object_field,
                         l.object.empty() ? "?" : l.object, l.size, dev_text(l.dev), seq, graph);
      out << "      allocated at\n";
      print_stack(out, m.stack(g.stack), "        ", opt.full_stacks);
    }
  }
  for (std::size_t li : aborted)
    out << fmt::format(
        "  {}: stopped by strict mode; live at the abort: {} ({}), listed as leaks as its exit "
        "summary lists them\n",
        m.label(li), plural(m.log_leaks[li].first, "object", "objects"),
        bytes_text(m.log_leaks[li].second));
  for (std::size_t li : unknown)
    out << fmt::format("  {}: {} (live at the end of the log: {})\n", m.label(li), why,
                       live_at_end(m, li));
}

// A row no byte ever went through (a release of a VMM handle on no device, say) says nothing.
bool idle_row(const MemoryRow &r) {
  const bool events_zero =
      !r.from_events || (r.current == 0 && r.peak == 0 && r.allocated == 0 && r.freed == 0);
  const bool exit_zero =
      !r.at_exit || (r.at_exit->current == 0 && r.at_exit->peak == 0 && r.at_exit->total == 0);
  return events_zero && exit_zero;
}

void write_memory(const Model &m, std::ostream &out) {
  const auto idle =
      static_cast<std::size_t>(std::count_if(m.memory.begin(), m.memory.end(), idle_row));
  if (idle == m.memory.size()) {
    out << "\n== Memory: no tracked bytes\n";
    return;
  }
  out << "\n== Memory by device and kind (bytes; 'at exit' from the summary record)\n";
  Table t{{"log", "dev", "kind", "current", "peak", "peak at", "allocated", "freed", "exit current",
           "exit peak", "exit total"},
          {false, true, false, true, true, true, true, true, true, true, true},
          {}};
  for (const auto &r : m.memory) {
    if (idle_row(r)) continue;
    auto num = [&](std::int64_t v) { return r.from_events ? fmt::format("{}", v) : "-"; };
    auto ex = [&](std::int64_t SummaryBytes::*f) {
      return r.at_exit ? fmt::format("{}", (*r.at_exit).*f) : "-";
    };
    t.rows.push_back({m.label(r.log), dev_text(r.dev), r.mem, num(r.current), num(r.peak),
                      r.from_events && r.peak ? fmt_time(r.peak_t) : "-", num(r.allocated),
                      num(r.freed), ex(&SummaryBytes::current), ex(&SummaryBytes::peak),
                      ex(&SummaryBytes::total)});
  }
  t.print(out, "  ");
  if (idle)
    out << fmt::format("  ({} with no bytes at any time not shown)\n", plural(idle, "row", "rows"));
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
    print_stack(out, m.stack(s.stack), "        ", opt.full_stacks);
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
  // Not the program's calls: the shim handing held frees to the driver (what the summary calls
  // "frees released from" the quarantine).
  for (const auto &r : m.shim_releases)
    out << fmt::format(
        "  + {} {} by the shim, releasing {} from its {}{}: not calls of the program\n", r.count,
        r.api, bytes_text(r.bytes), r.from == "deferred" ? "deferred frees" : r.from,
        r.errors ? fmt::format(" ({} failed)", r.errors) : std::string());
}

// What a communicator held: its suspended intervals (with NCCL's ranges put to sleep), its
// memory statistics as NCCL last answered them, and its registrations and windows.
void write_comm_holdings(const Model &m, const CommRow &c, std::ostream &out) {
  if (!c.suspended.empty()) {
    std::string spans;
    for (const SuspendedSpan &sp : c.suspended) {
      if (!spans.empty()) spans += ", ";
      spans += fmt_time(sp.from) + " .. ";
      spans += sp.to ? fmt::format("{} ({})", fmt_time(*sp.to), fmt_duration(*sp.to - sp.from))
                     : std::string(m.logs[c.log].truncated() ? "the log's end" : "exit");
      if (sp.ranges)
        spans += fmt::format(" [{} asleep: {}]", plural(sp.ranges, "range", "ranges"),
                             human_bytes(static_cast<std::int64_t>(sp.range_bytes)));
    }
    out << "    suspended " << spans << "\n";
  }
  if (!c.mem_stats.empty()) {
    static const char *const kNames[] = {"suspendable", "suspended", "persistent", "total"};
    std::string stats;
    for (const auto &[stat, value] : c.mem_stats) {
      if (!stats.empty()) stats += ", ";
      if (stat == 1)
        stats += fmt::format("suspended {}", value ? "yes" : "no");
      else if (stat >= 0 && stat <= 3)
        stats += fmt::format("{} {}", kNames[stat], human_bytes(static_cast<std::int64_t>(value)));
      else
        stats += fmt::format("stat {} = {}", stat, value);
    }
    out << fmt::format("    memory (ncclCommMemStats at {}): {}\n",
                       fmt_time(c.mem_stats_t.value_or(0)), stats);
  }
  if (c.regs_made || c.windows_made) {
    std::size_t open = 0;
    for (const RegRow &r : c.regs) open += !r.ended;
    out << fmt::format("    {} and {}, {} open at the end\n",
                       plural(c.regs_made, "registration", "registrations"),
                       plural(c.windows_made, "window", "windows"), open);
    for (const RegRow &r : c.regs)
      out << fmt::format("      {} {} of {} (+{} bytes) at {} (seq {}){}\n",
                         r.window ? "window" : "registration", r.handle, r.buff, r.size,
                         fmt_time(r.t), r.seq,
                         r.ended ? fmt::format(", until {}", fmt_time(*r.ended)) : ", open");
    if (c.regs_dropped) out << fmt::format("      ({} more not listed)\n", c.regs_dropped);
  }
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
  for (const Example &x : m.nccl) {
    const Nccl &n = std::get<Nccl>(x.event.body);
    t.rows.push_back({fmt_time(m.time(x.log, x.event.ts)), m.label(x.log), n.event, n.api, n.comm,
                      opt(n.rank), opt(n.nranks), opt(n.dev), fmt::format("{}", n.res),
                      opt(n.live),
                      n.suppressed ? "opportunistic cleanup suppressed from here" : ""});
  }
  t.print(out, "  ");
  if (m.nccl_dropped)
    out << fmt::format("  ({} more not listed)\n", plural(m.nccl_dropped, "event", "events"));
  for (const CommRow &c : m.comms) {
    std::string life;
    if (c.created) {
      life = fmt::format("created at {} by {}", fmt_time(c.created->t), c.created->api);
    } else {
      life = "created before the log shows";
    }
    if (c.revoked) life += fmt::format(", revoked at {}", fmt_time(c.revoked->t));
    if (c.finalized) life += fmt::format(", finalized at {}", fmt_time(c.finalized->t));
    if (c.ended) {
      life += fmt::format(", {} at {}", c.ended->event == "abort" ? "aborted" : "destroyed",
                          fmt_time(c.ended->t));
    } else {
      life +=
          m.logs[c.log].truncated() ? ", live when the log was cut off" : ", still live at exit";
    }
    out << fmt::format("  communicator {} in {}: {}\n", c.comm.empty() ? "?" : c.comm,
                       m.label(c.log), life);
    write_comm_holdings(m, c, out);
  }
}

void write_notes(const Model &m, const ReportOptions &opt, std::ostream &out) {
  std::vector<std::string> notes;
  for (const auto &l : m.logs)
    if (l.truncated())
      notes.push_back(
          fmt::format("{} was cut off (the process crashed or was killed): findings, "
                      "bytes and calls cover what it wrote; leaks, written at exit, "
                      "are not known",
                      l.file));
  for (const auto &e : m.errors) notes.push_back(fmt::format("{}: not read: {}", e.file, e.error));
  for (const auto &d : m.duplicates) notes.push_back(d);
  if (m.suppressed_count)
    notes.push_back("suppressed findings do not change the exit status");
  if (m.leak_count && !opt.fail_on_leaks)
    notes.push_back("leaks do not change the exit status (use --fail-on-leaks to make them)");
  if (notes.empty()) return;
  out << "\n== Notes\n";
  for (const auto &n : notes) out << "  " << n << '\n';
}


std::string error_text(const ErrorPoint &p) {
  return fmt::format("{} ({}) at {} seq {} in thread {}", p.error.res,
                     p.error.name.empty() ? "?" : p.error.name, p.error.api, p.seq, p.tid);
}

// Leads the report for every process that did not exit normally or whose context a sticky CUDA
// error poisoned: the signal and the faulting stack, the first CUDA error and its call's stack,
// the frees and unmaps just before, and what was asleep at the end.
void write_outcomes(const Model &m, const ReportOptions &opt, std::ostream &out) {
  bool any = false;
  for (const auto &o : m.outcomes) any = any || o.explain();
  if (!any) return;
  out << "== What happened\n";
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Outcome &o = m.outcomes[i];
    if (!o.explain()) continue;
    const std::string sig =
        o.signal_name.empty() ? (o.signal ? fmt::format("signal {}", *o.signal) : std::string("?"))
                              : o.signal_name;
    out << fmt::format("[{}] {}\n", m.label(i), m.logs[i].file);
    if (o.crash) {
      out << fmt::format("  killed by {} in thread {} at\n", sig, o.crash->tid);
      print_stack(out, m.stack(i, o.crash->stack), "    ", opt.full_stacks);
      if (o.crash->addr) out << fmt::format("  fault address {}\n", hex(*o.crash->addr));
    } else if (o.status == Status::Crashed) {
      out << fmt::format(
          "  killed by {} (the log has no crash record: the faulting thread and its stack are "
          "not known)\n",
          sig);
    }
    if (o.all_failed)
      out << fmt::format("  nothing was checked: {}\n", all_failed_long(*o.all_failed));
    if (o.status == Status::Aborted)
      out << "  aborted: strict mode stopped the process at a finding (see Findings)\n";
    if (o.status == Status::Truncated && o.running)
      out << "  still running: the log has no end record yet (its process is alive on this "
             "host)\n";
    else if (o.status == Status::Truncated)
      out << "  the log ends without an end record: the process was killed (SIGKILL, out of "
             "memory, a time limit), ended by the exit_group system call itself, or the log "
             "was cut off\n";
    const ErrorPoint *first = o.first_sticky ? &*o.first_sticky
                              : o.errors.empty() ? nullptr
                                                 : &o.errors.front();
    if (first) {
      out << fmt::format("  first CUDA error {}{}\n", error_text(*first),
                         first->error.sticky ? ""
                                             : " (not sticky: the context stays usable)");
      print_stack(out, m.stack(i, first->stack), "    ", opt.full_stacks);
      std::vector<std::string> others;
      for (const auto &e : o.errors)
        if (e.seq != first->seq || e.error.res != first->error.res) others.push_back(error_text(e));
      if (!others.empty())
        out << fmt::format("  other CUDA errors (first of each): {}\n", join(others, "; "));
    }
    if (!o.lifecycle.empty()) {
      out << fmt::format("  memory lifecycle calls {} (last {}):\n",
                         o.lifecycle_before_error ? "before the first sticky CUDA error"
                         : o.lifecycle_to_abort   ? "up to strict mode's abort"
                                                  : "before the end of the log",
                         o.lifecycle.size());
      for (const auto &l : o.lifecycle) {
        if (!l.stopped_by.empty()) {
          out << fmt::format("    seq {} thread {} at {}: {}: stopped ({}), not passed to CUDA\n",
                             l.seq, l.tid, fmt_time(l.t), call_text(l.api, l.args), l.stopped_by);
          continue;
        }
        out << fmt::format("    seq {} thread {} at {}: {} -> {}{}\n", l.seq, l.tid, fmt_time(l.t),
                           call_text(l.api, l.args), l.res, l.skipped ? " (skipped)" : "");
      }
    }
    if (!o.asleep.empty()) {
      out << fmt::format(
          "  VMM ranges asleep {} (mapped, then unmapped; reservation not freed): {}\n",
          o.asleep_at_error ? "when the first sticky CUDA error was returned"
                            : "at the end of the log",
          o.asleep_total);
      for (const auto &a : o.asleep)
        out << fmt::format(
            "    {} +{} bytes in reservation {} ({} bytes), unmapped at seq {} by thread {}\n",
            hex(a.ptr), a.size, hex(a.reservation), a.reservation_size, a.unmap_seq, a.unmap_tid);
      out << fmt::format("  the last sleep (unmap at seq {}) was called from\n",
                         o.asleep.front().unmap_seq);
      print_stack(out, m.stack(i, o.asleep.front().unmap_stack), "    ", opt.full_stacks);
      if (o.asleep_total > o.asleep.size())
        out << fmt::format("    ({} more)\n", o.asleep_total - o.asleep.size());
    }
  }
  out << "\n";
}

void write_suppressed(const Model &m, std::ostream &out) {
  if (m.suppressed.empty()) return;
  out << fmt::format("\n== Suppressed: {} by {}\n",
                     plural(m.suppressed_count, "finding", "findings"),
                     plural(m.suppressed.size(), "rule", "rules"));
  for (const auto &r : m.suppressed) {
    std::string exit_note;
    if (r.at_exit && *r.at_exit != static_cast<std::int64_t>(r.count))
      exit_note = fmt::format(" (the shim counted {} at exit)", *r.at_exit);
    out << fmt::format("  {}:{}  {}{}{}\n", r.cls, r.pattern, plural(r.count, "finding", "findings"),
                       where(m, r.logs), exit_note);
  }
}

}  // namespace

void print_stack(std::ostream &out, const ResolvedStack &s, const std::string &indent, bool full) {
  if (!s.id) {
    out << indent << "(no stack recorded)\n";
    return;
  }
  if (s.missing) {
    out << indent << fmt::format("(stack {} is not in the log)\n", *s.id);
    return;
  }
  if (s.frames.empty()) out << indent << "(empty stack)\n";
  auto line = [&](std::size_t i) {
    out << indent
        << fmt::format("#{} {}{}\n", i, frame_text(s.frames[i]),
                       s.frames[i].inlined ? " [inlined]" : "");
  };
  if (full) {
    for (std::size_t i = 0; i < s.frames.size(); ++i) line(i);
    return;
  }
  // Frames below main (__libc_start_call_main, __libc_start_main, _start) are the same in every
  // stack of a program: not printed, as valgrind's --show-below-main=no does (JSON, the trace and
  // the HTML page keep them). A thread's stack has no main and is printed whole. Only the native
  // main ends it: a Python function named main is a frame of the program's, above <module>.
  std::size_t end = s.frames.size();
  for (std::size_t i = 0; i < s.frames.size(); ++i)
    if (s.frames[i].kind == Frame::Kind::Native && s.frames[i].function == "main" &&
        !s.frames[i].inlined) {
      end = i + 1;
      break;
    }
  // Below the outermost Python frame (<module>, or a thread's run) the native frames are the
  // interpreter's start-up and eval loop (Py_BytesMain, pymain_*, PyRun_*, _PyEval_*), a dozen or
  // more the same in every stack of the program: one line says how many (--full-stacks prints
  // them; JSON, the trace and the HTML page keep them). The Python frames are all printed.
  std::size_t outermost = s.frames.size();
  for (std::size_t i = 0; i < end; ++i)
    if (s.frames[i].kind == Frame::Kind::Python) outermost = i;
  // Above the innermost Python frame, the interpreter's own call into C (_PyObject_MakeTpCall,
  // ctypes' PyCFuncPtr_call and _ctypes_callproc, libffi's ffi_call): a ctypes program's stack
  // began with seven of them before its own line. Folded the same way; the frames of an extension
  // (libtorch_python, c10) above them are printed.
  std::size_t inner = end;
  for (std::size_t i = 0; i < end; ++i)
    if (s.frames[i].kind == Frame::Kind::Python) {
      inner = i;
      break;
    }
  std::size_t call_from = inner;
  while (inner < end && call_from > 0 && s.frames[call_from - 1].kind == Frame::Kind::Native &&
         interpreter_call_module(s.frames[call_from - 1].module))
    --call_from;
  if (inner - call_from < 2) call_from = inner;  // one line for one frame: no fold
  std::size_t fold_from = end, fold_to = end;  // [fold_from, fold_to): folded native frames
  if (outermost < end) {
    fold_from = outermost + 1;
    while (fold_from < end && s.frames[fold_from].kind == Frame::Kind::Marker) ++fold_from;
    fold_to = fold_from;
    while (fold_to < end && s.frames[fold_to].kind == Frame::Kind::Native) ++fold_to;
    if (fold_to - fold_from < 2) fold_from = fold_to = end;  // one line for one frame: no fold
  }
  for (std::size_t i = 0; i < end; ++i) {
    if (i == call_from && call_from < inner) {
      out << indent
          << fmt::format("... {} interpreter frames calling into C (--full-stacks to show)\n",
                         inner - call_from);
      i = inner - 1;
      continue;
    }
    if (i == fold_from) {
      out << indent
          << fmt::format("... {} interpreter frames (--full-stacks to show)\n",
                         fold_to - fold_from);
      i = fold_to - 1;
      continue;
    }
    line(i);
  }
}

void write_headline(const Model &m, std::ostream &out) {
  std::string state;
  for (const auto &o : m.outcomes) {
    const char *word = o.status == Status::Crashed                  ? ", CRASHED"
                       : o.status == Status::Aborted                ? ", ABORTED"
                       : o.status == Status::Truncated && o.running ? ", STILL RUNNING"
                       : o.status == Status::Truncated              ? ", TRUNCATED"
                                                                    : "";
    if (*word && state.find(word) == std::string::npos) state += word;
  }
  const std::vector<std::string> classes = finding_classes(m);
  const std::vector<std::string> counted = m.counted_not_read();
  const std::string unchecked = not_checked_text(m);
  std::string findings =
      m.finding_count > 0 ? fmt::format("{} ({})", plural(m.finding_count, "finding", "findings"),
                                        join(classes, ", "))
      // The exit status counts what the shim counted at exit: "no findings" beside status 1
      // told two stories.
      : !counted.empty()
          ? fmt::format("no finding records (the shim counted {})", join(counted, ", "))
      // A run in which no CUDA call worked was not checked: "no findings" read as a clean one.
      : !unchecked.empty() && not_checked_count(m) == m.logs.size() ? unchecked
                                                                    : std::string("no findings");
  if (!unchecked.empty() && findings != unchecked) findings += "; " + unchecked;
  if (m.leak_count) findings += ", " + leaks_text(m);
  else if (!m.leaks_known()) findings += "; leaks not known";
  if (const std::size_t n = m.unreadable_records())
    findings +=
        fmt::format("; {} unreadable (see Logs): not clean", plural(n, "record", "records"));
  out << fmt::format("cumemguard report: {}, {}{}\n", plural(m.logs.size(), "log", "logs"),
                     findings, state);
}

void write_text(const Model &m, const ReportOptions &opt, std::ostream &out) {
  m.resolve_shown(opt);
  write_headline(m, out);
  write_outcomes(m, opt, out);
  write_logs(m, out);
  write_findings(m, opt, out);
  write_suppressed(m, out);
  write_leaks(m, opt, out);
  write_resident_text(m, opt, out);
  write_memory(m, out);
  write_sites(m, opt, out);
  write_calls(m, out);
  write_nccl(m, out);
  write_notes(m, opt, out);
}

}  // namespace cmg::report
