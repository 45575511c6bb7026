// SPDX-License-Identifier: Apache-2.0
// What a report says, computed once from the logs and then written as text, JSON or a trace.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "logreader.h"
#include "symbolize.h"

namespace cmg::report {

struct ReportOptions {
  bool json = false;
  std::string trace_path;  // empty: no trace
  bool symbolize = true;
  std::size_t top = 10;  // rows of ranked tables (0 = all)
  bool fail_on_leaks = false;
  std::int64_t slow_ns = 1'000'000;  // calls at least this long become complete events in the trace
};

// A log named on the command line that could not be used.
struct LogError {
  std::string file;
  std::string error;
  int exit_status = 2;
};

// Frames by (module, offset): the same code has the same key in every process, whatever the
// address space layout, so groups span ranks. A pc outside every module keys as ("", pc).
using StackKey = std::vector<std::pair<std::string, std::uint64_t>>;

struct ResolvedStack {
  std::size_t log = 0;              // the log whose addresses `frames` are
  std::optional<std::uint64_t> id;  // the log's stack id; nullopt when the event had none
  bool missing = false;             // an id the log never defined (cut off before it)
  std::vector<Frame> frames;
  StackKey key;
};

struct FindingGroup {
  ResolvedStack stack;
  std::size_t count = 0;
  std::int64_t first_t = 0, last_t = 0;  // relative to the report's t0
  std::map<std::string, std::size_t> actions;
  std::set<std::size_t> logs;
  std::optional<std::int64_t> bytes;  // sums of the class-specific numbers, when any carries one
  std::optional<std::int64_t> blocked_ns;
  EventRef example{};  // the first occurrence
};

struct FindingClassGroup {
  std::string cls;
  std::string help;  // from policy/findings.def; empty for an unknown class
  std::size_t count = 0;
  std::optional<std::int64_t> at_exit;  // summed `summary.findings`, when any log has a summary
  std::vector<FindingGroup> groups;
};

struct LeakGroup {
  ResolvedStack stack;
  std::string api;
  std::size_t count = 0;
  std::int64_t bytes = 0;
  std::map<std::string, std::size_t> what;
  std::set<std::size_t> logs;
  std::pair<std::size_t, std::size_t> example{};  // (log, index into Log::leaks)
};

struct MemoryRow {
  std::size_t log = 0;
  std::int64_t dev = -1;
  std::string mem;
  bool from_events = false;  // some call record carried a delta for it
  std::int64_t current = 0, peak = 0, peak_t = 0;
  std::int64_t allocated = 0, freed = 0;  // sums of positive / negative deltas
  std::optional<SummaryBytes> at_exit;
};

struct SiteRow {
  ResolvedStack stack;
  std::int64_t bytes = 0;
  std::size_t count = 0;
  std::set<std::string> apis;
  std::set<std::size_t> logs;
};

struct CallRow {
  std::string api;
  std::size_t count = 0, errors = 0, skipped = 0, deferred = 0;
  std::int64_t dur_total = 0, dur_max = 0;
  std::optional<std::int64_t> at_exit;  // summed `summary.calls`
};

struct CommRow {
  std::size_t log = 0;
  std::string comm;
  std::optional<EventRef> created;  // init, split or shrink
  std::optional<EventRef> ended;    // destroy or abort (finalize alone leaves it live)
  std::optional<EventRef> finalized;
  std::size_t events = 0;
};

struct Model {
  std::vector<Log> logs;
  std::vector<LogError> errors;
  mutable std::vector<Symbolizer> symbolizers;  // one per log; symbolizing fills their caches
  std::vector<std::string> labels;              // per log: "r0", "p4242", unique within the report
  std::int64_t t0 = 0;                          // earliest start_unix_ns
  std::vector<EventRef> order;                  // merged event order

  std::vector<FindingClassGroup> findings;
  std::size_t finding_count = 0;
  std::vector<LeakGroup> leaks;
  std::size_t leak_count = 0;
  std::int64_t leak_bytes = 0;
  std::vector<MemoryRow> memory;
  std::vector<SiteRow> sites;  // all, ranked; writers show the top N
  std::vector<CallRow> calls;
  std::vector<EventRef> nccl;
  std::vector<CommRow> comms;

  const std::string &label(std::size_t log) const { return labels[log]; }
  const Event &event(EventRef r) const { return logs[r.log].events[r.event]; }
  std::int64_t time(EventRef r) const { return rel_time(logs[r.log], event(r).ts, t0); }
  std::int64_t time(std::size_t log, std::int64_t ts) const { return rel_time(logs[log], ts, t0); }
  // The stack `id` of log `log`, symbolized (cached).
  const ResolvedStack &stack(std::size_t log, std::optional<std::uint64_t> id) const;
  bool truncated_any() const;
  int exit_status(const ReportOptions &opt) const;

 private:
  mutable std::map<std::pair<std::size_t, std::uint64_t>, ResolvedStack> stack_cache_;
  mutable ResolvedStack no_stack_;
};

Model build_model(std::vector<Log> logs, std::vector<LogError> errors, const ReportOptions &opt);

// "rank 0 (pid 4242)" or "pid 4242".
std::string log_label(const Log &log);

void write_text(const Model &m, const ReportOptions &opt, std::ostream &out);
Json report_json(const Model &m, const ReportOptions &opt);
// Chrome trace-event JSON (the object form), as Perfetto and chrome://tracing open it.
Json trace_json(const Model &m, const ReportOptions &opt);

}  // namespace cmg::report
