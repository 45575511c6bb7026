// SPDX-License-Identifier: Apache-2.0
// Reads cumemguard event logs (docs/log-format.md) as a stream of typed records, and merges
// several logs. The reader holds what is live (stacks, modules, a reorder window of events), never
// the whole log: users keep the logs of long jobs on many ranks, gigabytes each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

namespace cmg::report {

// The newest log format this reader understands.
inline constexpr std::int64_t kLogFormat = 1;

// Bounds on what one record can make the report hold or print.
inline constexpr std::size_t kMaxLine = std::size_t{16} << 20;  // longer lines are skipped
inline constexpr std::size_t kMaxText = 4096;                   // one string field, as kept
inline constexpr std::size_t kMaxValueDepth = 32;               // free-form JSON values
inline constexpr std::size_t kMaxValueBytes = 8192;
inline constexpr std::size_t kMaxFrames = 256;   // return addresses kept per stack record
inline constexpr std::size_t kMaxPyFrames = 256; // Python frames kept per stack record
inline constexpr std::size_t kMaxPyCodes = 1u << 20;  // code objects kept per log
inline constexpr std::size_t kMaxRelated = 32;   // related events kept per finding
inline constexpr std::size_t kMaxListed = 1000;  // notes, configs, modules per log
// The line buffer of one log: kMaxBuffer, or less when the file is smaller or the report reads
// many logs (set_buffer); it grows for a longer line, up to kMaxLine, and shrinks back after it.
inline constexpr std::size_t kMaxBuffer = std::size_t{1} << 20;
inline constexpr std::size_t kMinBuffer = std::size_t{4} << 10;
// All logs' buffers together stay within this (kMaxBuffer each for up to 64 logs).
inline constexpr std::size_t kBufferBudget = std::size_t{64} << 20;
// Events are released in seq order once this many are waiting (threads stamp their seq before
// they write their line, so lines can come slightly out of order).
inline constexpr std::size_t kReorderWindow = 65536;

// Text from a log (or from a module's symbols) as the report keeps and prints it: control
// characters written as \xNN by policy's escape_controls, the one escaper of every output, and
// cut at `max` bytes with a marker. A crafted log must not retitle or clear the terminal.
std::string clean(std::string_view s, std::size_t max = kMaxText);

struct Header {
  std::int64_t format = 0;
  std::string tool;
  std::int64_t pid = 0;
  std::int64_t ppid = 0;
  std::int64_t rank = -1;
  std::string host;
  std::int64_t start_unix_ns = 0;
  std::vector<std::string> argv;
  std::string mode;
  std::vector<std::pair<std::string, std::string>> options;  // as written (only non-defaults)
};

// A Python frame of a stack record: the code object (its `pycode` record), the line, and the index
// of the return address whose native frame (the interpreter's eval loop) runs it; an index past the
// last address: that frame was not captured.
struct PyFrameRef {
  std::size_t at = 0;
  std::uint64_t code = 0;
  int line = 0;
};

struct PyStackRec {
  std::vector<PyFrameRef> frames;
  std::string end;  // "", "truncated" or "unreadable" (docs/log-format.md)
};

// A code object the host interned: file (co_filename), qualified name, first line.
struct PyCode {
  std::string file, name;
  std::int64_t first_line = 0;
};

struct Module {
  std::string path;
  std::uint64_t base = 0;
  std::uint64_t size = 0;
  std::string build_id;  // hex, empty when the object has none
};

// An earlier event that a finding refers to ("first release", "allocation", ...).
struct Related {
  std::string what;
  std::string api;
  std::optional<std::uint64_t> seq;
  std::optional<std::int64_t> ts;
  std::optional<std::int64_t> tid;
  std::optional<std::uint64_t> stack;
};

struct Call {
  std::string api;
  std::int64_t res = 0;
  std::int64_t dur = 0;
  // "ptr=0x7f00, size=4096": calls are the bulk of a log, and a formatted line costs a fraction
  // of the JSON object it came from.
  std::string args;
  std::int64_t dev = -1;
  std::string mem;  // empty when the call changed no tracked memory
  std::int64_t delta = 0;
  bool skipped = false;
  bool deferred = false;
  // "quarantine" or "deferred": not a call of the program but the shim handing a free it held to
  // the driver (docs/log-format.md `released_from`); empty for the program's own calls.
  std::string released_from;
  // The arguments the crash context follows (memory lifecycle, VMM ranges), when present.
  std::optional<std::uint64_t> ptr, size, handle;
};

struct Finding {
  std::string cls;
  std::string api;
  std::string action;
  std::int64_t res = 0;
  std::string args;               // as text, like Call::args
  std::string args_json = "{}";   // compact JSON, bounded (json_bounded.h)
  std::string msg;
  std::vector<Related> related;
  std::string state_json;  // compact JSON, bounded; empty when absent
  std::optional<std::int64_t> bytes;
  std::optional<std::int64_t> blocked_ns;
  std::optional<std::uint64_t> call_seq;  // the seq of the call it is about (no call record when
                                          // strict mode stopped it)
  std::string suppressed;  // "CLASS:PATTERN" of the rule that suppressed it; empty when not
};

struct Nccl {
  std::string event;
  std::string api;
  std::string comm;
  std::optional<std::int64_t> rank;
  std::optional<std::int64_t> nranks;
  std::optional<std::int64_t> dev;
  std::int64_t res = 0;
  std::optional<std::int64_t> live;
  bool suppressed = false;
  // What a communicator holds (docs/log-format.md): registration and window calls carry the
  // buffer, its size and the handle; suspend and revoke their flags and the ranges NCCL put to
  // sleep; memstats the statistic asked and NCCL's answer.
  std::string buff, handle;
  std::optional<std::int64_t> size, flags, stat;
  std::optional<std::uint64_t> value, ranges, range_bytes;
};

// The first call that returned a distinct non-success status (docs/log-format.md `cuda_error`).
struct CudaError {
  std::string api;
  std::int64_t res = 0;
  std::string name;
  bool sticky = false;  // decided by the shim: the error poisons the context
  // The first sequence number the shim had not issued when the call returned (none in older logs).
  std::optional<std::uint64_t> ret_seq;
};

// A record that happened at a point in time; `seq` orders it within its log.
struct Event {
  std::uint64_t seq = 0;
  std::int64_t ts = 0;
  std::int64_t tid = 0;
  std::optional<std::uint64_t> stack;
  std::variant<Call, Finding, Nccl, CudaError> body;
};

struct Leak {
  std::string what;
  std::string api;
  std::string object_field;  // "ptr", "handle" or "va": which field named the object
  std::string object;        // its value as written ("0x7f00")
  std::int64_t size = 0;
  std::int64_t dev = -1;
  std::optional<std::uint64_t> seq;
  std::optional<std::uint64_t> stack;
  std::optional<std::uint64_t> capture;  // allocated for this stream capture: the graph's memory
};

// The fatal signal, from the shim's signal handler (`crash` record).
struct Crash {
  std::int64_t ts = 0;
  std::int64_t tid = 0;
  std::int64_t signal = 0;
  std::string signal_name;
  std::optional<std::uint64_t> addr;
  std::optional<std::uint64_t> stack;
};

struct ConfigRecord {
  std::string var, original, result, msg;
  bool applied = false;
};

struct Note {
  std::int64_t ts = 0;
  std::string level, msg;
};

struct SummaryBytes {
  std::int64_t dev = -1;
  std::string mem;
  std::int64_t current = 0, peak = 0, total = 0;
};

struct SuppressedRule {
  std::string cls, pattern;
  std::int64_t count = 0;
};

// The summary's `every_call_failed` (docs/log-format.md): every CUDA call the shim saw failed with
// one status (no driver, the toolkit's stub library, no device), so nothing was checked.
struct AllFailed {
  std::int64_t calls = 0, res = 0;
  std::string name, cause, fake_cuda;  // empty when the shim named none
};

struct Summary {
  std::int64_t ts = 0;
  std::vector<std::pair<std::string, std::int64_t>> calls;
  std::vector<SummaryBytes> bytes;
  std::vector<std::pair<std::string, std::int64_t>> live;
  std::vector<std::pair<std::string, std::int64_t>> findings;
  std::vector<SuppressedRule> suppressed;
  // The exporter's bridge: exports, never_requested, never_requested_bytes (docs/log-format.md).
  std::vector<std::pair<std::string, std::int64_t>> bridge;
  std::optional<AllFailed> every_call_failed;
  std::int64_t bridge_count(std::string_view k) const {
    for (const auto &[n, v] : bridge)
      if (n == k) return v;
    return 0;
  }
};

// How the process ended, as its log says (docs/report.md).
enum class Status { Complete, Crashed, Aborted, Truncated };
const char *status_name(Status s);

struct Log {
  std::string file;
  Header header;
  std::unordered_map<std::uint64_t, std::vector<std::uint64_t>> stacks;
  std::unordered_map<std::uint64_t, PyStackRec> py_stacks;  // stacks with Python frames
  std::unordered_map<std::uint64_t, PyCode> pycodes;
  std::vector<Module> modules;
  std::vector<ConfigRecord> configs;
  std::vector<Note> notes;
  std::size_t dropped = 0;  // notes, configs or modules past kMaxListed
  std::optional<Summary> summary;
  std::optional<std::int64_t> end_ts;  // set by the `end` record
  std::optional<std::int64_t> end_signal;
  std::string end_signal_name;
  bool end_aborted = false;
  bool end_quick_exit = false;  // `end` with "_exit": _exit() or _Exit(), no leak check
  std::optional<Crash> crash;
  bool partial_last_line = false;                    // the last line was cut off mid-record
  // Its process is alive on this host (process_alive.h): no end record is not yet a kill.
  bool running = false;
  std::size_t records = 0;                           // lines read as records, header excluded
  std::size_t malformed = 0;                         // lines or known records that did not parse
  std::size_t overlong = 0;                          // lines over kMaxLine, skipped (in malformed)
  std::size_t late = 0;  // events that came more than kReorderWindow events late
  std::map<std::string, std::size_t> unknown_kinds;  // skipped records by kind
  std::int64_t max_ts = 0;                           // the latest ts of any record

  Status status() const;
  bool truncated() const { return partial_last_line || !end_ts; }
  // The last time the log speaks of (end, summary, last event or note), for "until" displays.
  std::int64_t last_ts() const { return max_ts; }
};

enum class ReadStatus { Ok, Unreadable, NotALog, NewerFormat };

// Where the bytes of a log come from: a descriptor (a file, a pipe, stdin) or memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Like read(2): bytes read, 0 at the end, -1 with errno set on an error.
  virtual long read(char *buf, std::size_t n) = 0;
  // The size of a file, when the source is one: no buffer larger than the file is allocated.
  virtual std::optional<std::uint64_t> size_hint() const { return std::nullopt; }
  // The reader is done with it: a descriptor is given back now, not when the report ends.
  virtual void release() {}
};
std::unique_ptr<ByteSource> fd_source(int fd, bool owned);
std::unique_ptr<ByteSource> text_source(std::string_view text);

class LogReader {
 public:
  // `open_error`: the source could not be opened (src is null); open() reports it.
  LogReader(std::unique_ptr<ByteSource> src, std::string name, std::string open_error = {});
  ~LogReader();
  LogReader(const LogReader &) = delete;
  LogReader &operator=(const LogReader &) = delete;

  // Reads the header. False when the input is not a log this reader can read (status, error).
  bool open();
  // The usual size of the line buffer (kMinBuffer..kMaxBuffer; default kMaxBuffer); set before
  // open(). The report gives each of many logs a share of kBufferBudget.
  void set_buffer(std::size_t bytes);
  ReadStatus status() const;
  const std::string &error() const;  // one line, without the file name, when status != Ok

  // The next event in seq order; false at the end of the log (or on a read error: status
  // Unreadable). Records of other kinds update log() as they are read.
  bool next(Event &e);
  // Leak records go here as they are read (they have no seq): the report groups them at once.
  std::function<void(Leak &&)> on_leak;
  // Snapshot records (docs/log-format.md, `snapshot`) go here whole, as read: their rows are many
  // and of their own shape (report_resident.h reads them).
  std::function<void(std::string_view line)> on_snapshot;

  Log &log();
  const Log &log() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whole-log reading, for tests and small tools: every event and leak in memory.
struct ReadResult {
  ReadStatus status = ReadStatus::Ok;
  std::string error;
  Log log;
  std::vector<Event> events;  // in seq order
  std::vector<Leak> leaks;
};
ReadResult read_log_text(std::string_view text, std::string name);
ReadResult read_log_file(const std::string &path);

// True when `first_line` is a cumemguard log header (any format): the report never writes its
// output over such a file.
bool is_log_header(std::string_view first_line);

// "0x7f3a00000000" or a decimal string -> value; nullopt when neither.
std::optional<std::uint64_t> parse_hex(std::string_view s);
std::string hex(std::uint64_t v);

// Sums of numbers a log supplies saturate instead of overflowing: a log is input the report does
// not control, and a hostile one (tests/fuzz, fuzz_report) made these sums undefined behaviour.
inline std::int64_t sat_add(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? INT64_MAX : INT64_MIN;
}
inline std::int64_t sat_sub(std::int64_t a, std::int64_t b) {
  std::int64_t r;
  if (!__builtin_sub_overflow(a, b, &r)) return r;
  return b < 0 ? INT64_MAX : INT64_MIN;
}

// Time of an event relative to `t0` (the earliest log start), in ns.
inline std::int64_t rel_time(const Header &h, std::int64_t ts, std::int64_t t0) {
  return sat_add(sat_sub(h.start_unix_ns, t0), ts);
}

// Merges the events of several logs as they are read: each log keeps its `seq` order; across
// logs, the event whose start_unix_ns + ts is earliest goes first (ties: the log given first).
// `sink(log index, event)` sees every event once.
void merge_logs(std::vector<LogReader *> &readers,
                const std::function<void(std::size_t, const Event &)> &sink);

}  // namespace cmg::report
