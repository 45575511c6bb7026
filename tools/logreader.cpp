// SPDX-License-Identifier: Apache-2.0
// Event log reader: header check, record parsing, truncation detection and the merge of several
// logs.
#include "logreader.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <queue>
#include <sstream>

namespace cmg::report {
namespace {

std::string str_or(const Json &o, const char *key, std::string def = {}) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_string()) return def;
  return it->get<std::string>();
}

// Integers may come as JSON numbers or, where they can exceed 2^53, as hex strings; accept both
// everywhere so a later shim that widens a field does not make its records unreadable.
std::optional<std::int64_t> int_of(const Json &o, const char *key) {
  auto it = o.find(key);
  if (it == o.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_number_unsigned()) return static_cast<std::int64_t>(it->get<std::uint64_t>());
  if (it->is_string()) {
    if (auto v = parse_hex(*it)) return static_cast<std::int64_t>(*v);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> u64_of(const Json &o, const char *key) {
  auto it = o.find(key);
  if (it == o.end()) return std::nullopt;
  return parse_hex(*it);
}

bool bool_of(const Json &o, const char *key) {
  auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

Json object_or_empty(const Json &o, const char *key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_object()) return Json::object();
  return *it;
}

std::vector<std::pair<std::string, std::int64_t>> counts_of(const Json &o, const char *key) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  auto it = o.find(key);
  if (it == o.end() || !it->is_object()) return out;
  for (auto &[name, v] : it->items()) {
    if (v.is_number_integer() || v.is_number_unsigned())
      out.emplace_back(name, v.get<std::int64_t>());
  }
  return out;
}

// Fills seq/ts/tid/stack; false when the record has no usable seq.
bool parse_event_common(const Json &o, Event &e) {
  auto seq = u64_of(o, "seq");
  if (!seq) return false;
  e.seq = *seq;
  e.ts = int_of(o, "ts").value_or(0);
  e.tid = int_of(o, "tid").value_or(0);
  e.stack = u64_of(o, "stack");
  return true;
}

bool parse_call(const Json &o, Event &e) {
  Call c;
  c.api = str_or(o, "api");
  if (c.api.empty()) return false;
  c.res = int_of(o, "res").value_or(0);
  c.dur = int_of(o, "dur").value_or(0);
  if (auto it = o.find("args"); it != o.end()) c.args = args_text(*it);
  c.dev = int_of(o, "dev").value_or(-1);
  c.mem = str_or(o, "mem");
  c.delta = int_of(o, "delta").value_or(0);
  c.skipped = bool_of(o, "skipped");
  c.deferred = bool_of(o, "deferred");
  e.body = std::move(c);
  return true;
}

bool parse_finding(const Json &o, Event &e) {
  Finding f;
  f.cls = str_or(o, "class");
  if (f.cls.empty()) return false;
  f.api = str_or(o, "api");
  f.action = str_or(o, "action");
  f.res = int_of(o, "res").value_or(0);
  f.args = object_or_empty(o, "args");
  f.msg = str_or(o, "msg");
  if (auto it = o.find("related"); it != o.end() && it->is_array()) {
    for (const auto &r : *it) {
      if (!r.is_object()) continue;
      Related rel;
      rel.what = str_or(r, "what");
      rel.api = str_or(r, "api");
      rel.seq = u64_of(r, "seq");
      rel.ts = int_of(r, "ts");
      rel.tid = int_of(r, "tid");
      rel.stack = u64_of(r, "stack");
      f.related.push_back(std::move(rel));
    }
  }
  if (auto it = o.find("state"); it != o.end()) f.state = *it;
  f.bytes = int_of(o, "bytes");
  f.blocked_ns = int_of(o, "blocked_ns");
  e.body = std::move(f);
  return true;
}

bool parse_nccl(const Json &o, Event &e) {
  Nccl n;
  n.event = str_or(o, "event");
  if (n.event.empty()) return false;
  n.api = str_or(o, "api");
  if (auto it = o.find("comm"); it != o.end()) {
    if (it->is_string())
      n.comm = it->get<std::string>();
    else if (auto v = parse_hex(*it))
      n.comm = hex(*v);
  }
  n.rank = int_of(o, "rank");
  n.nranks = int_of(o, "nranks");
  n.dev = int_of(o, "dev");
  n.res = int_of(o, "res").value_or(0);
  n.live = int_of(o, "live");
  n.suppressed = bool_of(o, "suppressed");
  e.body = std::move(n);
  return true;
}

bool parse_header(const Json &o, Header &h) {
  h.format = int_of(o, "cumemguard_log").value_or(0);
  h.tool = str_or(o, "tool");
  h.pid = int_of(o, "pid").value_or(0);
  h.ppid = int_of(o, "ppid").value_or(0);
  h.rank = int_of(o, "rank").value_or(-1);
  h.host = str_or(o, "host");
  h.start_unix_ns = int_of(o, "start_unix_ns").value_or(0);
  if (auto it = o.find("argv"); it != o.end() && it->is_array()) {
    for (const auto &a : *it)
      if (a.is_string()) h.argv.push_back(a.get<std::string>());
  }
  h.mode = str_or(o, "mode");
  if (auto it = o.find("options"); it != o.end() && it->is_object()) {
    for (auto &[name, v] : it->items())
      h.options.emplace_back(name, v.is_string() ? v.get<std::string>() : v.dump());
  }
  return true;
}

// One record line of a known or unknown kind; false when it is malformed.
bool parse_record(const Json &o, Log &log) {
  if (!o.is_object()) return false;
  auto kit = o.find("k");
  if (kit == o.end() || !kit->is_string()) return false;
  const std::string k = kit->get<std::string>();
  if (k == "call" || k == "finding" || k == "nccl") {
    Event e;
    if (!parse_event_common(o, e)) return false;
    bool ok = k == "call"      ? parse_call(o, e)
              : k == "finding" ? parse_finding(o, e)
                               : parse_nccl(o, e);
    if (!ok) return false;
    log.events.push_back(std::move(e));
  } else if (k == "stack") {
    auto id = u64_of(o, "id");
    auto it = o.find("pcs");
    if (!id || it == o.end() || !it->is_array()) return false;
    std::vector<std::uint64_t> pcs;
    for (const auto &pc : *it) {
      auto v = parse_hex(pc);
      if (!v) return false;
      pcs.push_back(*v);
    }
    log.stacks[*id] = std::move(pcs);
  } else if (k == "module") {
    Module m;
    m.path = str_or(o, "path");
    auto base = u64_of(o, "base");
    if (m.path.empty() || !base) return false;
    m.base = *base;
    m.size = u64_of(o, "size").value_or(0);
    m.build_id = str_or(o, "build_id");
    log.modules.push_back(std::move(m));
  } else if (k == "leak") {
    Leak l;
    l.what = str_or(o, "what");
    l.api = str_or(o, "api");
    for (const char *key : {"ptr", "handle", "va"}) {
      if (auto it = o.find(key); it != o.end()) {
        l.object_field = key;
        l.object = it->is_string() ? it->get<std::string>() : it->dump();
        break;
      }
    }
    l.size = int_of(o, "size").value_or(0);
    l.dev = int_of(o, "dev").value_or(-1);
    l.seq = u64_of(o, "seq");
    l.stack = u64_of(o, "stack");
    log.leaks.push_back(std::move(l));
  } else if (k == "config") {
    ConfigRecord c;
    c.var = str_or(o, "var");
    c.original = str_or(o, "original");
    c.result = str_or(o, "result");
    c.msg = str_or(o, "msg");
    c.applied = bool_of(o, "applied");
    log.configs.push_back(std::move(c));
  } else if (k == "note") {
    Note n;
    n.ts = int_of(o, "ts").value_or(0);
    n.level = str_or(o, "level", "info");
    n.msg = str_or(o, "msg");
    log.notes.push_back(std::move(n));
  } else if (k == "summary") {
    Summary s;
    s.ts = int_of(o, "ts").value_or(0);
    s.calls = counts_of(o, "calls");
    if (auto it = o.find("bytes"); it != o.end() && it->is_array()) {
      for (const auto &b : *it) {
        if (!b.is_object()) continue;
        SummaryBytes sb;
        sb.dev = int_of(b, "dev").value_or(-1);
        sb.mem = str_or(b, "mem");
        sb.current = int_of(b, "current").value_or(0);
        sb.peak = int_of(b, "peak").value_or(0);
        sb.total = int_of(b, "total").value_or(0);
        s.bytes.push_back(std::move(sb));
      }
    }
    s.live = counts_of(o, "live");
    s.findings = counts_of(o, "findings");
    log.summary = std::move(s);
  } else if (k == "end") {
    log.end_ts = int_of(o, "ts").value_or(0);
  } else {
    ++log.unknown_kinds[k];  // a later minor version's record: skipped by contract
  }
  return true;
}

}  // namespace

std::optional<std::uint64_t> parse_hex(const Json &v) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) return static_cast<std::uint64_t>(v.get<std::int64_t>());
  if (!v.is_string()) return std::nullopt;
  const std::string &s = v.get_ref<const std::string &>();
  std::string_view sv = s;
  int base = 10;
  if (sv.size() > 2 && sv[0] == '0' && (sv[1] == 'x' || sv[1] == 'X')) {
    sv.remove_prefix(2);
    base = 16;
  }
  if (sv.empty()) return std::nullopt;
  std::uint64_t out = 0;
  auto [p, ec] = std::from_chars(sv.data(), sv.data() + sv.size(), out, base);
  if (ec != std::errc() || p != sv.data() + sv.size()) return std::nullopt;
  return out;
}

std::string hex(std::uint64_t v) {
  char buf[32];
  auto [p, ec] = std::to_chars(buf + 2, buf + sizeof buf, v, 16);
  (void)ec;
  buf[0] = '0';
  buf[1] = 'x';
  return std::string(buf, p);
}

std::string args_text(const Json &args) {
  std::string out;
  if (!args.is_object()) return out;
  for (const auto &[k, v] : args.items()) {
    if (!out.empty()) out += ", ";
    out += k + "=" +
           (v.is_string() ? v.get<std::string>()
                          : v.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
  return out;
}

std::int64_t Log::last_ts() const {
  std::int64_t t = 0;
  if (end_ts) t = std::max(t, *end_ts);
  if (summary) t = std::max(t, summary->ts);
  for (const auto &e : events) t = std::max(t, e.ts);
  for (const auto &n : notes) t = std::max(t, n.ts);
  return t;
}

ReadResult read_log(std::istream &in, std::string name) {
  ReadResult r;
  r.log.file = std::move(name);
  std::string line;
  bool have_header = false;
  errno = 0;
  while (std::getline(in, line)) {
    // getline sets eof when the line had no '\n': only the last line of a cut-off log can be so.
    const bool unterminated = in.eof();
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!have_header) {
      const Json h = Json::parse(line, nullptr, false);
      const bool is_header =
          h.is_object() && h.contains("cumemguard_log") &&
          (h["cumemguard_log"].is_number_integer() || h["cumemguard_log"].is_number_unsigned());
      if (!is_header) {
        r.status = ReadStatus::NotALog;
        r.error = "not a cumemguard log (the first line is not a log header)";
        return r;
      }
      const std::int64_t format = h["cumemguard_log"].get<std::int64_t>();
      if (format > kLogFormat) {
        r.status = ReadStatus::NewerFormat;
        r.error = "log format " + std::to_string(format) +
                  " is newer than this cumemguard understands (" + std::to_string(kLogFormat) + ")";
        return r;
      }
      if (format < 1) {
        r.status = ReadStatus::NotALog;
        r.error = "not a cumemguard log (format " + std::to_string(format) + ")";
        return r;
      }
      parse_header(h, r.log.header);
      have_header = true;
      continue;
    }
    if (line.empty()) continue;
    Json o = Json::parse(line, nullptr, false);
    if (o.is_discarded()) {
      if (unterminated)
        r.log.partial_last_line = true;
      else
        ++r.log.malformed;
      continue;
    }
    ++r.log.records;
    if (!parse_record(o, r.log)) ++r.log.malformed;
  }
  if (in.bad()) {
    r.status = ReadStatus::Unreadable;
    // errno is what the failed read(2) left: EISDIR for a directory, EIO for a bad disk.
    r.error = std::string("cannot read: ") + std::strerror(errno ? errno : EIO);
    return r;
  }
  if (!have_header) {
    r.status = ReadStatus::NotALog;
    r.error = "not a cumemguard log (the file is empty)";
    return r;
  }
  // seq, not line order, is the event order (threads may write their lines out of order).
  std::stable_sort(r.log.events.begin(), r.log.events.end(),
                   [](const Event &a, const Event &b) { return a.seq < b.seq; });
  return r;
}

ReadResult read_log_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ReadResult r;
    r.log.file = path;
    r.status = ReadStatus::Unreadable;
    r.error = std::string("cannot open: ") + std::strerror(errno);
    return r;
  }
  return read_log(in, path);
}

ReadResult read_log_text(std::string_view text, std::string name) {
  std::istringstream in{std::string(text)};
  return read_log(in, std::move(name));
}

std::int64_t earliest_start(const std::vector<Log> &logs) {
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (const auto &l : logs) t0 = std::min(t0, l.header.start_unix_ns);
  return logs.empty() ? 0 : t0;
}

std::int64_t rel_time(const Log &log, std::int64_t ts, std::int64_t t0) {
  return sat_add(sat_sub(log.header.start_unix_ns, t0), ts);
}

std::vector<EventRef> merge_events(const std::vector<Log> &logs) {
  const std::int64_t t0 = earliest_start(logs);
  struct Head {
    std::int64_t t;
    std::size_t log;
    std::size_t event;
  };
  // Earliest time first, then the log given first: a deterministic order for equal times.
  auto later = [](const Head &a, const Head &b) { return a.t != b.t ? a.t > b.t : a.log > b.log; };
  std::priority_queue<Head, std::vector<Head>, decltype(later)> heads(later);
  std::size_t total = 0;
  for (std::size_t i = 0; i < logs.size(); ++i) {
    total += logs[i].events.size();
    if (!logs[i].events.empty()) heads.push({rel_time(logs[i], logs[i].events[0].ts, t0), i, 0});
  }
  std::vector<EventRef> out;
  out.reserve(total);
  while (!heads.empty()) {
    Head h = heads.top();
    heads.pop();
    out.push_back({h.log, h.event});
    const auto &evs = logs[h.log].events;
    if (h.event + 1 < evs.size())
      heads.push({rel_time(logs[h.log], evs[h.event + 1].ts, t0), h.log, h.event + 1});
  }
  return out;
}

}  // namespace cmg::report
