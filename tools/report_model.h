// SPDX-License-Identifier: Apache-2.0
// What a report says, computed in one pass over the logs (streamed, merged) and then written as
// text, JSON, HTML or a trace. It holds aggregates: groups, sites, rows, one example per group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "logreader.h"
#include "report_resident.h"
#include "symbolize.h"

namespace cmg::report {

// ordered_json keeps the field order the writers give.
using Json = nlohmann::ordered_json;

struct ReportOptions {
  bool json = false;
  std::string trace_path;   // empty: no trace
  std::string html_path;    // empty: no HTML page
  std::string output_path;  // empty: the text or JSON report goes to stdout
  bool symbolize = true;
  std::size_t top = 10;  // rows of ranked tables (0 = all)
  bool fail_on_leaks = false;
  bool gen_suppressions = false;
  bool full_stacks = false;  // the text report prints every frame (no fold below main or <module>)
  std::int64_t slow_ns = 1'000'000;  // calls at least this long become complete events in the trace
};

// Exit statuses (docs/report.md): one convention for every cumemguard command.
inline constexpr int kExitFindings = 1;
inline constexpr int kExitUsage = 64;
inline constexpr int kExitNoInput = 66;
inline constexpr int kExitCantCreate = 73;

// A log named on the command line that could not be used.
struct LogError {
  std::string file;
  std::string error;
  int exit_status = kExitNoInput;
};

// Frames by (module, offset): the same code has the same key in every process, whatever the
// address space layout, so groups span ranks. A pc outside every module keys as ("", pc).
using StackKey = std::vector<std::pair<std::string, std::uint64_t>>;

// The module a pc falls in by a log's module map, sorted by base ([base, base+size), the highest
// base wins), and the offset in it; ("", pc) when none holds it.
std::pair<std::string, std::uint64_t> module_offset(const std::vector<const Module *> &sorted,
                                                    std::uint64_t pc);
// The stack `id` of log `l` (number `log` of the report) as a key: native frames by (module path,
// offset) with `sorted` as above; Python frames, in place of the eval frames that ran them, as
// ("\x01py FILE\x02FUNCTION", line), or ("\x01py CODE of log N", line) for a code object the log
// has no record of, and a truncated or unreadable Python stack's ("\x01py_end WHAT", 0): the same
// Python site in two processes (or at two addresses) is one key. ("<missing stack ...>", 0) for
// an id the log has no stack record of.
StackKey stack_key_of(const Log &l, std::size_t log, std::uint64_t id,
                      const std::vector<const Module *> &sorted);

// A stack of one log, symbolized when a writer asks for it.
struct StackRef {
  std::size_t log = 0;
  std::optional<std::uint64_t> id;
};

struct ResolvedStack {
  std::size_t log = 0;              // the log whose addresses `frames` are
  std::optional<std::uint64_t> id;  // the log's stack id; nullopt when the event had none
  bool missing = false;             // an id the log never defined (cut off before it)
  std::vector<Frame> frames;
};

// An event kept as an example (the first of its group).
struct Example {
  std::size_t log = 0;
  Event event;
};

struct FindingGroup {
  StackRef stack;
  std::size_t count = 0;
  std::int64_t first_t = 0, last_t = 0;  // relative to the report's t0
  std::map<std::string, std::size_t> actions;
  std::set<std::size_t> logs;
  std::optional<std::int64_t> bytes;  // sums of the class-specific numbers, when any carries one
  std::optional<std::int64_t> blocked_ns;
  Example example;  // the first occurrence
  const Finding &finding() const { return std::get<Finding>(example.event.body); }
};

struct FindingClassGroup {
  std::string cls;
  std::string help;  // from policy/findings.def; empty for an unknown class
  std::size_t count = 0;
  std::optional<std::int64_t> at_exit;  // summed `summary.findings`, when any log has a summary
  std::vector<FindingGroup> groups;
};

// Findings a suppression rule silenced (counted apart; they never change the exit status).
struct SuppressedRow {
  std::string cls, pattern;
  std::size_t count = 0;                // finding records
  std::optional<std::int64_t> at_exit;  // summed `summary.suppressed` counts
  std::set<std::size_t> logs;
};

struct LeakGroup {
  StackRef stack;
  std::string api;
  std::size_t count = 0;
  std::int64_t bytes = 0;
  std::map<std::string, std::size_t> what;
  std::set<std::size_t> logs;
  std::size_t example_log = 0;
  Leak example;
};

// Bytes over time of one row, kept to a bounded number of points: when they fill up, pairs of
// neighbours merge and the bucket doubles (the peak of each bucket is kept).
struct Series {
  struct Point {
    std::int64_t t = 0;     // start of the bucket (report time)
    std::int64_t max = 0;   // highest value in the bucket
    std::int64_t last = 0;  // value at its end
  };
  static constexpr std::size_t kMaxPoints = 1024;
  std::vector<Point> points;
  std::int64_t origin = 0, bucket = 1;
  void add(std::int64_t t, std::int64_t value);
};

struct MemoryRow {
  std::size_t log = 0;
  std::int64_t dev = -1;
  std::string mem;
  bool from_events = false;  // some call record carried a delta for it
  std::int64_t current = 0, peak = 0, peak_t = 0;
  std::int64_t allocated = 0, freed = 0;  // sums of positive / negative deltas
  std::optional<SummaryBytes> at_exit;
  Series series;
};

struct SiteRow {
  StackRef stack;
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

// Frees the shim held (its quarantine, deferred cache flushes) and handed to the driver itself:
// logged as calls with `released_from`, never counted as the program's calls.
struct ShimReleaseRow {
  std::string from;  // "quarantine" or "deferred"
  std::string api;
  std::size_t count = 0, errors = 0;
  std::int64_t bytes = 0;
};

struct NcclPoint {
  std::int64_t t = 0;
  std::string api, event;
};

// An interval a communicator spent suspended (ncclCommSuspend with NCCL_SUSPEND_MEM, until the
// ncclCommResume that succeeded; open: suspended at the end of the log).
struct SuspendedSpan {
  std::int64_t from = 0;
  std::optional<std::int64_t> to;
  std::uint64_t ranges = 0, range_bytes = 0;  // what NCCL put to sleep
};

// A registration or window of a communicator (ncclCommRegister, ncclCommWindowRegister).
struct RegRow {
  bool window = false;
  std::string handle, buff;
  std::int64_t size = 0;
  std::int64_t t = 0;
  std::uint64_t seq = 0;
  unsigned refs = 1;               // registrations inside a slot share its handle
  std::optional<std::int64_t> ended;  // deregistered (or with the communicator)
};

struct CommRow {
  std::size_t log = 0;
  std::string comm;
  std::optional<NcclPoint> created;  // init, split, shrink or grow
  std::optional<NcclPoint> ended;    // destroy or abort (finalize alone leaves it live)
  std::optional<NcclPoint> finalized;
  std::optional<NcclPoint> revoked;
  std::size_t events = 0;
  std::vector<SuspendedSpan> suspended;
  // The last answer of ncclCommMemStats for each statistic (ncclCommMemStat_t: 0 suspendable
  // bytes, 1 suspended, 2 persistent bytes, 3 total bytes), and when it was given.
  std::map<std::int64_t, std::uint64_t> mem_stats;
  std::optional<std::int64_t> mem_stats_t;
  std::vector<RegRow> regs;  // at most kMaxRegs
  std::size_t regs_made = 0, windows_made = 0, regs_dropped = 0;
  static constexpr std::size_t kMaxRegs = 256;
};

// --- how each process ended (report_outcome.cpp) --------------------------------------------------

// A free, unmap, release or address free near the crash or the first sticky error.
struct LifeEvent {
  std::string api, args;
  std::uint64_t seq = 0;
  std::int64_t tid = 0, t = 0, res = 0;
  bool skipped = false;
  // The call strict mode stopped (from its finding: it was never forwarded, so it has no call
  // record of its own); the class of that finding.
  std::string stopped_by;
};

// A VMM range mapped, then unmapped, whose reservation was not freed: asleep when the call that
// returned the first sticky CUDA error returned (logs before `ret_seq`: when it began), or at the
// end of the log when there was none.
struct AsleepRange {
  std::uint64_t ptr = 0, size = 0;
  std::uint64_t reservation = 0, reservation_size = 0;
  std::uint64_t unmap_seq = 0;
  std::int64_t unmap_tid = 0;
  std::optional<std::uint64_t> unmap_stack;  // the stack id of the unmap that put it to sleep
};

struct ErrorPoint {
  std::uint64_t seq = 0;
  std::int64_t tid = 0, t = 0;
  std::optional<std::uint64_t> stack;
  CudaError error;
};

struct Outcome {
  Status status = Status::Complete;
  bool running = false;  // Truncated only: the process is still alive (Log::running)
  bool quick_exit = false;  // Complete, ended by _exit()/_Exit(): no leak check was made
  std::optional<std::int64_t> signal;
  std::string signal_name;
  std::optional<Crash> crash;
  std::vector<ErrorPoint> errors;  // each distinct status, first call first
  std::optional<ErrorPoint> first_sticky;
  std::vector<LifeEvent> lifecycle;  // oldest first, at most 8
  bool lifecycle_before_error = false;
  bool lifecycle_to_abort = false;  // ends with the call strict mode stopped
  std::vector<AsleepRange> asleep;  // the last sleep first, at most 16
  std::size_t asleep_total = 0;
  bool asleep_at_error = false;  // taken when the first sticky error was returned
  // Every CUDA call failed with one status (the summary's every_call_failed): nothing was checked.
  std::optional<AllFailed> all_failed;
  // Leads the text report: not complete, a context poisoned by a sticky error, or no CUDA call
  // that worked.
  bool explain() const {
    return status != Status::Complete || first_sticky.has_value() || all_failed.has_value();
  }
};

class OutcomeTracker {
 public:
  OutcomeTracker();
  ~OutcomeTracker();
  OutcomeTracker(OutcomeTracker &&) noexcept;
  OutcomeTracker &operator=(OutcomeTracker &&) noexcept;
  void event(const Event &e, std::int64_t t);
  Outcome finish(const Log &log);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ----------------------------------------------------------------------------------------------

struct Model {
  std::vector<Log> logs;
  std::vector<LogError> errors;
  std::vector<std::string> duplicates;  // "b.log: the same log as a.log; counted once"
  mutable std::vector<std::unique_ptr<Symbolizer>> symbolizers;  // one per log, made on demand
  bool symbolize = true;
  std::vector<std::string> labels;  // per log: "r0", "p4242", unique within the report
  std::int64_t t0 = 0;              // earliest start_unix_ns

  std::vector<FindingClassGroup> findings;
  std::size_t finding_count = 0;
  std::vector<SuppressedRow> suppressed;
  std::size_t suppressed_count = 0;  // records, or the summaries' counts where those are higher
  std::vector<LeakGroup> leaks;
  std::size_t leak_count = 0;
  std::int64_t leak_bytes = 0;
  std::vector<std::pair<std::size_t, std::int64_t>> log_leaks;  // per log: objects, bytes
  std::vector<MemoryRow> memory;
  std::vector<SiteRow> sites;  // all, ranked; writers show the top N
  std::vector<CallRow> calls;  // the program's calls
  std::vector<ShimReleaseRow> shim_releases;
  std::vector<Example> nccl;  // at most kMaxNccl
  std::size_t nccl_dropped = 0;
  std::vector<CommRow> comms;
  std::vector<Outcome> outcomes;  // per log
  ResidentModel resident;         // snapshots of what is resident (report_resident.h)

  static constexpr std::size_t kMaxNccl = 10000;

  const std::string &label(std::size_t log) const { return labels[log]; }
  std::int64_t time(std::size_t log, std::int64_t ts) const {
    return rel_time(logs[log].header, ts, t0);
  }
  // The stack `id` of log `log`, symbolized (cached).
  const ResolvedStack &stack(std::size_t log, std::optional<std::uint64_t> id) const;
  const ResolvedStack &stack(const StackRef &r) const { return stack(r.log, r.id); }
  Symbolizer &symbolizer(std::size_t log) const;
  // Symbolizes every stack a writer shows, so the logs' symbol warnings are complete before the
  // first line is written.
  void resolve_shown(const ReportOptions &opt) const;
  bool truncated_any() const;
  // Lines of the logs that did not parse (a record cut or with a bad field): what they said is
  // not known, so the report is not clean (exit status 1) and its first line says how many.
  std::size_t unreadable_records() const;
  // Finding classes the shim's summaries counted more of than there are readable records, as
  // "double-free 1" (the counts at exit), leaks apart.
  std::vector<std::string> counted_not_read() const;
  // Some process crashed, aborted or was cut off: leaks at exit are not known for it.
  bool all_complete() const;
  // Every log complete and each one's leaks checked (not ended by _exit).
  bool leaks_known() const;
  int exit_status(const ReportOptions &opt) const;

 private:
  mutable std::map<std::pair<std::size_t, std::uint64_t>, ResolvedStack> stack_cache_;
  mutable ResolvedStack no_stack_;
};

// Sees the merged events as they are read, next to the model (the trace writer).
class EventSink {
 public:
  virtual ~EventSink() = default;
  // Headers are read; `labels` and `t0` are the model's.
  virtual void start(const std::vector<const Log *> &logs, const std::vector<std::string> &labels,
                     std::int64_t t0) = 0;
  virtual void event(std::size_t log, const Event &e) = 0;
  // Every log is read to its end.
  virtual void finish(const Model &m) = 0;
};

// Reads opened logs (headers read) to their end in merged order and builds the model; `also`
// sees the same events.
Model read_model(std::vector<std::unique_ptr<LogReader>> readers, std::vector<LogError> errors,
                 const ReportOptions &opt, EventSink *also = nullptr);
// Logs in memory (tests, the fuzzer): the ones that do not open become errors.
Model model_of_texts(const std::vector<std::string> &texts, const ReportOptions &opt,
                     EventSink *also = nullptr);

// "every CUDA call failed (3 calls) with 35 (cudaErrorInsufficientDriver)".
std::string all_failed_short(const AllFailed &a);
// The same with the likely cause and the build's fake CUDA stack, as the exit summary says it.
std::string all_failed_long(const AllFailed &a);
// The logs nothing was checked in (every CUDA call failed), as the first line of the text report
// and of the page say it: "not checked: every CUDA call failed (3 calls) with 35 (...)", "p12 not
// checked: ..." when other logs were; "" when every log had a call that worked (or none).
std::string not_checked_text(const Model &m);
std::size_t not_checked_count(const Model &m);

// "rank 0 (pid 4242)" or "pid 4242".
std::string log_label(const Log &log);
// The device as the exit summary prints it: "-" for host memory or unknown (-1).
std::string dev_text(std::int64_t dev);

void write_text(const Model &m, const ReportOptions &opt, std::ostream &out);
// The text report's first line: logs, findings by class, leaks, crashed or cut-off processes.
void write_headline(const Model &m, std::ostream &out);
// `--gen-suppressions`: one rule per finding group shown (docs/report.md).
void write_suppressions(const Model &m, std::ostream &out);
Json report_json(const Model &m, const ReportOptions &opt);
// The self-contained HTML page (report_html.cpp).
void write_html(const Model &m, const ReportOptions &opt, std::ostream &out);

// Chrome trace-event JSON (the object form), as Perfetto and chrome://tracing open it, written as
// events arrive: memory is what is live, not the length of the log.
std::unique_ptr<EventSink> trace_writer(const ReportOptions &opt,
                                        std::function<void(std::string_view)> write);

}  // namespace cmg::report
