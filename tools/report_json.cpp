// SPDX-License-Identifier: Apache-2.0
// The JSON report (docs/report-schema.md): the text report's content for scripts and CI gates.
#include <fmt/format.h>

#include "report_model.h"

namespace cmg::report {
namespace {

// Bump when a field changes meaning or goes away; adding fields keeps the version.
constexpr int kSchemaVersion = 1;

template <class T>
Json opt_json(const std::optional<T> &v) {
  return v ? Json(*v) : Json(nullptr);
}

Json stack_json(const ResolvedStack &s) {
  if (!s.id) return nullptr;
  Json frames = Json::array();
  for (const Frame &f : s.frames) {
    if (f.kind == Frame::Kind::Python) {
      frames.push_back({{"kind", "python"}, {"file", f.file}, {"function", f.function},
                        {"line", f.line}});
      continue;
    }
    if (f.kind == Frame::Kind::Marker) {
      frames.push_back({{"kind", "marker"}, {"python_end", f.function}});
      continue;
    }
    Json j = {{"kind", "native"},
              {"pc", hex(f.pc)},
              {"module", f.module.empty() ? Json(nullptr) : Json(f.module)},
              {"offset", hex(f.offset)}};
    if (!f.function.empty()) j["function"] = f.function;
    if (!f.file.empty()) {
      j["file"] = f.file;
      j["line"] = f.line;
    }
    if (f.inlined) j["inlined"] = true;
    frames.push_back(std::move(j));
  }
  return {{"log", s.log}, {"id", *s.id}, {"missing", s.missing}, {"frames", std::move(frames)}};
}

// A bounded JSON value from the reader (json_bounded.h: always valid JSON).
Json value_json(const std::string &text) {
  if (text.empty()) return nullptr;
  Json j = Json::parse(text, nullptr, false);
  return j.is_discarded() ? Json(text) : j;
}

Json error_point_json(const Model &m, std::size_t li, const ErrorPoint &p) {
  return {{"seq", p.seq},
          {"tid", p.tid},
          {"t_ns", p.t},
          {"api", p.error.api},
          {"res", p.error.res},
          {"name", p.error.name},
          {"sticky", p.error.sticky},
          {"stack", stack_json(m.stack(li, p.stack))}};
}

// How the process ended and what led there (docs/report-schema.md, Outcome).
Json outcome_json(const Model &m, std::size_t li) {
  const Outcome &o = m.outcomes[li];
  Json crash = nullptr;
  if (o.crash)
    crash = {{"tid", o.crash->tid},
             {"t_ns", m.time(li, o.crash->ts)},
             {"signal", o.crash->signal},
             {"signal_name", o.crash->signal_name},
             {"addr", o.crash->addr ? Json(hex(*o.crash->addr)) : Json(nullptr)},
             {"stack", stack_json(m.stack(li, o.crash->stack))}};
  Json errors = Json::array();
  for (const auto &e : o.errors) errors.push_back(error_point_json(m, li, e));
  // The calls and ranges explain a process that did not end well; others list none.
  Json lifecycle = Json::array();
  if (o.explain())
    for (const auto &l : o.lifecycle)
    lifecycle.push_back({{"seq", l.seq},
                         {"tid", l.tid},
                         {"t_ns", l.t},
                         {"api", l.api},
                         {"args", l.args},
                         {"res", l.res},
                         {"skipped", l.skipped},
                         {"stopped_by",
                          l.stopped_by.empty() ? Json(nullptr) : Json(l.stopped_by)}});
  Json asleep = Json::array();
  if (o.explain())
    for (const auto &a : o.asleep)
    asleep.push_back({{"ptr", hex(a.ptr)},
                      {"size", a.size},
                      {"reservation", hex(a.reservation)},
                      {"reservation_size", a.reservation_size},
                      {"unmap_seq", a.unmap_seq},
                      {"unmap_tid", a.unmap_tid},
                      {"unmap_stack", stack_json(m.stack(li, a.unmap_stack))}});
  return {{"status", status_name(o.status)},
          {"signal", o.signal ? Json(*o.signal) : Json(nullptr)},
          {"signal_name", o.signal_name.empty() ? Json(nullptr) : Json(o.signal_name)},
          {"explained", o.explain()},
          {"crash", std::move(crash)},
          {"first_sticky_error",
           o.first_sticky ? error_point_json(m, li, *o.first_sticky) : Json(nullptr)},
          {"cuda_errors", std::move(errors)},
          {"lifecycle_before", o.lifecycle_before_error ? "first_sticky_error"
                               : o.lifecycle_to_abort ? "abort"
                                                      : "end"},
          {"lifecycle", std::move(lifecycle)},
          {"asleep_total", o.explain() ? o.asleep_total : 0},
          {"asleep_at", o.asleep_at_error ? "first_sticky_error" : "end"},
          {"asleep", std::move(asleep)}};
}

Json logs_json(const std::set<std::size_t> &logs) {
  Json a = Json::array();
  for (auto l : logs) a.push_back(l);
  return a;
}

Json log_json(const Model &m, std::size_t i) {
  const Log &l = m.logs[i];
  const Header &h = l.header;
  Json options = Json::object();
  for (const auto &[k, v] : h.options) options[k] = v;
  Json unknown = Json::object();
  for (const auto &[k, n] : l.unknown_kinds) unknown[k] = n;
  Json configs = Json::array();
  for (const auto &c : l.configs)
    configs.push_back({{"var", c.var},
                       {"original", c.original},
                       {"result", c.result},
                       {"applied", c.applied},
                       {"msg", c.msg}});
  Json notes = Json::array();
  for (const auto &n : l.notes)
    notes.push_back({{"t_ns", m.time(i, n.ts)}, {"level", n.level}, {"msg", n.msg}});
  Json warnings = Json::array();
  for (const auto &w : m.symbolizer(i).warnings()) warnings.push_back(w);
  // The exporter's bridge exports and those no peer opened (null when it exported nothing).
  Json bridge = nullptr;
  if (l.summary && l.summary->bridge_count("exports"))
    bridge = {{"exports", l.summary->bridge_count("exports")},
              {"never_requested", l.summary->bridge_count("never_requested")},
              {"never_requested_bytes", l.summary->bridge_count("never_requested_bytes")}};
  // Every CUDA call failed with one status (null when not): nothing was checked in this process.
  Json all_failed = nullptr;
  if (const auto &a = m.outcomes[i].all_failed)
    all_failed = {{"calls", a->calls},
                  {"res", a->res},
                  {"name", a->name.empty() ? Json(nullptr) : Json(a->name)},
                  {"cause", a->cause.empty() ? Json(nullptr) : Json(a->cause)},
                  {"fake_cuda", a->fake_cuda.empty() ? Json(nullptr) : Json(a->fake_cuda)}};
  return {{"label", m.label(i)},
          {"file", l.file},
          {"format", h.format},
          {"tool", h.tool},
          {"pid", h.pid},
          {"ppid", h.ppid},
          {"rank", h.rank},
          {"host", h.host},
          {"start_unix_ns", h.start_unix_ns},
          {"start_offset_ns", h.start_unix_ns - m.t0},
          {"argv", h.argv},
          {"mode", h.mode},
          {"options", std::move(options)},
          {"status", status_name(l.status())},
          {"signal", l.end_signal ? Json(*l.end_signal) : Json(nullptr)},
          {"signal_name", l.end_signal_name.empty() ? Json(nullptr) : Json(l.end_signal_name)},
          {"truncated", l.truncated()},
          {"running", l.running && !l.end_ts},
          {"has_end", l.end_ts.has_value()},
          {"partial_last_line", l.partial_last_line},
          {"has_summary", l.summary.has_value()},
          {"bridge", bridge},
          {"every_call_failed", std::move(all_failed)},
          {"records", l.records},
          {"malformed_lines", l.malformed},
          {"unknown_kinds", std::move(unknown)},
          {"configs", std::move(configs)},
          {"notes", std::move(notes)},
          {"late_events", l.late},
          {"overlong_lines", l.overlong},
          {"symbol_warnings", std::move(warnings)},
          {"outcome", outcome_json(m, i)}};
}

Json finding_example(const Model &m, const Example &x) {
  const Event &e = x.event;
  const Finding &f = std::get<Finding>(e.body);
  Json related = Json::array();
  for (const auto &r : f.related) {
    related.push_back({{"what", r.what},
                       {"api", r.api},
                       {"seq", opt_json(r.seq)},
                       {"tid", opt_json(r.tid)},
                       {"t_ns", r.ts ? Json(m.time(x.log, *r.ts)) : Json(nullptr)},
                       {"stack", stack_json(m.stack(x.log, r.stack))}});
  }
  return {{"log", x.log},
          {"seq", e.seq},
          {"tid", e.tid},
          {"t_ns", m.time(x.log, e.ts)},
          {"api", f.api},
          {"args", value_json(f.args_json)},
          {"res", f.res},
          {"action", f.action},
          {"msg", f.msg},
          {"state", value_json(f.state_json)},
          {"bytes", opt_json(f.bytes)},
          {"blocked_ns", opt_json(f.blocked_ns)},
          {"related", std::move(related)}};
}

std::size_t limit(std::size_t n, std::size_t top) {
  return top == 0 ? n : std::min(n, top);
}

}  // namespace

Json report_json(const Model &m, const ReportOptions &opt) {
  m.resolve_shown(opt);
  Json logs = Json::array();
  for (std::size_t i = 0; i < m.logs.size(); ++i) logs.push_back(log_json(m, i));
  Json errors = Json::array();
  for (const auto &e : m.errors)
    errors.push_back({{"file", e.file}, {"error", e.error}, {"exit_status", e.exit_status}});

  Json classes = Json::array();
  for (const auto &c : m.findings) {
    Json groups = Json::array();
    for (const auto &g : c.groups) {
      Json actions = Json::object();
      for (const auto &[a, n] : g.actions) actions[a] = n;
      groups.push_back({{"count", g.count},
                        {"logs", logs_json(g.logs)},
                        {"first_t_ns", g.first_t},
                        {"last_t_ns", g.last_t},
                        {"actions", std::move(actions)},
                        {"bytes", opt_json(g.bytes)},
                        {"blocked_ns", opt_json(g.blocked_ns)},
                        {"stack", stack_json(m.stack(g.stack))},
                        {"example", finding_example(m, g.example)}});
    }
    classes.push_back({{"class", c.cls},
                       {"help", c.help},
                       {"count", c.count},
                       {"at_exit", opt_json(c.at_exit)},
                       {"groups", std::move(groups)}});
  }

  Json leak_groups = Json::array();
  for (std::size_t i = 0; i < limit(m.leaks.size(), opt.top); ++i) {
    const LeakGroup &g = m.leaks[i];
    const Leak &l = g.example;
    Json what = Json::object();
    for (const auto &[w, n] : g.what) what[w] = n;
    leak_groups.push_back({{"api", g.api},
                           {"count", g.count},
                           {"bytes", g.bytes},
                           {"what", std::move(what)},
                           {"logs", logs_json(g.logs)},
                           {"stack", stack_json(m.stack(g.stack))},
                           {"example",
                            {{"log", g.example_log},
                             {"what", l.what},
                             {"object_field", l.object_field},
                             {"object", l.object},
                             {"size", l.size},
                             {"dev", l.dev},
                             {"seq", opt_json(l.seq)}}}});
  }

  Json memory = Json::array();
  for (const auto &r : m.memory) {
    auto ev = [&](std::int64_t v) { return r.from_events ? Json(v) : Json(nullptr); };
    Json at_exit = nullptr;
    if (r.at_exit)
      at_exit = {
          {"current", r.at_exit->current}, {"peak", r.at_exit->peak}, {"total", r.at_exit->total}};
    memory.push_back({{"log", r.log},
                      {"dev", r.dev},
                      {"mem", r.mem},
                      {"current", ev(r.current)},
                      {"peak", ev(r.peak)},
                      {"peak_t_ns", r.from_events && r.peak ? Json(r.peak_t) : Json(nullptr)},
                      {"allocated", ev(r.allocated)},
                      {"freed", ev(r.freed)},
                      {"at_exit", std::move(at_exit)}});
  }

  Json sites = Json::array();
  for (std::size_t i = 0; i < limit(m.sites.size(), opt.top); ++i) {
    const SiteRow &s = m.sites[i];
    sites.push_back({{"bytes", s.bytes},
                     {"count", s.count},
                     {"apis", Json(std::vector<std::string>(s.apis.begin(), s.apis.end()))},
                     {"logs", logs_json(s.logs)},
                     {"stack", stack_json(m.stack(s.stack))}});
  }

  Json calls = Json::array();
  for (const auto &c : m.calls)
    calls.push_back({{"api", c.api},
                     {"count", c.count},
                     {"errors", c.errors},
                     {"skipped", c.skipped},
                     {"deferred", c.deferred},
                     {"dur_ns_total", c.dur_total},
                     {"dur_ns_max", c.dur_max},
                     {"at_exit", opt_json(c.at_exit)}});

  Json shim_releases = Json::array();
  for (const auto &r : m.shim_releases)
    shim_releases.push_back({{"from", r.from},
                             {"api", r.api},
                             {"count", r.count},
                             {"errors", r.errors},
                             {"bytes", r.bytes}});

  Json nccl_events = Json::array();
  for (const Example &x : m.nccl) {
    const Event &e = x.event;
    const Nccl &n = std::get<Nccl>(e.body);
    nccl_events.push_back({{"log", x.log},
                           {"t_ns", m.time(x.log, e.ts)},
                           {"seq", e.seq},
                           {"tid", e.tid},
                           {"event", n.event},
                           {"api", n.api},
                           {"comm", n.comm},
                           {"rank", opt_json(n.rank)},
                           {"nranks", opt_json(n.nranks)},
                           {"dev", opt_json(n.dev)},
                           {"res", n.res},
                           {"live", opt_json(n.live)},
                           {"suppressed", n.suppressed}});
  }
  Json comms = Json::array();
  for (const CommRow &c : m.comms) {
    auto t = [&](const std::optional<NcclPoint> &p) { return p ? Json(p->t) : Json(nullptr); };
    auto opt_t = [](const std::optional<std::int64_t> &v) { return v ? Json(*v) : Json(nullptr); };
    Json spans = Json::array();
    for (const SuspendedSpan &sp : c.suspended)
      spans.push_back({{"from_t_ns", sp.from},
                       {"to_t_ns", opt_t(sp.to)},
                       {"ranges", sp.ranges},
                       {"range_bytes", sp.range_bytes}});
    Json stats = Json::object();
    static const char *const kNames[] = {"suspendable_bytes", "suspended", "persistent_bytes",
                                         "total_bytes"};
    for (const auto &[stat, value] : c.mem_stats)
      stats[stat >= 0 && stat <= 3 ? kNames[stat] : std::to_string(stat)] = value;
    Json regs = Json::array();
    for (const RegRow &r : c.regs)
      regs.push_back({{"kind", r.window ? "window" : "registration"},
                      {"handle", r.handle},
                      {"buff", r.buff},
                      {"size", r.size},
                      {"t_ns", r.t},
                      {"seq", r.seq},
                      {"ended_t_ns", opt_t(r.ended)}});
    comms.push_back({{"log", c.log},
                     {"comm", c.comm},
                     {"created_t_ns", t(c.created)},
                     {"created_by", c.created ? Json(c.created->api) : Json(nullptr)},
                     {"finalized_t_ns", t(c.finalized)},
                     {"ended", c.ended ? Json(c.ended->event) : Json(nullptr)},
                     {"ended_t_ns", t(c.ended)},
                     {"live_at_end", !c.ended.has_value()},
                     {"revoked_t_ns", t(c.revoked)},
                     {"suspended", std::move(spans)},
                     {"mem_stats", std::move(stats)},
                     {"mem_stats_t_ns", opt_t(c.mem_stats_t)},
                     {"registrations", std::move(regs)},
                     {"registrations_made", c.regs_made},
                     {"windows_made", c.windows_made},
                     {"registrations_not_listed", c.regs_dropped},
                     {"events", c.events}});
  }
  Json rules = Json::array();
  for (const auto &r : m.suppressed)
    rules.push_back({{"class", r.cls},
                     {"pattern", r.pattern},
                     {"count", r.count},
                     {"at_exit", opt_json(r.at_exit)},
                     {"logs", logs_json(r.logs)}});
  Json duplicates = Json::array();
  for (const auto &d : m.duplicates) duplicates.push_back(d);

  return {{"schema_version", kSchemaVersion},
          {"exit_status", m.exit_status(opt)},
          {"t0_unix_ns", m.t0},
          {"truncated", m.truncated_any()},
          {"unreadable_records", m.unreadable_records()},
          {"logs", std::move(logs)},
          {"errors", std::move(errors)},
          {"duplicates", std::move(duplicates)},
          {"findings",
           {{"count", m.finding_count},
            {"not_checked", not_checked_count(m)},
            {"classes", std::move(classes)}}},
          {"suppressed", {{"count", m.suppressed_count}, {"rules", std::move(rules)}}},
          {"leaks",
           {{"count", m.leak_count},
            {"bytes", m.leak_bytes},
            {"groups_total", m.leaks.size()},
            {"groups", std::move(leak_groups)}}},
          {"memory", std::move(memory)},
          {"top_sites", {{"sites_total", m.sites.size()}, {"sites", std::move(sites)}}},
          {"calls", std::move(calls)},
          {"shim_releases", std::move(shim_releases)},
          {"resident", resident_json(m, opt)},
          {"nccl",
           {{"events", std::move(nccl_events)},
            {"events_not_listed", m.nccl_dropped},
            {"communicators", std::move(comms)}}}};
}

}  // namespace cmg::report
