// SPDX-License-Identifier: Apache-2.0
// Builds the report model in one pass over the merged events: findings by class and stack, leaks
// by allocation stack, bytes per device and kind (with a bounded series for the chart),
// allocation sites, calls per API and NCCL communicator lifecycles.
#include "report_model.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

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
  static const char *const kinds[] = {"linear", "async", "managed", "host", "vmm", "va", "ipc",
                                      "graph"};
  for (int i = 0; i < 8; ++i)
    if (mem == kinds[i]) return {i, mem};
  return {8, mem};
}

// "r0" by rank, "p4242" without one; "r0/p4242" when two logs share a rank (two jobs, or a
// forked child), and "#2" on top when even that repeats (the same pid on two hosts).
std::vector<std::string> make_labels(const std::vector<const Log *> &logs) {
  auto by_rank = [](const Log &l) {
    return l.header.rank >= 0 ? fmt::format("r{}", l.header.rank)
                              : fmt::format("p{}", l.header.pid);
  };
  std::map<std::string, int> seen;
  for (const auto *l : logs) ++seen[by_rank(*l)];
  std::vector<std::string> out;
  for (const auto *l : logs) {
    std::string s = by_rank(*l);
    if (seen[s] > 1 && l->header.rank >= 0) s += fmt::format("/p{}", l->header.pid);
    out.push_back(s);
  }
  std::map<std::string, int> count, used;
  for (const auto &s : out) ++count[s];
  for (auto &s : out)
    if (count[s] > 1 && used[s]++ > 0) s += fmt::format("#{}", used[s]);
  return out;
}

}  // namespace

std::pair<std::string, std::uint64_t> module_offset(const std::vector<const Module *> &mods,
                                                    std::uint64_t pc) {
  auto ub = std::upper_bound(mods.begin(), mods.end(), pc,
                             [](std::uint64_t p, const Module *m) { return p < m->base; });
  while (ub != mods.begin()) {
    const Module *m = *--ub;
    if (m->size == 0 || pc - m->base < m->size) return {m->path, pc - m->base};
  }
  return {std::string(), pc};
}

StackKey stack_key_of(const Log &l, std::size_t log, std::uint64_t id,
                      const std::vector<const Module *> &sorted) {
  StackKey k;
  auto it = l.stacks.find(id);
  if (it == l.stacks.end()) {
    // Keyed by log too: the same missing id in two processes is not the same stack.
    k.emplace_back(fmt::format("<missing stack {} of log {}>", id, log), 0);
    return k;
  }
  const auto py = l.py_stacks.find(id);
  const PyStackRec *rec = py == l.py_stacks.end() ? nullptr : &py->second;
  std::size_t next = 0;
  auto python = [&](const PyFrameRef &r) {
    auto c = l.pycodes.find(r.code);
    k.emplace_back(c == l.pycodes.end()
                       ? fmt::format("\x01py {} of log {}", r.code, log)
                       : fmt::format("\x01py {}\x02{}", c->second.file, c->second.name),
                   static_cast<std::uint64_t>(r.line));
  };
  for (std::size_t i = 0; i < it->second.size(); ++i) {
    bool replaced = false;
    while (rec && next < rec->frames.size() && rec->frames[next].at == i) {
      python(rec->frames[next++]);
      replaced = true;
    }
    if (!replaced) k.push_back(module_offset(sorted, it->second[i]));
  }
  while (rec && next < rec->frames.size()) python(rec->frames[next++]);
  if (rec && !rec->end.empty()) k.emplace_back("\x01py_end " + rec->end, 0);
  return k;
}

namespace {

// Interned stack keys: groups compare small integers, not frame lists. -1: no stack.
class StackKeys {
 public:
  long key(std::size_t log, const Log &l, std::optional<std::uint64_t> id) {
    if (!id) return -1;
    if (per_log_.size() <= log) per_log_.resize(log + 1);
    auto &cache = per_log_[log];
    if (auto it = cache.ids.find(*id); it != cache.ids.end()) return it->second;
    if (cache.sorted_for != l.modules.size()) {
      cache.modules.clear();
      for (const auto &m : l.modules) cache.modules.push_back(&m);
      std::stable_sort(cache.modules.begin(), cache.modules.end(),
                       [](const Module *a, const Module *b) { return a->base < b->base; });
      cache.sorted_for = l.modules.size();
    }
    StackKey k = stack_key_of(l, log, *id, cache.modules);
    auto [kit, fresh] = index_.try_emplace(k, static_cast<long>(keys_.size()));
    if (fresh) keys_.push_back(std::move(k));
    cache.ids.emplace(*id, kit->second);
    return kit->second;
  }
  const StackKey &at(long k) const { return k < 0 ? empty_ : keys_[static_cast<std::size_t>(k)]; }

 private:
  struct PerLog {
    std::unordered_map<std::uint64_t, long> ids;
    std::vector<const Module *> modules;
    std::size_t sorted_for = static_cast<std::size_t>(-1);
  };
  std::vector<PerLog> per_log_;
  std::map<StackKey, long> index_;
  std::vector<StackKey> keys_;
  StackKey empty_;
};

}  // namespace

void Series::add(std::int64_t t, std::int64_t value) {
  if (points.empty()) origin = t;
  if (!points.empty()) {
    Point &p = points.back();
    if (t < p.t + bucket) {  // the same bucket (or a timestamp that went back a little)
      p.max = std::max(p.max, value);
      p.last = value;
      return;
    }
  }
  const std::int64_t start = origin + (t - origin) / bucket * bucket;
  points.push_back({start, value, value});
  if (points.size() <= kMaxPoints) return;
  // Full: merge neighbours into buckets twice as wide.
  bucket *= 2;
  std::vector<Point> merged;
  for (const Point &p : points) {
    const std::int64_t s = origin + (p.t - origin) / bucket * bucket;
    if (!merged.empty() && merged.back().t == s) {
      merged.back().max = std::max(merged.back().max, p.max);
      merged.back().last = p.last;
    } else {
      merged.push_back({s, p.max, p.last});
    }
  }
  points = std::move(merged);
}

std::string log_label(const Log &log) {
  if (log.header.rank >= 0) return fmt::format("rank {} (pid {})", log.header.rank, log.header.pid);
  return fmt::format("pid {}", log.header.pid);
}

std::string dev_text(std::int64_t dev) {
  return dev < 0 ? std::string("-") : fmt::format("{}", dev);
}

Symbolizer &Model::symbolizer(std::size_t log) const {
  if (symbolizers.size() < logs.size()) symbolizers.resize(logs.size());
  if (!symbolizers[log]) symbolizers[log] = std::make_unique<Symbolizer>(logs[log].modules, symbolize);
  return *symbolizers[log];
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
  } else {
    std::vector<std::vector<Frame>> native;
    native.reserve(it->second.size());
    for (std::uint64_t pc : it->second) native.push_back(symbolizer(log).frames(pc));
    const auto py = logs[log].py_stacks.find(*id);
    s.frames = merge_python(std::move(native),
                            py == logs[log].py_stacks.end() ? nullptr : &py->second,
                            logs[log].pycodes);
  }
  return stack_cache_.emplace(key, std::move(s)).first->second;
}

void Model::resolve_shown(const ReportOptions &opt) const {
  resolve_resident(*this, opt);
  for (const auto &c : findings)
    for (const auto &g : c.groups) {
      stack(g.stack);
      for (const auto &r : g.finding().related) stack(g.example.log, r.stack);
    }
  const std::size_t nl = opt.top ? std::min(opt.top, leaks.size()) : leaks.size();
  for (std::size_t i = 0; i < nl; ++i) stack(leaks[i].stack);
  const std::size_t ns = opt.top ? std::min(opt.top, sites.size()) : sites.size();
  for (std::size_t i = 0; i < ns; ++i) stack(sites[i].stack);
  for (std::size_t li = 0; li < outcomes.size(); ++li) {
    const Outcome &o = outcomes[li];
    if (o.crash) stack(li, o.crash->stack);
    if (o.first_sticky) stack(li, o.first_sticky->stack);
    for (const auto &e : o.errors) stack(li, e.stack);
  }
}

bool Model::truncated_any() const {
  return std::any_of(logs.begin(), logs.end(), [](const Log &l) { return l.truncated(); });
}

std::size_t Model::unreadable_records() const {
  std::size_t n = 0;
  for (const Log &l : logs) n += l.malformed;
  return n;
}

std::vector<std::string> Model::counted_not_read() const {
  std::vector<std::string> out;
  for (const auto &c : findings)
    if (c.cls != "leak" && c.at_exit && *c.at_exit > static_cast<std::int64_t>(c.count))
      out.push_back(fmt::format("{} {}", c.cls, *c.at_exit));
  return out;
}

bool Model::all_complete() const {
  return std::all_of(outcomes.begin(), outcomes.end(),
                     [](const Outcome &o) { return o.status == Status::Complete; });
}

bool Model::leaks_known() const {
  return std::all_of(outcomes.begin(), outcomes.end(), [](const Outcome &o) {
    return o.status == Status::Complete && !o.quick_exit;
  });
}

int Model::exit_status(const ReportOptions &opt) const {
  int status = 0;
  for (const auto &c : findings) {
    if (c.cls == "leak" && !opt.fail_on_leaks) continue;
    if (c.count > 0 || c.at_exit.value_or(0) > 0) status = kExitFindings;
  }
  if (opt.fail_on_leaks && leak_count > 0) status = kExitFindings;
  // A crash or strict mode's abort fails the gate even without a finding record, and so does a
  // log without its end record whose process is not running any more: killed (SIGKILL, out of
  // memory, a time limit) before it could say what it left.
  for (const auto &o : outcomes)
    if (o.status == Status::Crashed || o.status == Status::Aborted ||
        (o.status == Status::Truncated && !o.running))
      status = kExitFindings;
  // Records that did not parse may have been findings (a finding line cut off, a field of the
  // wrong type): a log that cannot be read whole is not a clean one. Its first line says so.
  if (unreadable_records() > 0) status = std::max(status, kExitFindings);
  for (const auto &e : errors) status = std::max(status, e.exit_status);
  return status;
}

namespace {

class Builder {
 public:
  explicit Builder(const ReportOptions &opt) : opt_(opt) {}

  void start(const std::vector<const Log *> &logs) {
    logs_ = logs;
    labels_ = make_labels(logs);
    t0_ = std::numeric_limits<std::int64_t>::max();
    for (const auto *l : logs) t0_ = std::min(t0_, l->header.start_unix_ns);
    if (logs.empty()) t0_ = 0;
    outcome_.resize(logs.size());
    leak_index_.assign(logs.size(), 0);
    m_.log_leaks.assign(logs.size(), {0, 0});
  }
  const std::vector<std::string> &labels() const { return labels_; }
  std::int64_t t0() const { return t0_; }

  void event(std::size_t li, const Event &e) {
    const std::int64_t t = rel_time(logs_[li]->header, e.ts, t0_);
    outcome_[li].event(e, t);
    if (const auto *c = std::get_if<Call>(&e.body)) {
      call(li, e, *c, t);
    } else if (const auto *f = std::get_if<Finding>(&e.body)) {
      finding(li, e, *f, t);
    } else if (const auto *n = std::get_if<Nccl>(&e.body)) {
      nccl(li, e, *n, t);
    }
  }

  void leak(std::size_t li, Leak &&l) {
    const long k = keys_.key(li, *logs_[li], l.stack);
    auto [it, fresh] = leaks_.try_emplace({k, l.api});
    LeakGroup &g = it->second;
    if (fresh) {
      g.stack = {li, l.stack};
      g.api = l.api;
      g.example_log = li;
      leak_order_[{k, l.api}] = {li, leak_index_[li]};
    }
    ++leak_index_[li];
    ++g.count;
    g.bytes = sat_add(g.bytes, l.size);
    // Memory made for a CUDA graph (PyTorch's private pools, graph allocations) says whose it is.
    ++g.what[l.capture ? fmt::format("{} (capture {}: the graph's)", l.what, *l.capture) : l.what];
    g.logs.insert(li);
    ++m_.leak_count;
    m_.leak_bytes = sat_add(m_.leak_bytes, l.size);
    ++m_.log_leaks[li].first;
    m_.log_leaks[li].second = sat_add(m_.log_leaks[li].second, l.size);
    if (fresh) g.example = std::move(l);
  }

  Model finish(std::vector<Log> logs, std::vector<LogError> errors);

 private:
  void call(std::size_t li, const Event &e, const Call &c, std::int64_t t) {
    if (!c.released_from.empty()) {
      // The shim's own release of a free it held: the program's free was counted when it was
      // called (and its bytes left the tracked memory then).
      ShimReleaseRow &r = shim_releases_[{c.released_from, c.api}];
      r.from = c.released_from;
      r.api = c.api;
      ++r.count;
      if (c.res != 0) ++r.errors;
      r.bytes = sat_add(r.bytes, static_cast<std::int64_t>(c.size.value_or(0)));
      return;
    }
    auto [cit, cfresh] = calls_.try_emplace(c.api);
    CallRow &row = cit->second;
    if (cfresh) row.api = c.api;
    ++row.count;
    if (c.res != 0) ++row.errors;
    if (c.skipped) ++row.skipped;
    if (c.deferred) ++row.deferred;
    row.dur_total = sat_add(row.dur_total, c.dur);
    row.dur_max = std::max(row.dur_max, c.dur);
    if (!c.mem.empty()) {
      // Most calls hit the row the previous one did: no tree walk for them.
      if (!last_row_ || last_log_ != li || last_row_->dev != c.dev || last_row_->mem != c.mem) {
        last_row_ = &memory_[{li, c.dev, c.mem}];
        last_log_ = li;
        last_row_->log = li;
        last_row_->dev = c.dev;
        last_row_->mem = c.mem;
      }
      MemoryRow &mr = *last_row_;
      if (!mr.from_events) mr.series.add(rel_time(logs_[li]->header, 0, t0_), 0);
      mr.from_events = true;
      mr.current = sat_add(mr.current, c.delta);
      if (c.delta > 0) mr.allocated = sat_add(mr.allocated, c.delta);
      if (c.delta < 0) mr.freed = sat_sub(mr.freed, c.delta);
      if (mr.current > mr.peak) {
        mr.peak = mr.current;
        mr.peak_t = t;
      }
      if (c.delta != 0) mr.series.add(t, mr.current);
    }
    if (c.delta > 0) {
      const long k = keys_.key(li, *logs_[li], e.stack);
      // Groups without a stack are told apart by API, so "no stacks recorded" still says something.
      SiteRow *site_row = nullptr;
      bool fresh = false;
      if (k < 0) {
        auto r = stackless_sites_.try_emplace(c.api);
        site_row = &r.first->second;
        fresh = r.second;
      } else {
        auto r = sites_.try_emplace(k);
        site_row = &r.first->second;
        fresh = r.second;
      }
      SiteRow &site = *site_row;
      if (fresh) site.stack = {li, e.stack};
      site.bytes = sat_add(site.bytes, c.delta);
      ++site.count;
      site.apis.insert(c.api);
      site.logs.insert(li);
    }
  }

  void finding(std::size_t li, const Event &e, const Finding &f, std::int64_t t) {
    if (!f.suppressed.empty()) {
      // "CLASS:PATTERN": counted apart, never a finding of the report.
      const auto colon = f.suppressed.find(':');
      const std::string pattern =
          colon == std::string::npos ? f.suppressed : f.suppressed.substr(colon + 1);
      SuppressedRow &row = suppressed_[{f.cls, pattern}];
      row.cls = f.cls;
      row.pattern = pattern;
      ++row.count;
      row.logs.insert(li);
      return;
    }
    if (f.action == "abort" && !f.api.empty()) {
      // The call strict mode stopped: counted by the shim among the program's calls (the summary
      // record's), written as this finding and never as a call record (the process aborted
      // before the driver saw it). Counted here, so the calls table and "at exit" agree.
      auto [cit, cfresh] = calls_.try_emplace(f.api);
      if (cfresh) cit->second.api = f.api;
      ++cit->second.count;
    }
    FindingClassGroup &cg = classes_[f.cls];
    cg.cls = f.cls;
    ++cg.count;
    const long k = keys_.key(li, *logs_[li], e.stack);
    auto [it, fresh] = groups_[f.cls].try_emplace(k);
    FindingGroup &g = it->second;
    if (fresh) {
      g.stack = {li, e.stack};
      g.first_t = t;
      g.example = {li, e};
    }
    ++g.count;
    g.last_t = t;
    ++g.actions[f.action.empty() ? "?" : f.action];
    if (f.bytes) g.bytes = sat_add(g.bytes.value_or(0), *f.bytes);
    if (f.blocked_ns) g.blocked_ns = sat_add(g.blocked_ns.value_or(0), *f.blocked_ns);
    g.logs.insert(li);
  }

  void nccl(std::size_t li, const Event &e, const Nccl &n, std::int64_t t) {
    if (m_.nccl.size() < Model::kMaxNccl) m_.nccl.push_back({li, e});
    else ++m_.nccl_dropped;
    auto [it, fresh] = comm_index_.try_emplace({li, n.comm}, m_.comms.size());
    const bool creates =
        n.event == "init" || n.event == "split" || n.event == "shrink" || n.event == "grow";
    // NCCL's allocator hands an ended communicator's address to a new one: a row of its own.
    if (!fresh && creates && n.res == 0 && m_.comms[it->second].ended) {
      it->second = m_.comms.size();
      fresh = true;
    }
    if (fresh) {
      m_.comms.emplace_back();
      m_.comms.back().log = li;
      m_.comms.back().comm = n.comm;
    }
    CommRow &cr = m_.comms[it->second];
    ++cr.events;
    const NcclPoint p{t, n.api, n.event};
    const bool ok = n.res == 0;
    if (creates) {
      if (!cr.created) cr.created = p;
    } else if (n.event == "finalize") {
      cr.finalized = p;
    } else if (n.event == "revoke") {
      if (ok) cr.revoked = p;
    } else if (n.event == "destroy" || n.event == "abort") {
      // A destroy NCCL refused (a suspended communicator) leaves it as it was.
      if (ok && !cr.ended) {
        cr.ended = p;
        for (RegRow &r : cr.regs)
          if (!r.ended) r.ended = t;
        if (!cr.suspended.empty() && !cr.suspended.back().to) cr.suspended.back().to = t;
      }
    } else if (n.event == "suspend") {
      // Only NCCL_SUSPEND_MEM (1) suspends (2.29.7); a suspend of a suspended one is refused.
      if (ok && n.flags.value_or(0) & 1 && (cr.suspended.empty() || cr.suspended.back().to))
        cr.suspended.push_back({t, std::nullopt, n.ranges.value_or(0), n.range_bytes.value_or(0)});
    } else if (n.event == "resume") {
      if (ok && !cr.suspended.empty() && !cr.suspended.back().to) cr.suspended.back().to = t;
    } else if (n.event == "memstats") {
      if (ok && n.stat && n.value) {
        cr.mem_stats[*n.stat] = *n.value;
        cr.mem_stats_t = t;
      }
    } else if (n.event == "register" || n.event == "window_register") {
      if (ok && !n.handle.empty() && n.handle != "0x0") reg_made(cr, n, t, e.seq);
    } else if (n.event == "deregister" || n.event == "window_deregister") {
      if (ok) reg_ended(cr, n.handle, n.event == "window_deregister", t);
    }
  }

  static void reg_made(CommRow &cr, const Nccl &n, std::int64_t t, std::uint64_t seq) {
    const bool window = n.event == "window_register";
    ++(window ? cr.windows_made : cr.regs_made);
    for (RegRow &r : cr.regs)
      if (!r.ended && r.window == window && r.handle == n.handle) {
        ++r.refs;  // a range inside a registered slot: the same handle (register.cc)
        return;
      }
    if (cr.regs.size() >= CommRow::kMaxRegs) {
      ++cr.regs_dropped;
      return;
    }
    cr.regs.push_back({window, n.handle, n.buff, n.size.value_or(0), t, seq, 1, std::nullopt});
  }

  static void reg_ended(CommRow &cr, const std::string &handle, bool window, std::int64_t t) {
    for (RegRow &r : cr.regs)
      if (!r.ended && r.window == window && r.handle == handle) {
        if (--r.refs == 0) r.ended = t;
        return;
      }
  }

  const ReportOptions &opt_;
  std::vector<const Log *> logs_;
  std::vector<std::string> labels_;
  std::int64_t t0_ = 0;
  StackKeys keys_;
  Model m_;
  std::vector<OutcomeTracker> outcome_;
  std::map<std::string, FindingClassGroup> classes_;
  std::map<std::string, std::map<long, FindingGroup>> groups_;
  std::map<std::pair<std::string, std::string>, SuppressedRow> suppressed_;
  std::map<std::tuple<std::size_t, std::int64_t, std::string>, MemoryRow> memory_;
  std::unordered_map<long, SiteRow> sites_;            // by stack key
  std::unordered_map<std::string, SiteRow> stackless_sites_;  // by API
  std::unordered_map<std::string, CallRow> calls_;
  std::map<std::pair<std::string, std::string>, ShimReleaseRow> shim_releases_;
  MemoryRow *last_row_ = nullptr;  // std::map nodes stay put
  std::size_t last_log_ = 0;
  std::map<std::pair<std::size_t, std::string>, std::size_t> comm_index_;
  std::map<std::pair<long, std::string>, LeakGroup> leaks_;
  std::map<std::pair<long, std::string>, std::pair<std::size_t, std::size_t>> leak_order_;
  std::vector<std::size_t> leak_index_;
};

Model Builder::finish(std::vector<Log> logs, std::vector<LogError> errors) {
  Model m = std::move(m_);
  m.logs = std::move(logs);
  m.errors = std::move(errors);
  m.symbolize = opt_.symbolize;
  m.labels = labels_;
  m.t0 = t0_;
  for (std::size_t li = 0; li < m.logs.size(); ++li)
    m.outcomes.push_back(outcome_[li].finish(m.logs[li]));

  // What the shim counted at exit, next to what the records say.
  for (std::size_t li = 0; li < m.logs.size(); ++li) {
    const auto &s = m.logs[li].summary;
    if (!s) continue;
    for (const auto &[api, n] : s->calls) {
      CallRow &row = calls_[api];
      row.api = api;
      row.at_exit = sat_add(row.at_exit.value_or(0), n);
    }
    for (const auto &[cls, n] : s->findings) {
      // Leaks have their own section; a summary-only `leak` count adds nothing there.
      if (cls == "leak" && !classes_.count(cls)) continue;
      FindingClassGroup &cg = classes_[cls];
      cg.cls = cls;
      cg.at_exit = sat_add(cg.at_exit.value_or(0), n);
    }
    for (const auto &r : s->suppressed) {
      SuppressedRow &row = suppressed_[{r.cls, r.pattern}];
      row.cls = r.cls;
      row.pattern = r.pattern;
      row.at_exit = sat_add(row.at_exit.value_or(0), r.count);
      row.logs.insert(li);
    }
    for (const auto &b : s->bytes) {
      MemoryRow &mr = memory_[{li, b.dev, b.mem}];
      mr.log = li;
      mr.dev = b.dev;
      mr.mem = b.mem;
      mr.at_exit = b;
    }
  }
  // A log with a summary says 0 for classes it does not list.
  const bool any_summary =
      std::any_of(m.logs.begin(), m.logs.end(), [](const Log &l) { return l.summary.has_value(); });
  for (auto &entry : classes_) {
    // Not a structured binding: clang 14 does not let the sort's lambda capture one.
    const std::string &cls = entry.first;
    FindingClassGroup &cg = entry.second;
    if (any_summary && !cg.at_exit) cg.at_exit = 0;
    if (auto c = finding_from_id(cls)) cg.help = std::string(finding_info(*c).help);
    for (auto &[key, g] : groups_[cls]) cg.groups.push_back(std::move(g));
    std::vector<long> order;
    for (auto &[key, g] : groups_[cls]) order.push_back(key);
    std::vector<std::size_t> idx(cg.groups.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      const FindingGroup &ga = cg.groups[a], &gb = cg.groups[b];
      if (ga.count != gb.count) return ga.count > gb.count;
      if (ga.first_t != gb.first_t) return ga.first_t < gb.first_t;
      return keys_.at(order[a]) < keys_.at(order[b]);
    });
    std::vector<FindingGroup> sorted;
    for (auto i : idx) sorted.push_back(std::move(cg.groups[i]));
    cg.groups = std::move(sorted);
    if (cls != "leak") m.finding_count += cg.count;
    m.findings.push_back(std::move(cg));
  }
  std::sort(m.findings.begin(), m.findings.end(),
            [](const FindingClassGroup &a, const FindingClassGroup &b) {
              return class_rank(a.cls) < class_rank(b.cls);
            });

  for (auto &[key, row] : suppressed_) {
    m.suppressed_count += std::max<std::size_t>(
        row.count, static_cast<std::size_t>(std::max<std::int64_t>(0, row.at_exit.value_or(0))));
    m.suppressed.push_back(std::move(row));
  }

  // Leaks: by bytes, then count, then the first leak's position.
  std::vector<std::pair<std::pair<std::size_t, std::size_t>, LeakGroup>> leaks;
  for (auto &[key, g] : leaks_) leaks.emplace_back(leak_order_[key], std::move(g));
  std::stable_sort(leaks.begin(), leaks.end(), [](const auto &a, const auto &b) {
    if (a.second.bytes != b.second.bytes) return a.second.bytes > b.second.bytes;
    if (a.second.count != b.second.count) return a.second.count > b.second.count;
    return a.first < b.first;
  });
  for (auto &[order, g] : leaks) m.leaks.push_back(std::move(g));

  for (auto &[key, row] : memory_) m.memory.push_back(std::move(row));
  std::sort(m.memory.begin(), m.memory.end(), [](const MemoryRow &a, const MemoryRow &b) {
    return std::make_tuple(a.log, a.dev, mem_rank(a.mem)) <
           std::make_tuple(b.log, b.dev, mem_rank(b.mem));
  });

  // Sites: by bytes, then count; ties in stack order, then API.
  std::vector<std::pair<std::pair<long, std::string>, SiteRow>> sites;
  for (auto &[k, row] : sites_) sites.push_back({{k, std::string()}, std::move(row)});
  for (auto &[api, row] : stackless_sites_) sites.push_back({{-1, api}, std::move(row)});
  std::stable_sort(sites.begin(), sites.end(), [&](const auto &a, const auto &b) {
    if (a.second.bytes != b.second.bytes) return a.second.bytes > b.second.bytes;
    if (a.second.count != b.second.count) return a.second.count > b.second.count;
    const StackKey &ka = keys_.at(a.first.first), &kb = keys_.at(b.first.first);
    if (ka != kb) return ka < kb;
    return a.first.second < b.first.second;
  });
  for (auto &[key, row] : sites) m.sites.push_back(std::move(row));

  for (auto &[api, row] : calls_) m.calls.push_back(std::move(row));
  for (auto &[key, row] : shim_releases_) m.shim_releases.push_back(std::move(row));
  std::sort(m.calls.begin(), m.calls.end(), [](const CallRow &a, const CallRow &b) {
    if (a.count != b.count) return a.count > b.count;
    return a.api < b.api;
  });
  return m;
}

}  // namespace

Model read_model(std::vector<std::unique_ptr<LogReader>> readers, std::vector<LogError> errors,
                 const ReportOptions &opt, EventSink *also) {
  Builder b(opt);
  std::vector<LogReader *> rs;
  std::vector<const Log *> logs;
  for (auto &r : readers) {
    rs.push_back(r.get());
    logs.push_back(&r->log());
  }
  b.start(logs);
  for (std::size_t i = 0; i < readers.size(); ++i)
    readers[i]->on_leak = [&b, i](Leak &&l) { b.leak(i, std::move(l)); };
  ResidentModel resident;
  for (std::size_t i = 0; i < readers.size(); ++i)
    readers[i]->on_snapshot = [&resident, i](std::string_view line) { resident.add_line(i, line); };
  if (also) also->start(logs, b.labels(), b.t0());
  if (rs.size() == 1) {  // one log: its events in order, without the merge's indirection
    Event e;
    while (rs[0]->next(e)) {
      b.event(0, e);
      if (also) also->event(0, e);
    }
  } else {
    merge_logs(rs, [&](std::size_t i, const Event &e) {
      b.event(i, e);
      if (also) also->event(i, e);
    });
  }
  std::vector<Log> done;
  for (auto &r : readers) {
    // A read error part way: what was read is reported, and the error raises the exit status.
    if (r->status() == ReadStatus::Unreadable)
      errors.push_back({r->log().file, r->error(), kExitNoInput});
    done.push_back(std::move(r->log()));
  }
  Model m = b.finish(std::move(done), std::move(errors));
  resident.finish();
  m.resident = std::move(resident);
  if (also) also->finish(m);
  return m;
}

Model model_of_texts(const std::vector<std::string> &texts, const ReportOptions &opt,
                     EventSink *also) {
  std::vector<std::unique_ptr<LogReader>> readers;
  std::vector<LogError> errors;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    auto r = std::make_unique<LogReader>(text_source(texts[i]), "log" + std::to_string(i));
    if (r->open()) {
      readers.push_back(std::move(r));
    } else {
      errors.push_back({"log" + std::to_string(i), r->error(), kExitNoInput});
    }
  }
  return read_model(std::move(readers), std::move(errors), opt, also);
}

}  // namespace cmg::report
