// SPDX-License-Identifier: Apache-2.0
// Chrome trace-event JSON for Perfetto / chrome://tracing: one process track per log, byte counters
// per device and memory kind, instants for findings, deferred frees and NCCL, slow calls as slices.
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "report_fmt.h"
#include "report_model.h"

namespace cmg::report {
namespace {

// Linux pids stay below 2^22 (PID_MAX_LIMIT); logs whose pid repeats (ranks on different hosts)
// get a track id above that range so their tracks do not merge.
constexpr std::int64_t kSyntheticPidBase = (std::int64_t{1} << 22) + 1;

// The trace-event format counts in microseconds; fractions keep the log's nanoseconds.
double us(std::int64_t ns) {
  return static_cast<double>(ns) / 1000.0;
}

std::string counter_name(std::int64_t dev, const std::string &mem) {
  return dev < 0 ? fmt::format("bytes {} (no device)", mem)
                 : fmt::format("bytes {} dev{}", mem, dev);
}

Json instant(const std::string &name, const char *cat, double ts, std::int64_t pid,
             std::int64_t tid, const char *scope, Json args) {
  return {{"name", name}, {"cat", cat}, {"ph", "i"},  {"ts", ts},
          {"pid", pid},   {"tid", tid}, {"s", scope}, {"args", std::move(args)}};
}

Json metadata(const char *name, std::int64_t pid, std::int64_t tid, Json args) {
  return {{"name", name}, {"ph", "M"},  {"ts", 0},
          {"pid", pid},   {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

Json trace_json(const Model &m, const ReportOptions &opt) {
  Json events = Json::array();

  std::vector<std::int64_t> pids;
  std::set<std::int64_t> used;
  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    std::int64_t pid = m.logs[i].header.pid;
    if (pid <= 0 || used.count(pid)) pid = kSyntheticPidBase + static_cast<std::int64_t>(i);
    used.insert(pid);
    pids.push_back(pid);
  }

  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Log &l = m.logs[i];
    std::string program;
    for (const auto &a : l.header.argv) program += (program.empty() ? "" : " ") + a;
    if (program.empty()) program = "?";
    events.push_back(metadata(
        "process_name", pids[i], 0,
        {{"name", l.header.rank >= 0
                      ? fmt::format("{} (rank {}, pid {})", program, l.header.rank, l.header.pid)
                      : fmt::format("{} (pid {})", program, l.header.pid)}}));
    events.push_back(
        metadata("process_sort_index", pids[i], 0, {{"sort_index", static_cast<std::int64_t>(i)}}));
    std::set<std::int64_t> tids;
    for (const auto &e : l.events) tids.insert(e.tid);
    for (auto tid : tids)
      events.push_back(metadata("thread_name", pids[i], tid,
                                {{"name", tid == l.header.pid ? fmt::format("main {}", tid)
                                                              : fmt::format("thread {}", tid)}}));
  }

  // Counters start from zero at the log's start so the first allocation shows as a step.
  for (const auto &r : m.memory) {
    if (!r.from_events) continue;
    events.push_back({{"name", counter_name(r.dev, r.mem)},
                      {"cat", "memory"},
                      {"ph", "C"},
                      {"ts", us(m.time(r.log, 0))},
                      {"pid", pids[r.log]},
                      {"tid", 0},
                      {"args", {{"bytes", 0}}}});
  }

  std::map<std::tuple<std::size_t, std::int64_t, std::string>, std::int64_t> bytes;
  for (const EventRef &ref : m.order) {
    const Event &e = m.event(ref);
    const double ts = us(m.time(ref));
    const std::int64_t pid = pids[ref.log];
    if (const auto *c = std::get_if<Call>(&e.body)) {
      if (!c->mem.empty() && c->delta != 0) {
        std::int64_t &cur = bytes[{ref.log, c->dev, c->mem}];
        cur = sat_add(cur, c->delta);
        events.push_back({{"name", counter_name(c->dev, c->mem)},
                          {"cat", "memory"},
                          {"ph", "C"},
                          {"ts", ts},
                          {"pid", pid},
                          {"tid", e.tid},
                          {"args", {{"bytes", cur}}}});
      }
      if (c->deferred)
        events.push_back(instant("deferred " + c->api, "deferred", ts, pid, e.tid, "t",
                                 {{"call", call_text(c->api, c->args)}, {"seq", e.seq}}));
      if (opt.slow_ns > 0 && c->dur >= opt.slow_ns)
        events.push_back(
            {{"name", c->api},
             {"cat", "slow call"},
             {"ph", "X"},
             {"ts", ts},
             {"dur", us(c->dur)},
             {"pid", pid},
             {"tid", e.tid},
             {"args", {{"call", call_text(c->api, c->args)}, {"res", c->res}, {"seq", e.seq}}}});
    } else if (const auto *f = std::get_if<Finding>(&e.body)) {
      Json args = {{"call", call_text(f->api, f->args)},
                   {"action", f->action},
                   {"res", f->res},
                   {"msg", f->msg},
                   {"seq", e.seq}};
      if (f->bytes) args["bytes"] = *f->bytes;
      if (f->blocked_ns) args["blocked_ns"] = *f->blocked_ns;
      events.push_back(instant(f->cls, "finding", ts, pid, e.tid, "t", std::move(args)));
    } else if (const auto *n = std::get_if<Nccl>(&e.body)) {
      Json args = {{"api", n->api}, {"comm", n->comm}, {"res", n->res}, {"seq", e.seq}};
      if (n->rank) args["rank"] = *n->rank;
      if (n->nranks) args["nranks"] = *n->nranks;
      if (n->live) args["live"] = *n->live;
      if (n->suppressed) args["suppressed"] = true;
      events.push_back(instant("nccl " + n->event, "nccl", ts, pid, e.tid, "p", std::move(args)));
    }
  }

  for (std::size_t i = 0; i < m.logs.size(); ++i) {
    const Log &l = m.logs[i];
    const double ts = us(m.time(i, l.last_ts()));
    if (!l.leaks.empty()) {
      std::int64_t b = 0;
      for (const auto &k : l.leaks) b += k.size;
      events.push_back(instant("leaks at exit", "leak", ts, pids[i], l.header.pid, "p",
                               {{"objects", l.leaks.size()}, {"bytes", b}}));
    }
    if (l.truncated())
      events.push_back(
          instant("log cut off", "log", ts, pids[i], l.header.pid, "p", {{"file", l.file}}));
  }

  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"generator", "cumemguard report"}}}};
}

}  // namespace cmg::report
