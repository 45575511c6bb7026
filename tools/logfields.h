// SPDX-License-Identifier: Apache-2.0
// The fields of one event-log record line, gathered in one pass with simdjson's On-Demand API
// (the reader, logreader.cpp, interprets them by the record's kind), and the value readers the
// header shares. Internal to the report tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

// simdjson's On-Demand iterators assert their own invariants (SIMDJSON_ASSUME) unless NDEBUG is
// set, and a debugoptimized build keeps asserts on for our code: those checks took a fifth of the
// reader's time. They are off for simdjson only; <cassert> is included again after it.
#pragma push_macro("NDEBUG")
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <simdjson.h>
#pragma pop_macro("NDEBUG")
#include <cassert>

#include "logreader.h"

namespace cmg::report::fields {
namespace od = simdjson::ondemand;

// A call's or finding's arguments as "name=value, ...": strings unquoted (they are hex numbers
// or names), other values as bounded JSON; the numbers the crash context follows.
struct ArgsInfo {
  std::string text;
  std::optional<std::uint64_t> ptr, size, handle;
};

// Every field any record kind has, gathered in one pass over the line's object (On-Demand reads
// forward only), then interpreted by kind.
struct Fields {
  std::string k;
  std::optional<std::uint64_t> seq, stack, id, base, addr, mod_size, ret_seq, capture, call_seq;
  std::optional<std::int64_t> ts, tid, res, dur, dev, delta, bytes, blocked_ns, rank, nranks, live,
      size, signal, cumemguard_log;
  std::optional<std::int64_t> flags, stat;                 // nccl: suspend, revoke; memstats
  std::optional<std::uint64_t> value, ranges, range_bytes;  // nccl: memstats; suspend
  std::optional<std::string> api, mem, cls, action, msg, event, comm, buff, path, build_id, what, var,
      original, result, level, signal_name, name, suppressed_rule, object, object_field, file,
      py_end, released_from;
  std::optional<std::int64_t> first;
  bool skipped = false, deferred = false, applied = false, aborted = false, sticky = false,
       suppressed_flag = false, quick_exit = false;
  bool args_is_object = false;
  std::string_view args_raw;  // into the line
  bool have_state = false;
  std::string state_json;
  std::vector<Related> related;
  bool have_pcs = false, pcs_ok = true;
  std::vector<std::uint64_t> pcs;
  bool py_ok = true;
  std::vector<PyFrameRef> py;
  std::vector<std::pair<std::string, std::int64_t>> calls, findings, live_counts, bridge;
  std::vector<SummaryBytes> summary_bytes;
  std::vector<SuppressedRule> rules;
  std::optional<AllFailed> all_failed;  // summary: every_call_failed
  ArgsInfo call_args;
  bool call_args_done = false;
};

// One record line into `f`; false when its JSON is broken. `room`: readable bytes from the line's
// start (simdjson reads past the end of a document, up to its padding).
bool read_record(od::parser &parser, std::string_view line, std::size_t room, Fields &f);
// A call's or finding's arguments (an object) as text and the numbers the crash context follows.
bool read_args(od::object o, ArgsInfo &a);

// Value readers shared with the header: a key as written, a value's raw JSON text, numbers (JSON
// numbers or hex strings), text (escaped by clean()).
bool key_of(simdjson::simdjson_result<od::field> &field, std::string_view &out);
std::optional<std::string_view> raw_of(od::value &v);
std::optional<std::uint64_t> u64_of(od::value &v);
std::optional<std::int64_t> i64_of(od::value &v);
std::optional<std::string> str_of(od::value &v);

}  // namespace cmg::report::fields
