// SPDX-License-Identifier: Apache-2.0
// Reads cumemguard event logs (docs/log-format.md) into typed records, and merges several logs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace cmg::report {

// ordered_json keeps the field order of the log, so arguments print in the order the shim wrote
// them.
using Json = nlohmann::ordered_json;

// The newest log format this reader understands.
inline constexpr std::int64_t kLogFormat = 1;

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
};

struct Finding {
  std::string cls;
  std::string api;
  std::string action;
  std::int64_t res = 0;
  Json args = Json::object();
  std::string msg;
  std::vector<Related> related;
  Json state;  // null when absent
  std::optional<std::int64_t> bytes;
  std::optional<std::int64_t> blocked_ns;
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
};

// A record that happened at a point in time; `seq` orders it within its log.
struct Event {
  std::uint64_t seq = 0;
  std::int64_t ts = 0;
  std::int64_t tid = 0;
  std::optional<std::uint64_t> stack;
  std::variant<Call, Finding, Nccl> body;
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

struct Summary {
  std::int64_t ts = 0;
  std::vector<std::pair<std::string, std::int64_t>> calls;
  std::vector<SummaryBytes> bytes;
  std::vector<std::pair<std::string, std::int64_t>> live;
  std::vector<std::pair<std::string, std::int64_t>> findings;
};

struct Log {
  std::string file;
  Header header;
  std::vector<Event> events;  // sorted by seq (stable)
  std::map<std::uint64_t, std::vector<std::uint64_t>> stacks;
  std::vector<Module> modules;
  std::vector<Leak> leaks;
  std::vector<ConfigRecord> configs;
  std::vector<Note> notes;
  std::optional<Summary> summary;
  std::optional<std::int64_t> end_ts;                // set by the `end` record
  bool partial_last_line = false;                    // the last line was cut off mid-record
  std::size_t records = 0;                           // lines read as records, header excluded
  std::size_t malformed = 0;                         // lines or known records that did not parse
  std::map<std::string, std::size_t> unknown_kinds;  // skipped records by kind

  bool truncated() const { return partial_last_line || !end_ts; }
  // The last time the log speaks of (end, summary, last event or note), for "until" displays.
  std::int64_t last_ts() const;
};

enum class ReadStatus { Ok, Unreadable, NotALog, NewerFormat };

struct ReadResult {
  ReadStatus status = ReadStatus::Ok;
  std::string error;  // one line, without the file name, when status != Ok
  Log log;
};

// Reads a log from a stream; `name` is what messages and reports call it.
ReadResult read_log(std::istream &in, std::string name);
ReadResult read_log_file(const std::string &path);
ReadResult read_log_text(std::string_view text, std::string name);

// "0x7f3a00000000" (or a plain JSON number) -> value; nullopt when neither.
std::optional<std::uint64_t> parse_hex(const Json &v);
std::string hex(std::uint64_t v);
// A call's arguments as "name=value, ...", strings unquoted (they are hex numbers or names).
std::string args_text(const Json &args);

// One event of one log, in the merged order of several logs.
struct EventRef {
  std::size_t log;
  std::size_t event;
};

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
std::int64_t rel_time(const Log &log, std::int64_t ts, std::int64_t t0);
std::int64_t earliest_start(const std::vector<Log> &logs);

// Merges the events of several logs: each log keeps its `seq` order; across logs, the event whose
// start_unix_ns + ts is earliest goes first (ties: the log given first).
std::vector<EventRef> merge_events(const std::vector<Log> &logs);

}  // namespace cmg::report
