// SPDX-License-Identifier: Apache-2.0
// Snapshot views (see resident_view.h).
#include "resident_view.h"

#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "program_frame.h"
#include "units.h"

namespace cmg::report {
namespace {

std::string_view basename_of(std::string_view path) {
  const auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// How stack_key_of (report_model.h) writes a Python frame whose code the log has:
// "\x01py FILE\x02FUNCTION", the line as the offset.
constexpr std::string_view kPyFrame = "\x01py ";

// The CUDA runtime, the driver and the shim itself: never the creator.
bool cuda_or_shim(std::string_view base) {
  return base.starts_with("libcuda.so") || base.starts_with("libcudart.so") ||
         base.starts_with("libcumemguard");
}

template <class V>
void largest_first(std::vector<V> &v) {
  std::stable_sort(v.begin(), v.end(), [](const V &a, const V &b) { return a.bytes > b.bytes; });
}

}  // namespace

StackKey stack_key(const Model &m, std::size_t log, std::optional<std::uint64_t> id) {
  StackKey k;
  if (!id) return k;
  const Log &l = m.logs[log];
  std::vector<const Module *> mods;
  for (const auto &md : l.modules) mods.push_back(&md);
  std::stable_sort(mods.begin(), mods.end(),
                   [](const Module *a, const Module *b) { return a->base < b->base; });
  return stack_key_of(l, log, *id, mods);
}

std::string module_of(const StackKey &k) {
  if (k.empty()) return "(no stack)";
  const std::string *last = nullptr;
  for (const auto &[path, off] : k) {
    if (path.starts_with('\x01')) continue;  // a Python frame
    if (path.starts_with("<missing")) return "(stack not in the log)";
    const std::string_view base = basename_of(path);
    if (base.empty()) return "(no module)";
    if (!cuda_or_shim(base)) return std::string(base);
    last = &path;
  }
  return last ? std::string(basename_of(*last)) : std::string("(no module)");
}

std::optional<PythonSite> python_site_of(const StackKey &k) {
  std::optional<PythonSite> first;
  for (const auto &[text, line] : k) {
    if (!text.starts_with(kPyFrame)) continue;  // native, or a code object the log lacks
    const std::string_view rest = std::string_view(text).substr(kPyFrame.size());
    const auto sep = rest.find('\x02');
    if (sep == std::string_view::npos) continue;
    PythonSite p{std::string(rest.substr(0, sep)), std::string(rest.substr(sep + 1)),
                 static_cast<std::int64_t>(line)};
    if (python_program_file(p.file)) return p;
    if (!first) first = std::move(p);
  }
  return first;
}

std::string creator_of(const StackKey &k) {
  if (auto p = python_site_of(k)) return p->file;
  return module_of(k);
}

std::string python_text(const SiteView &s) {
  if (!s.python) return "";
  return fmt::format(", at {} ({}:{})", s.python->function, s.python->file, s.python->line);
}

std::string human(std::int64_t bytes) {
  return cmg::human_bytes(bytes);
}

std::string devs_text(const std::set<std::int64_t> &devs) {
  if (devs.size() == 1 && *devs.begin() < 0) return "host or no device";
  std::string out;
  for (std::int64_t d : devs) out += (out.empty() ? "" : ", ") + dev_text(d);
  return (devs.size() == 1 ? "dev " : "devs ") + out;
}

bool after_sleep(const Snapshot &s) {
  return s.trigger == "sleep" || s.trigger == "suspend";
}

std::string trigger_text(const Snapshot &s) {
  std::string run;
  if (s.run)
    run = fmt::format(": {} {}, {} from seq {}", s.run->ranges,
                      s.run->ranges == 1 ? "range" : "ranges", human(s.run->bytes), s.run->seq);
  if (s.trigger == "sleep") return "the end of a sleep" + run + " put to sleep";
  if (s.trigger == "suspend")
    return "an NCCL suspend (" + s.label + ")" + (s.run ? run + " put to sleep" : std::string());
  if (s.trigger == "wake-up")
    return std::string(s.run && s.run->failed ? "a wake-up that failed" : "a wake-up") + run +
           " mapped again";
  if (s.trigger == "destroy") return "a communicator ended: " + s.label;
  if (s.trigger == "boundary") return "boundary " + s.label;
  if (s.trigger == "signal") return "asked for by " + s.label;
  if (s.trigger == "api") return "asked for";
  return s.trigger.empty() ? std::string("?") : s.trigger;
}

SnapView view_of(const Model &m, const Snapshot &s) {
  SnapView v;
  std::map<std::tuple<std::int64_t, std::string, std::string>, TotalView> totals;
  std::map<std::string, CreatorView> creators;
  std::map<std::tuple<StackKey, std::string, std::string, std::uint64_t>, SiteView> sites, asleep;
  std::map<std::uint64_t, StackKey> keys;  // per stack id of this log
  for (const SnapshotRow &r : s.rows) {
    const bool is_asleep = r.state == "asleep";
    TotalView &t = totals[{r.dev, r.kind, r.state}];
    t.dev = r.dev;
    t.kind = r.kind;
    t.state = r.state;
    t.bytes = sat_add(t.bytes, r.bytes);
    t.count = sat_add(t.count, r.count);
    std::optional<std::uint64_t> id;
    if (r.stack) id = r.stack;
    auto kit = keys.find(r.stack);
    if (kit == keys.end()) kit = keys.emplace(r.stack, stack_key(m, s.log, id)).first;
    const StackKey &key = kit->second;
    SiteView &site = (is_asleep ? asleep : sites)[{key, r.kind, r.state, r.graph}];
    if (site.count == 0) {
      site.log = s.log;
      site.stack = id;
      site.key = key;
      site.kind = r.kind;
      site.state = r.state;
      site.graph = r.graph;
      site.module = module_of(key);
      site.python = python_site_of(key);
      site.creator = site.python ? site.python->file : site.module;
    }
    site.devs.insert(r.dev);
    site.bytes = sat_add(site.bytes, r.bytes);
    site.count = sat_add(site.count, r.count);
    if (is_asleep) {
      v.asleep = sat_add(v.asleep, r.bytes);
      v.asleep_count = sat_add(v.asleep_count, r.count);
    } else {
      v.resident = sat_add(v.resident, r.bytes);
      v.resident_count = sat_add(v.resident_count, r.count);
      CreatorView &c = creators[site.creator];
      c.creator = site.creator;
      c.bytes = sat_add(c.bytes, r.bytes);
      c.count = sat_add(c.count, r.count);
    }
  }
  for (auto &[k, t] : totals) v.devices.push_back(std::move(t));
  for (auto &[k, c] : creators) v.creators.push_back(std::move(c));
  for (auto &[k, x] : sites) v.sites.push_back(std::move(x));
  for (auto &[k, x] : asleep) v.asleep_sites.push_back(std::move(x));
  largest_first(v.creators);
  largest_first(v.sites);
  largest_first(v.asleep_sites);
  return v;
}

}  // namespace cmg::report
