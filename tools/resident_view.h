// SPDX-License-Identifier: Apache-2.0
// One snapshot as the report's writers show it: totals, creators and sites, largest first. A site
// is a creating stack by (module, offset), so the same code is one site in every process; its
// creator is the module of its first frame outside the CUDA runtime, the driver and the shim.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "report_model.h"

namespace cmg::report {

// The program's Python frame that made the memory: the innermost frame of the program's own files
// (policy/program_frame.h), else the innermost Python frame.
struct PythonSite {
  std::string file, function;
  std::int64_t line = 0;
};

struct SiteView {
  std::size_t log = 0;
  std::optional<std::uint64_t> stack;  // one stack id of the site in `log` (to show it)
  StackKey key;  // native frames by (module, offset), Python frames by file, function and line
  std::string kind, state;
  std::string creator;  // the Python site's file where the stack has Python frames, else `module`
  std::string module;   // the first module outside the CUDA runtime, the driver and the shim
  std::optional<PythonSite> python;
  std::set<std::int64_t> devs;
  std::uint64_t graph = 0;
  std::int64_t bytes = 0, count = 0;
};

struct CreatorView {
  std::string creator;
  std::int64_t bytes = 0, count = 0;
};

struct TotalView {
  std::int64_t dev = -1;
  std::string kind, state;
  std::int64_t bytes = 0, count = 0;
};

struct SnapView {
  std::int64_t resident = 0, resident_count = 0, asleep = 0, asleep_count = 0;
  std::vector<TotalView> devices;      // resident and asleep, by device, kind and state
  std::vector<CreatorView> creators;   // resident only, largest first
  std::vector<SiteView> sites;         // resident, largest first
  std::vector<SiteView> asleep_sites;  // asleep, by the unmap's stack, largest first
};

SnapView view_of(const Model &m, const Snapshot &s);
// The stack `id` of log `log` by (module path, offset), from its addresses and the module map;
// its Python frames stand in for the eval frames that ran them, by file, function and line (as
// the findings' groups key them).
StackKey stack_key(const Model &m, std::size_t log, std::optional<std::uint64_t> id);
// "libnccl.so.2", "resident_cases", "(no stack)": native frames only.
std::string module_of(const StackKey &k);
std::optional<PythonSite> python_site_of(const StackKey &k);
// The Python site's file where the stack has one, else module_of(k).
std::string creator_of(const StackKey &k);
// Whether the snapshot was taken where memory went to sleep (the end of a sleep, an NCCL suspend):
// its resident sites are what did not go to sleep.
bool after_sleep(const Snapshot &s);
// "end of a sleep: 4 ranges, 16.0 MiB put to sleep from seq 20", "asked for", ...
std::string trigger_text(const Snapshot &s);
std::string human(std::int64_t bytes);                      // "16.0 MiB"
std::string devs_text(const std::set<std::int64_t> &devs);  // "dev 0", "devs 0, 1", "host"
// ", at alloc (train.py:20)" for a site made from Python, "" for one that was not.
std::string python_text(const SiteView &s);
// The HTML page's chart of one snapshot: inline SVG, one bar per creator and one for what is
// asleep.
void write_snapshot_chart(std::ostream &out, const Snapshot &s, const SnapView &v);

}  // namespace cmg::report
