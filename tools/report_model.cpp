// SPDX-License-Identifier: Apache-2.0
// Builds the report model: findings by class and stack, leaks by allocation stack, bytes per device
// and kind, allocation sites, calls per API and NCCL communicator lifecycles.
#include "report_model.h"

#include <algorithm>
#include <tuple>

#include <fmt/format.h>

#include "findings.h"

namespace cmg::report {
namespace {

// Classes print in the order of policy/findings.def (the README's order); unknown ones after.
std::pair<int, std::string> class_rank(const std::string &cls) {
  if (auto c = finding_from_id(cls)) return {static_cast<int>(*c), cls};
  return {static_cast<int>(kFindingClassCount), cls};
}

// Memory kinds in the order docs/log-format.md lists them; unknown ones after, by name.
std::pair<int, std::string> mem_rank(const std::string &mem) {
  static const char *const kinds[] = {"linear", "async", "managed", "host", "vmm", "va", "ipc"};
  for (int i = 0; i < 7; ++i)
    if (mem == kinds[i]) return {i, mem};
  return {7, mem};
}

// Groups without a stack are told apart by API, so "no stacks recorded" still says something.
using SiteKey = std::pair<StackKey, std::string>;

SiteKey site_key(const ResolvedStack &s, const std::string &api) {
  return {s.key, s.id ? std::string() : api};
}

}  // namespace

std::string log_label(const Log &log) {
  if (log.header.rank >= 0) return fmt::format("rank {} (pid {})", log.header.rank, log.header.pid);
  return fmt::format("pid {}", log.header.pid);
}

// "r0" by rank, "p4242" without one; "r0/p4242" when two logs share a rank (two jobs, or a
// forked child), and "#2" on top when even that repeats (the same pid on two hosts).
std::vector<std::string> make_labels(const std::vector<Log> &logs) {
  auto by_rank = [](const Log &l) {
    return l.header.rank >= 0 ? fmt::format("r{}", l.header.rank)
                              : fmt::format("p{}", l.header.pid);
  };
  std::map<std::string, int> seen;
  for (const auto &l : logs) ++seen[by_rank(l)];
  std::vector<std::string> out;
  for (const auto &l : logs) {
    std::string s = by_rank(l);
    if (seen[s] > 1 && l.header.rank >= 0) s += fmt::format("/p{}", l.header.pid);
    out.push_back(s);
  }
  std::map<std::string, int> count, used;
  for (const auto &s : out) ++count[s];
  for (auto &s : out)
    if (count[s] > 1 && used[s]++ > 0) s += fmt::format("#{}", used[s]);
  return out;
}

const ResolvedStack &Model::stack(std::size_t log, std::optional<std::uint64_t> id) const {
  if (!id) return no_stack_;
  auto key = std::make_pair(log, *id);
  if (auto it = stack_cache_.find(key); it != stack_cache_.end()) return it->second;
  ResolvedStack s;
  s.log = log;
  s.id = id;
  auto it = logs[log].stacks.find(*id);
  if (it == logs[log].stacks.end()) {
    s.missing = true;
    // Keyed by log too: the same missing id in two processes is not the same stack.
    s.key.emplace_back(fmt::format("<missing stack {} of log {}>", *id, log), 0);
  } else {
    for (std::uint64_t pc : it->second) {
      const auto &fs = symbolizers[log].frames(pc);
      s.frames.insert(s.frames.end(), fs.begin(), fs.end());
      const Frame &f = fs.back();
      s.key.emplace_back(f.module, f.module.empty() ? f.pc : f.offset);
    }
  }
  return stack_cache_.emplace(key, std::move(s)).first->second;
}

bool Model::truncated_any() const {
  return std::any_of(logs.begin(), logs.end(), [](const Log &l) { return l.truncated(); });
}

int Model::exit_status(const ReportOptions &opt) const {
  int status = 0;
  for (const auto &c : findings) {
    if (c.cls == "leak" && !opt.fail_on_leaks) continue;
    if (c.count > 0 || c.at_exit.value_or(0) > 0) status = 1;
  }
  if (opt.fail_on_leaks && leak_count > 0) status = 1;
  for (const auto &e : errors) status = std::max(status, e.exit_status);
  return status;
}

Model build_model(std::vector<Log> logs, std::vector<LogError> errors, const ReportOptions &opt) {
  Model m;
  m.logs = std::move(logs);
  m.errors = std::move(errors);
  for (const auto &l : m.logs) m.symbolizers.emplace_back(l.modules, opt.symbolize);
  m.labels = make_labels(m.logs);
  m.t0 = earliest_start(m.logs);
  m.order = merge_events(m.logs);

  std::map<std::string, FindingClassGroup> classes;
  std::map<std::string, std::map<StackKey, FindingGroup>> groups;
  std::map<std::tuple<std::size_t, std::int64_t, std::string>, MemoryRow> memory;
  std::map<SiteKey, SiteRow> sites;
  std::map<std::string, CallRow> calls;
  std::map<std::pair<std::size_t, std::string>, std::size_t> comm_index;

  for (const EventRef &ref : m.order) {
    const Event &e = m.event(ref);
    const std::int64_t t = m.time(ref);
    if (const auto *c = std::get_if<Call>(&e.body)) {
      CallRow &row = calls[c->api];
      row.api = c->api;
      ++row.count;
      if (c->res != 0) ++row.errors;
      if (c->skipped) ++row.skipped;
      if (c->deferred) ++row.deferred;
      row.dur_total = sat_add(row.dur_total, c->dur);
      row.dur_max = std::max(row.dur_max, c->dur);
      if (!c->mem.empty()) {
        MemoryRow &mr = memory[{ref.log, c->dev, c->mem}];
        mr.log = ref.log;
        mr.dev = c->dev;
        mr.mem = c->mem;
        mr.from_events = true;
        mr.current = sat_add(mr.current, c->delta);
        if (c->delta > 0) mr.allocated = sat_add(mr.allocated, c->delta);
        if (c->delta < 0) mr.freed = sat_sub(mr.freed, c->delta);
        if (mr.current > mr.peak) {
          mr.peak = mr.current;
          mr.peak_t = t;
        }
      }
      if (c->delta > 0) {
        const ResolvedStack &s = m.stack(ref.log, e.stack);
        auto [it, fresh] = sites.try_emplace(site_key(s, c->api));
        SiteRow &site = it->second;
        if (fresh) site.stack = s;
        site.bytes = sat_add(site.bytes, c->delta);
        ++site.count;
        site.apis.insert(c->api);
        site.logs.insert(ref.log);
      }
    } else if (const auto *f = std::get_if<Finding>(&e.body)) {
      FindingClassGroup &cg = classes[f->cls];
      cg.cls = f->cls;
      ++cg.count;
      const ResolvedStack &s = m.stack(ref.log, e.stack);
      auto [it, fresh] = groups[f->cls].try_emplace(s.key);
      FindingGroup &g = it->second;
      if (fresh) {
        g.stack = s;
        g.first_t = t;
        g.example = ref;
      }
      ++g.count;
      g.last_t = t;
      ++g.actions[f->action.empty() ? "?" : f->action];
      if (f->bytes) g.bytes = sat_add(g.bytes.value_or(0), *f->bytes);
      if (f->blocked_ns) g.blocked_ns = sat_add(g.blocked_ns.value_or(0), *f->blocked_ns);
      g.logs.insert(ref.log);
    } else if (const auto *n = std::get_if<Nccl>(&e.body)) {
      m.nccl.push_back(ref);
      auto [it, fresh] = comm_index.try_emplace({ref.log, n->comm}, m.comms.size());
      if (fresh) {
        m.comms.emplace_back();
        m.comms.back().log = ref.log;
        m.comms.back().comm = n->comm;
      }
      CommRow &cr = m.comms[it->second];
      ++cr.events;
      if (n->event == "init" || n->event == "split" || n->event == "shrink") {
        if (!cr.created) cr.created = ref;
      } else if (n->event == "finalize") {
        cr.finalized = ref;
      } else if (n->event == "destroy" || n->event == "abort") {
        cr.ended = ref;
      }
    }
  }

  // What the shim counted at exit, next to what the records say.
  for (std::size_t li = 0; li < m.logs.size(); ++li) {
    const auto &s = m.logs[li].summary;
    if (!s) continue;
    for (const auto &[api, n] : s->calls) {
      CallRow &row = calls[api];
      row.api = api;
      row.at_exit = sat_add(row.at_exit.value_or(0), n);
    }
    for (const auto &[cls, n] : s->findings) {
      // Leaks have their own section; a summary-only `leak` count adds nothing there.
      if (cls == "leak" && !classes.count(cls)) continue;
      FindingClassGroup &cg = classes[cls];
      cg.cls = cls;
      cg.at_exit = sat_add(cg.at_exit.value_or(0), n);
    }
    for (const auto &b : s->bytes) {
      MemoryRow &mr = memory[{li, b.dev, b.mem}];
      mr.log = li;
      mr.dev = b.dev;
      mr.mem = b.mem;
      mr.at_exit = b;
    }
  }
  // A log with a summary says 0 for classes it does not list.
  bool any_summary =
      std::any_of(m.logs.begin(), m.logs.end(), [](const Log &l) { return l.summary.has_value(); });
  for (auto &[cls, cg] : classes) {
    if (any_summary && !cg.at_exit) cg.at_exit = 0;
    if (auto c = finding_from_id(cls)) cg.help = std::string(finding_info(*c).help);
    auto &gm = groups[cls];
    for (auto &[key, g] : gm) cg.groups.push_back(std::move(g));
    std::stable_sort(cg.groups.begin(), cg.groups.end(),
                     [](const FindingGroup &a, const FindingGroup &b) {
                       if (a.count != b.count) return a.count > b.count;
                       if (a.first_t != b.first_t) return a.first_t < b.first_t;
                       return a.stack.key < b.stack.key;
                     });
    if (cls != "leak") m.finding_count += cg.count;
    m.findings.push_back(std::move(cg));
  }
  std::sort(m.findings.begin(), m.findings.end(),
            [](const FindingClassGroup &a, const FindingClassGroup &b) {
              return class_rank(a.cls) < class_rank(b.cls);
            });

  // Leaks, grouped by allocation stack (and API, so stackless leaks still split by call).
  std::map<SiteKey, LeakGroup> leaks;
  for (std::size_t li = 0; li < m.logs.size(); ++li) {
    const auto &ll = m.logs[li].leaks;
    for (std::size_t i = 0; i < ll.size(); ++i) {
      const Leak &l = ll[i];
      const ResolvedStack &s = m.stack(li, l.stack);
      auto [it, fresh] = leaks.try_emplace({s.key, l.api});
      LeakGroup &g = it->second;
      if (fresh) {
        g.stack = s;
        g.api = l.api;
        g.example = {li, i};
      }
      ++g.count;
      g.bytes = sat_add(g.bytes, l.size);
      ++g.what[l.what];
      g.logs.insert(li);
      ++m.leak_count;
      m.leak_bytes = sat_add(m.leak_bytes, l.size);
    }
  }
  for (auto &[key, g] : leaks) m.leaks.push_back(std::move(g));
  std::stable_sort(m.leaks.begin(), m.leaks.end(), [](const LeakGroup &a, const LeakGroup &b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    if (a.count != b.count) return a.count > b.count;
    return a.example < b.example;
  });

  for (auto &[key, row] : memory) m.memory.push_back(std::move(row));
  std::sort(m.memory.begin(), m.memory.end(), [](const MemoryRow &a, const MemoryRow &b) {
    return std::make_tuple(a.log, a.dev, mem_rank(a.mem)) <
           std::make_tuple(b.log, b.dev, mem_rank(b.mem));
  });

  for (auto &[key, row] : sites) m.sites.push_back(std::move(row));
  std::stable_sort(m.sites.begin(), m.sites.end(), [](const SiteRow &a, const SiteRow &b) {
    if (a.bytes != b.bytes) return a.bytes > b.bytes;
    return a.count > b.count;
  });

  for (auto &[api, row] : calls) m.calls.push_back(std::move(row));
  std::stable_sort(m.calls.begin(), m.calls.end(),
                   [](const CallRow &a, const CallRow &b) { return a.count > b.count; });
  return m;
}

}  // namespace cmg::report
