// SPDX-License-Identifier: Apache-2.0
// Event log reader: lines from a descriptor in large reads, each line parsed with simdjson's
// On-Demand API, events released in seq order through a bounded reorder window, and the merge of
// several logs. Free-form values are re-written bounded (json_bounded.h); nothing recurses on
// input.
#include "logreader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <queue>

#include <fmt/format.h>

// simdjson's On-Demand iterators assert their own invariants (SIMDJSON_ASSUME) unless NDEBUG is
// set, and a debugoptimized build keeps asserts on for our code: those checks took a fifth of the
// reader's time. They are off for simdjson only; <cassert> is included again for this file.
#pragma push_macro("NDEBUG")
#ifndef NDEBUG
#define NDEBUG 1
#endif
#include <simdjson.h>
#pragma pop_macro("NDEBUG")
#include <cassert>

#include "json_bounded.h"
#include "options.h"

namespace cmg::report {
namespace od = simdjson::ondemand;
using simdjson::SUCCESS;
using namespace std::string_view_literals;

namespace {

bool is_control(const unsigned char *p, std::size_t i, std::size_t n) {
  const unsigned char c = p[i];
  if (c < 0x20 || c == 0x7f) return true;
  // U+0080..U+009F (C1 controls, UTF-8 C2 80..C2 9F): some terminals act on them too.
  return c == 0xC2 && i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9F;
}

class FdSource final : public ByteSource {
 public:
  FdSource(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~FdSource() override {
    if (owned_ && fd_ >= 0) ::close(fd_);
  }
  long read(char *buf, std::size_t n) override {
    for (;;) {
      const ssize_t r = ::read(fd_, buf, n);
      if (r < 0 && errno == EINTR) continue;
      return static_cast<long>(r);
    }
  }

 private:
  int fd_;
  bool owned_;
};

class TextSource final : public ByteSource {
 public:
  explicit TextSource(std::string_view t) : text_(t) {}
  long read(char *buf, std::size_t n) override {
    const std::size_t k = std::min(n, text_.size() - pos_);
    std::memcpy(buf, text_.data() + pos_, k);
    pos_ += k;
    return static_cast<long>(k);
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

// A field's key as written, escapes not decoded (keys the reader knows have none): faster than
// unescaping every key of every record.
bool key_of(simdjson::simdjson_result<od::field> &field, std::string_view &out) {
  od::raw_json_string raw;
  if (field.key().get(raw) != SUCCESS) return false;
  const char *p = raw.raw();
  // The key ends at the first quote not escaped; stage 1 found it, so it is there.
  const char *q = static_cast<const char *>(rawmemchr(p, '"'));
  while (q[-1] == '\\') {
    std::size_t slashes = 0;
    for (const char *b = q - 1; b >= p && *b == '\\'; --b) ++slashes;
    if (slashes % 2 == 0) break;
    q = static_cast<const char *>(rawmemchr(q + 1, '"'));
  }
  out = std::string_view(p, static_cast<std::size_t>(q - p));
  return true;
}

// The raw JSON text of any value (a container whole, a scalar's token).
std::optional<std::string_view> raw_of(od::value &v) {
  od::json_type t;
  if (v.type().get(t) != SUCCESS) return std::nullopt;
  std::string_view raw;
  if (t == od::json_type::object) {
    od::object o;
    if (v.get_object().get(o) != SUCCESS || o.raw_json().get(raw) != SUCCESS) return std::nullopt;
  } else if (t == od::json_type::array) {
    od::array a;
    if (v.get_array().get(a) != SUCCESS || a.raw_json().get(raw) != SUCCESS) return std::nullopt;
  } else {
    raw = v.raw_json_token();
    while (!raw.empty() && (raw.back() == ' ' || raw.back() == '\t' || raw.back() == '\n' ||
                            raw.back() == '\r'))
      raw.remove_suffix(1);
  }
  return raw;
}

// Integers may come as JSON numbers or, where they can exceed 2^53, as hex strings; accept both
// everywhere so a later shim that widens a field does not make its records unreadable.
std::optional<std::uint64_t> u64_of(od::value &v) {
  std::uint64_t fast = 0;
  if (v.get_uint64().get(fast) == SUCCESS) return fast;  // the common case, first
  od::json_type t;
  if (v.type().get(t) != SUCCESS) return std::nullopt;
  if (t == od::json_type::number) {
    od::number n;
    if (v.get_number().get(n) != SUCCESS) return std::nullopt;
    if (n.is_uint64()) return n.get_uint64();
    if (n.is_int64()) return static_cast<std::uint64_t>(n.get_int64());
    return std::nullopt;
  }
  if (t == od::json_type::string) {
    std::string_view s;
    if (v.get_string().get(s) != SUCCESS) return std::nullopt;
    return parse_hex(s);
  }
  return std::nullopt;
}

std::optional<std::int64_t> i64_of(od::value &v) {
  auto u = u64_of(v);
  if (!u) return std::nullopt;
  return static_cast<std::int64_t>(*u);
}

std::optional<std::string> str_of(od::value &v) {
  std::string_view s;
  if (v.get_string().get(s) != SUCCESS) return std::nullopt;
  return clean(s);
}

// A string's text, or any other value's JSON token.
std::optional<std::string> text_of(od::value &v, od::json_type t) {
  if (t == od::json_type::string) return str_of(v);
  auto raw = raw_of(v);
  if (!raw) return std::nullopt;
  return bounded_json(*raw, 4, 256);
}

bool bool_of(od::value &v) {
  bool b = false;
  return v.get_bool().get(b) == SUCCESS && b;
}

std::vector<std::pair<std::string, std::int64_t>> counts_of(od::value &v) {
  std::vector<std::pair<std::string, std::int64_t>> out;
  od::object o;
  if (v.get_object().get(o) != SUCCESS) return out;
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) break;
    od::value fv;
    if (field.value().get(fv) != SUCCESS) break;
    od::json_type t;
    if (fv.type().get(t) != SUCCESS || t != od::json_type::number) continue;
    if (auto n = i64_of(fv); n && out.size() < kMaxListed) out.emplace_back(clean(k), *n);
  }
  return out;
}

// A call's or finding's arguments as "name=value, ...": strings unquoted (they are hex numbers
// or names), other values as bounded JSON; the numbers the crash context follows.
struct ArgsInfo {
  std::string text;
  std::optional<std::uint64_t> ptr, size, handle;
};

// The common case of a call's arguments, read in one pass over their raw text: a flat object of
// plain strings and numbers, as the shim writes them. False for anything else (escapes, nesting,
// non-ASCII), which the On-Demand path reads instead.
bool flat_args(std::string_view raw, ArgsInfo &a) {
  std::size_t i = 0;
  const std::size_t n = raw.size();
  auto ws = [&] {
    while (i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r')) ++i;
  };
  auto plain = [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f && c != '\\';
  };
  ws();
  if (i >= n || raw[i] != '{') return false;
  ++i;
  ws();
  if (i < n && raw[i] == '}') return true;
  a.text.reserve(n);
  for (;;) {
    ws();
    if (i >= n || raw[i] != '"') return false;
    const std::size_t ks = ++i;
    while (i < n && raw[i] != '"') {
      if (!plain(raw[i])) return false;
      ++i;
    }
    if (i >= n) return false;
    const std::string_view key = raw.substr(ks, i - ks);
    ++i;
    ws();
    if (i >= n || raw[i] != ':') return false;
    ++i;
    ws();
    std::string_view value;
    if (i < n && raw[i] == '"') {
      const std::size_t vs = ++i;
      while (i < n && raw[i] != '"') {
        if (!plain(raw[i])) return false;
        ++i;
      }
      if (i >= n) return false;
      value = raw.substr(vs, i - vs);
      ++i;
    } else {
      const std::size_t vs = i;
      while (i < n && ((raw[i] >= '0' && raw[i] <= '9') || raw[i] == '-' || raw[i] == '+' ||
                       raw[i] == '.' || raw[i] == 'e' || raw[i] == 'E' ||
                       (raw[i] >= 'a' && raw[i] <= 'z')))
        ++i;
      value = raw.substr(vs, i - vs);
      if (value.empty()) return false;
    }
    if (!a.text.empty()) a.text += ", ";
    a.text.append(key);
    a.text += '=';
    a.text.append(value);
    if (key == "ptr"sv) a.ptr = parse_hex(value);
    else if (key == "handle"sv) a.handle = parse_hex(value);
    else if (key == "size"sv) a.size = parse_hex(value);
    ws();
    if (i >= n) return false;
    if (raw[i] == '}') return true;
    if (raw[i] != ',') return false;
    ++i;
  }
}

bool args_of(od::object o, ArgsInfo &a) {
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) return false;
    od::value v;
    if (field.value().get(v) != SUCCESS) return false;
    if (!a.text.empty()) a.text += ", ";
    a.text += clean(k, 256);
    a.text += '=';
    od::json_type t;
    if (v.type().get(t) != SUCCESS) return false;
    if (t == od::json_type::string) {
      std::string_view s;
      if (v.get_string().get(s) != SUCCESS) return false;
      a.text += clean(s, 256);
      if (k == "ptr"sv) a.ptr = parse_hex(s);
      if (k == "handle"sv) a.handle = parse_hex(s);
      if (k == "size"sv) a.size = parse_hex(s);
    } else {
      auto raw = raw_of(v);
      if (!raw) return false;
      if (t == od::json_type::object || t == od::json_type::array)
        a.text += bounded_json(*raw, 4, 512);
      else
        a.text += clean(*raw, 256);
      if (t == od::json_type::number) {
        if (k == "size"sv) a.size = parse_hex(*raw);
        if (k == "ptr"sv) a.ptr = parse_hex(*raw);
      }
    }
  }
  return true;
}

// Every field any record kind has, gathered in one pass over the line's object (On-Demand reads
// forward only), then interpreted by kind.
struct Fields {
  std::string k;
  std::optional<std::uint64_t> seq, stack, id, base, addr, mod_size;
  std::optional<std::int64_t> ts, tid, res, dur, dev, delta, bytes, blocked_ns, rank, nranks, live,
      size, signal, cumemguard_log;
  std::optional<std::string> api, mem, cls, action, msg, event, comm, path, build_id, what, var,
      original, result, level, signal_name, name, suppressed_rule, object, object_field;
  bool skipped = false, deferred = false, applied = false, aborted = false, sticky = false,
       suppressed_flag = false;
  bool args_is_object = false;
  std::string_view args_raw;  // into the line
  bool have_state = false;
  std::string state_json;
  std::vector<Related> related;
  bool have_pcs = false, pcs_ok = true;
  std::vector<std::uint64_t> pcs;
  std::vector<std::pair<std::string, std::int64_t>> calls, findings, live_counts;
  std::vector<SummaryBytes> summary_bytes;
  std::vector<SuppressedRule> rules;
  ArgsInfo call_args;
  bool call_args_done = false;
};

Related related_of(od::object o) {
  Related r;
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) break;
    od::value v;
    if (field.value().get(v) != SUCCESS) break;
    if (k == "what"sv) r.what = str_of(v).value_or("");
    else if (k == "api"sv) r.api = str_of(v).value_or("");
    else if (k == "seq"sv) r.seq = u64_of(v);
    else if (k == "ts"sv) r.ts = i64_of(v);
    else if (k == "tid"sv) r.tid = i64_of(v);
    else if (k == "stack"sv) r.stack = u64_of(v);
  }
  return r;
}

SummaryBytes summary_bytes_of(od::object o) {
  SummaryBytes b;
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) break;
    od::value v;
    if (field.value().get(v) != SUCCESS) break;
    if (k == "dev"sv) b.dev = i64_of(v).value_or(-1);
    else if (k == "mem"sv) b.mem = str_of(v).value_or("");
    else if (k == "current"sv) b.current = i64_of(v).value_or(0);
    else if (k == "peak"sv) b.peak = i64_of(v).value_or(0);
    else if (k == "total"sv) b.total = i64_of(v).value_or(0);
  }
  return b;
}

SuppressedRule rule_of(od::object o) {
  SuppressedRule r;
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) break;
    od::value v;
    if (field.value().get(v) != SUCCESS) break;
    if (k == "class"sv) r.cls = str_of(v).value_or("");
    else if (k == "pattern"sv) r.pattern = str_of(v).value_or("");
    else if (k == "count"sv) r.count = i64_of(v).value_or(0);
  }
  return r;
}

// Keys of up to 7 bytes as one integer (bytes, then the length in the top byte): the dispatch over
// ~50 field names of every field of every record is a switch, not a chain of memcmp.
constexpr std::uint64_t pack(std::string_view s) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < s.size() && i < 7; ++i)
    v |= static_cast<std::uint64_t>(static_cast<unsigned char>(s[i])) << (8 * i);
  return v | static_cast<std::uint64_t>(s.size()) << 56;
}

template <class T>
bool each_object(od::value &v, std::vector<T> &out, T (*one)(od::object)) {
  od::array a;
  if (v.get_array().get(a) != SUCCESS) return false;
  for (auto el : a) {
    od::value ev;
    if (el.get(ev) != SUCCESS) return false;
    od::object o;
    if (ev.get_object().get(o) != SUCCESS) continue;
    if (out.size() < kMaxListed) out.push_back(one(o));
  }
  return true;
}

// One field of a record line; false when the JSON is broken.
bool read_field(std::string_view key, od::value &v, Fields &f) {
  // The type only where a field's meaning depends on it: peeking it for every field of every
  // record cost more than the numbers themselves.
  od::json_type t{};
  auto typed = [&] { return v.type().get(t) == SUCCESS; };
  if (key.size() <= 7) {
    switch (pack(key)) {
      case pack("k"):
        if (auto s = str_of(v)) f.k = *s;
        return true;
      case pack("ts"): f.ts = i64_of(v); return true;
      case pack("id"): f.id = u64_of(v); return true;
      case pack("seq"): f.seq = u64_of(v); return true;
      case pack("tid"): f.tid = i64_of(v); return true;
      case pack("api"): f.api = str_of(v); return true;
      case pack("res"): f.res = i64_of(v); return true;
      case pack("dur"): f.dur = i64_of(v); return true;
      case pack("dev"): f.dev = i64_of(v); return true;
      case pack("mem"): f.mem = str_of(v); return true;
      case pack("delta"): f.delta = i64_of(v); return true;
      case pack("stack"): f.stack = u64_of(v); return true;
      case pack("args"): {
        if (!typed()) return false;
        if (t != od::json_type::object) return true;
        od::object o;
        if (v.get_object().get(o) != SUCCESS) return false;
        f.args_is_object = true;
        if (o.raw_json().get(f.args_raw) != SUCCESS) return false;
        if (f.k == "call"sv) {  // the bulk of a log: one pass over the raw text
          f.call_args_done = flat_args(f.args_raw, f.call_args);
          if (!f.call_args_done) f.call_args = ArgsInfo{};
        }
        return true;
      }
      case pack("skipped"): f.skipped = bool_of(v); return true;
      case pack("class"): f.cls = str_of(v); return true;
      case pack("action"): f.action = str_of(v); return true;
      case pack("msg"): f.msg = str_of(v); return true;
      case pack("state"): {
        auto raw = raw_of(v);
        if (!raw) return false;
        f.have_state = true;
        f.state_json = bounded_json(*raw, kMaxValueDepth, kMaxValueBytes);
        return true;
      }
      case pack("related"):
        if (!typed()) return false;
        if (t != od::json_type::array) return true;
        if (f.related.size() >= kMaxRelated) return true;
        return each_object<Related>(v, f.related, related_of) &&
               (f.related.size() <= kMaxRelated || (f.related.resize(kMaxRelated), true));
      case pack("bytes"):
        if (!typed()) return false;
        if (t == od::json_type::number) f.bytes = i64_of(v);
        else if (t == od::json_type::array)
          return each_object<SummaryBytes>(v, f.summary_bytes, summary_bytes_of);
        return true;
      case pack("event"): f.event = str_of(v); return true;
      case pack("comm"):
        if (!typed()) return false;
        if (t == od::json_type::string) f.comm = str_of(v);
        else if (auto n = u64_of(v)) f.comm = hex(*n);
        return true;
      case pack("rank"): f.rank = i64_of(v); return true;
      case pack("nranks"): f.nranks = i64_of(v); return true;
      case pack("live"):
        if (!typed()) return false;
        if (t == od::json_type::object) f.live_counts = counts_of(v);
        else f.live = i64_of(v);
        return true;
      case pack("pcs"): {
        f.have_pcs = true;
        if (!typed()) return false;
        if (t != od::json_type::array) {
          f.pcs_ok = false;
          return true;
        }
        od::array a;
        if (v.get_array().get(a) != SUCCESS) return false;
        for (auto el : a) {
          od::value ev;
          if (el.get(ev) != SUCCESS) return false;
          auto pc = u64_of(ev);
          if (!pc) f.pcs_ok = false;
          else if (f.pcs.size() < kMaxFrames) f.pcs.push_back(*pc);
        }
        return true;
      }
      case pack("path"): f.path = str_of(v); return true;
      case pack("base"): f.base = u64_of(v); return true;
      case pack("size"):
        f.size = i64_of(v);
        f.mod_size = u64_of(v);
        return true;
      case pack("what"): f.what = str_of(v); return true;
      case pack("ptr"):
      case pack("handle"):
      case pack("va"):
        if (!f.object) {
          if (!typed()) return false;
          f.object_field = std::string(key);
          f.object = text_of(v, t);
        }
        return true;
      case pack("var"): f.var = str_of(v); return true;
      case pack("result"): f.result = str_of(v); return true;
      case pack("applied"): f.applied = bool_of(v); return true;
      case pack("level"): f.level = str_of(v); return true;
      case pack("calls"): f.calls = counts_of(v); return true;
      case pack("signal"): f.signal = i64_of(v); return true;
      case pack("aborted"): f.aborted = bool_of(v); return true;
      case pack("addr"): f.addr = u64_of(v); return true;
      case pack("name"): f.name = str_of(v); return true;
      case pack("sticky"): f.sticky = bool_of(v); return true;
      default: return true;  // a field this reader does not know
    }
  }
  if (key == "deferred"sv) f.deferred = bool_of(v);
  else if (key == "blocked_ns"sv) f.blocked_ns = i64_of(v);
  else if (key == "suppressed"sv) {
    if (!typed()) return false;
    if (t == od::json_type::string) f.suppressed_rule = str_of(v);
    else if (t == od::json_type::boolean) f.suppressed_flag = bool_of(v);
    else if (t == od::json_type::array) return each_object<SuppressedRule>(v, f.rules, rule_of);
  } else if (key == "build_id"sv) f.build_id = str_of(v);
  else if (key == "original"sv) f.original = str_of(v);
  else if (key == "findings"sv) f.findings = counts_of(v);
  else if (key == "signal_name"sv) f.signal_name = str_of(v);
  else if (key == "cumemguard_log"sv) f.cumemguard_log = i64_of(v);
  return true;
}

}  // namespace

std::string clean(std::string_view s, std::size_t max) {
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  bool plain = s.size() <= max;
  for (std::size_t i = 0; plain && i < s.size(); ++i)
    if (is_control(p, i, s.size())) plain = false;
  if (plain) return std::string(s);
  std::size_t used = 0;
  std::string out = escape_controls(s, max, used);
  if (used < s.size()) out += fmt::format("...[{} bytes]", s.size());
  return out;
}

const char *status_name(Status s) {
  switch (s) {
    case Status::Complete: return "complete";
    case Status::Crashed: return "crashed";
    case Status::Aborted: return "aborted";
    case Status::Truncated: return "truncated";
  }
  return "?";
}

Status Log::status() const {
  if (!end_ts) return Status::Truncated;
  if (end_signal) return Status::Crashed;
  if (end_aborted) return Status::Aborted;
  return Status::Complete;
}

std::unique_ptr<ByteSource> fd_source(int fd, bool owned) {
  return std::make_unique<FdSource>(fd, owned);
}

std::unique_ptr<ByteSource> text_source(std::string_view text) {
  return std::make_unique<TextSource>(text);
}

std::optional<std::uint64_t> parse_hex(std::string_view sv) {
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

struct LogReader::Impl {
  std::unique_ptr<ByteSource> src;
  Log log;
  ReadStatus status = ReadStatus::Ok;
  std::string error;
  bool opened = false;

  // The line buffer: [begin, end) holds unread bytes; SIMDJSON_PADDING readable bytes follow
  // the capacity, as simdjson requires after a document.
  std::vector<char> buf;
  std::size_t cap = 0, begin = 0, end = 0;
  bool eof = false, skipping = false;

  od::parser parser;
  od::parser aux;  // re-reads a finding's bounded arguments
  simdjson::padded_string aux_text;

  struct Pending {
    Event e;
    std::uint64_t order;
  };
  std::vector<Pending> heap;
  std::uint64_t order = 0, last_seq = 0;
  bool released_any = false, lines_done = false;

  std::optional<Event> ready;  // in order already: released without the heap

  bool releasable(std::uint64_t seq) const { return released_any ? seq <= last_seq + 1 : seq <= 1; }

  void push(Event &&e) {
    if (heap.empty() && !ready && releasable(e.seq)) {
      ready = std::move(e);
      return;
    }
    heap.push_back({std::move(e), order++});
    std::push_heap(heap.begin(), heap.end(), later);
  }

  static bool later(const Pending &a, const Pending &b) {
    return a.e.seq != b.e.seq ? a.e.seq > b.e.seq : a.order > b.order;
  }

  void grow(std::size_t want) {
    cap = want;
    buf.resize(cap + simdjson::SIMDJSON_PADDING);
  }

  // The next line without its '\n'; false at the end (or on a read error).
  bool next_line(std::string_view &line, bool &unterminated) {
    if (buf.empty()) grow(std::size_t{1} << 20);
    for (;;) {
      if (const void *nl = std::memchr(buf.data() + begin, '\n', end - begin)) {
        const std::size_t at = static_cast<const char *>(nl) - buf.data();
        line = std::string_view(buf.data() + begin, at - begin);
        begin = at + 1;
        if (skipping) {  // the tail of an overlong line
          skipping = false;
          continue;
        }
        unterminated = false;
        return true;
      }
      if (eof) {
        if (begin < end && !skipping) {
          line = std::string_view(buf.data() + begin, end - begin);
          begin = end;
          unterminated = true;
          return true;
        }
        return false;
      }
      if (begin > 0) {
        std::memmove(buf.data(), buf.data() + begin, end - begin);
        end -= begin;
        begin = 0;
      }
      if (end == cap) {
        if (cap >= kMaxLine) {
          // One line longer than any the shim writes: skipped, and counted.
          ++log.overlong;
          ++log.malformed;
          skipping = true;
          end = 0;
        } else {
          grow(std::min(cap * 2, kMaxLine));
        }
      }
      const long n = src->read(buf.data() + end, cap - end);
      if (n < 0) {
        status = ReadStatus::Unreadable;
        // errno is what the failed read(2) left: EISDIR for a directory, EIO for a bad disk.
        error = std::string("cannot read: ") + std::strerror(errno ? errno : EIO);
        eof = true;
        begin = end = 0;
        return false;
      }
      if (n == 0) eof = true;
      end += static_cast<std::size_t>(n);
    }
  }

  // The padding simdjson reads past a line: the rest of the buffer and its padding.
  std::size_t room(std::string_view line) const {
    return static_cast<std::size_t>(buf.data() + buf.size() - line.data());
  }

  bool read_fields(std::string_view line, Fields &f) {
    od::document doc;
    if (parser.iterate(line.data(), line.size(), room(line)).get(doc) != SUCCESS) return false;
    od::object obj;
    if (doc.get_object().get(obj) != SUCCESS) return false;
    for (auto field : obj) {
      std::string_view key;
      if (!key_of(field, key)) return false;
      // The value in place: copying it out of the result stalled on every field.
      auto value = field.value();
      if (value.error() != SUCCESS) return false;
      if (!read_field(key, value.value_unsafe(), f)) return false;
    }
    return true;
  }

  bool header(std::string_view line) {
    Fields f;
    Header &h = log.header;
    od::document doc;
    bool ok = parser.iterate(line.data(), line.size(), room(line)).get(doc) == SUCCESS;
    od::object obj;
    ok = ok && doc.get_object().get(obj) == SUCCESS;
    if (ok) {
      for (auto field : obj) {
        std::string_view key;
        od::value v;
        if (field.unescaped_key().get(key) != SUCCESS || field.value().get(v) != SUCCESS) {
          ok = false;
          break;
        }
        od::json_type t;
        if (v.type().get(t) != SUCCESS) {
          ok = false;
          break;
        }
        if (key == "cumemguard_log"sv) {
          od::number n;
          if (t != od::json_type::number || v.get_number().get(n) != SUCCESS) {
            ok = false;
            break;
          }
          if (n.is_int64()) h.format = n.get_int64();
          else if (n.is_uint64()) h.format = std::numeric_limits<std::int64_t>::max();
          else {
            ok = false;
            break;
          }
          f.cumemguard_log = h.format;
        } else if (key == "argv"sv && t == od::json_type::array) {
          od::array a;
          if (v.get_array().get(a) != SUCCESS) break;
          for (auto el : a) {
            od::value ev;
            if (el.get(ev) != SUCCESS) break;
            if (auto s = str_of(ev); s && h.argv.size() < 256) h.argv.push_back(*s);
          }
        } else if (key == "options"sv && t == od::json_type::object) {
          od::object o;
          if (v.get_object().get(o) != SUCCESS) break;
          for (auto of : o) {
            std::string_view name;
            od::value ov;
            if (of.unescaped_key().get(name) != SUCCESS || of.value().get(ov) != SUCCESS) break;
            od::json_type ot;
            if (ov.type().get(ot) != SUCCESS) break;
            std::string value;
            if (ot == od::json_type::string) {
              value = str_of(ov).value_or("");
            } else if (auto raw = raw_of(ov)) {
              value = bounded_json(*raw, kMaxValueDepth, kMaxValueBytes);
            }
            if (h.options.size() < 256) h.options.emplace_back(clean(name, 256), std::move(value));
          }
        } else if (key == "tool"sv) h.tool = str_of(v).value_or("");
        else if (key == "pid"sv) h.pid = i64_of(v).value_or(0);
        else if (key == "ppid"sv) h.ppid = i64_of(v).value_or(0);
        else if (key == "rank"sv) h.rank = i64_of(v).value_or(-1);
        else if (key == "host"sv) h.host = str_of(v).value_or("");
        else if (key == "start_unix_ns"sv) h.start_unix_ns = i64_of(v).value_or(0);
        else if (key == "mode"sv) h.mode = str_of(v).value_or("");
      }
    }
    if (!ok || !f.cumemguard_log) {
      status = ReadStatus::NotALog;
      error = "not a cumemguard log (the first line is not a log header)";
      return false;
    }
    if (h.format > kLogFormat) {
      status = ReadStatus::NewerFormat;
      error = fmt::format("log format {} is newer than this cumemguard understands ({})", h.format,
                          kLogFormat);
      return false;
    }
    if (h.format < 1) {
      status = ReadStatus::NotALog;
      error = fmt::format("not a cumemguard log (format {})", h.format);
      return false;
    }
    return true;
  }

  template <class T>
  void keep(std::vector<T> &v, T &&x) {
    if (v.size() < kMaxListed) v.push_back(std::move(x));
    else ++log.dropped;
  }

  // A record of a known or unknown kind; false when a known record lacks what it needs.
  bool record(Fields &f, const std::function<void(Leak &&)> &on_leak) {
    const std::string &k = f.k;
    if (f.ts) log.max_ts = std::max(log.max_ts, *f.ts);
    if (k == "call"sv || k == "finding"sv || k == "nccl"sv || k == "cuda_error"sv) {
      if (!f.seq) return false;
      Event e;
      e.seq = *f.seq;
      e.ts = f.ts.value_or(0);
      e.tid = f.tid.value_or(0);
      e.stack = f.stack;
      if (k == "call"sv) {
        if (!f.api || f.api->empty()) return false;
        Call &c = e.body.emplace<Call>();
        c.api = std::move(*f.api);
        c.res = f.res.value_or(0);
        c.dur = f.dur.value_or(0);
        if (f.args_is_object && !f.call_args_done) {
          // args came before k: read them again from their raw text.
          if (!aux_args(f.args_raw, f.call_args)) return false;
        }
        c.args = std::move(f.call_args.text);
        c.ptr = f.call_args.ptr;
        c.size = f.call_args.size;
        c.handle = f.call_args.handle;
        c.dev = f.dev.value_or(-1);
        if (f.mem) c.mem = std::move(*f.mem);
        c.delta = f.delta.value_or(0);
        c.skipped = f.skipped;
        c.deferred = f.deferred;
      } else if (k == "finding"sv) {
        if (!f.cls || f.cls->empty()) return false;
        Finding x;
        x.cls = std::move(*f.cls);
        x.api = f.api.value_or("");
        x.action = f.action.value_or("");
        x.res = f.res.value_or(0);
        if (f.args_is_object) {
          if (f.call_args_done) {
            x.args = std::move(f.call_args.text);
          } else {
            x.args_json = bounded_json(f.args_raw, kMaxValueDepth, kMaxValueBytes);
            ArgsInfo a;
            if (aux_args(x.args_json, a)) x.args = std::move(a.text);
          }
        }
        x.msg = f.msg.value_or("");
        x.related = std::move(f.related);
        if (f.have_state) x.state_json = std::move(f.state_json);
        x.bytes = f.bytes;
        x.blocked_ns = f.blocked_ns;
        x.suppressed = f.suppressed_rule.value_or("");
        e.body = std::move(x);
      } else if (k == "nccl"sv) {
        if (!f.event || f.event->empty()) return false;
        Nccl n;
        n.event = std::move(*f.event);
        n.api = f.api.value_or("");
        n.comm = f.comm.value_or("");
        n.rank = f.rank;
        n.nranks = f.nranks;
        n.dev = f.dev;
        n.res = f.res.value_or(0);
        n.live = f.live;
        n.suppressed = f.suppressed_flag;
        e.body = std::move(n);
      } else {
        if (!f.api || !f.res) return false;
        CudaError c;
        c.api = std::move(*f.api);
        c.res = *f.res;
        c.name = f.name.value_or("");
        c.sticky = f.sticky;
        e.body = std::move(c);
      }
      push(std::move(e));
    } else if (k == "stack"sv) {
      if (!f.id || !f.have_pcs || !f.pcs_ok) return false;
      log.stacks[*f.id] = std::move(f.pcs);
    } else if (k == "module"sv) {
      if (!f.path || f.path->empty() || !f.base) return false;
      Module m;
      m.path = std::move(*f.path);
      m.base = *f.base;
      m.size = f.mod_size.value_or(0);
      m.build_id = f.build_id.value_or("");
      keep(log.modules, std::move(m));
    } else if (k == "leak"sv) {
      Leak l;
      l.what = f.what.value_or("");
      l.api = f.api.value_or("");
      if (f.object) {
        l.object_field = f.object_field.value_or("");
        l.object = std::move(*f.object);
      }
      l.size = f.size.value_or(0);
      l.dev = f.dev.value_or(-1);
      l.seq = f.seq;
      l.stack = f.stack;
      if (on_leak) on_leak(std::move(l));
    } else if (k == "config"sv) {
      ConfigRecord c;
      c.var = f.var.value_or("");
      c.original = f.original.value_or("");
      c.result = f.result.value_or("");
      c.msg = f.msg.value_or("");
      c.applied = f.applied;
      keep(log.configs, std::move(c));
    } else if (k == "note"sv) {
      Note n;
      n.ts = f.ts.value_or(0);
      n.level = f.level.value_or("info");
      n.msg = f.msg.value_or("");
      keep(log.notes, std::move(n));
    } else if (k == "summary"sv) {
      Summary s;
      s.ts = f.ts.value_or(0);
      s.calls = std::move(f.calls);
      s.bytes = std::move(f.summary_bytes);
      s.live = std::move(f.live_counts);
      s.findings = std::move(f.findings);
      s.suppressed = std::move(f.rules);
      log.summary = std::move(s);
    } else if (k == "end"sv) {
      log.end_ts = f.ts.value_or(0);
      log.end_signal = f.signal;
      log.end_signal_name = f.signal_name.value_or("");
      log.end_aborted = f.aborted;
    } else if (k == "crash"sv) {
      if (!f.signal) return false;
      Crash c;
      c.ts = f.ts.value_or(0);
      c.tid = f.tid.value_or(0);
      c.signal = *f.signal;
      c.signal_name = f.signal_name.value_or("");
      c.addr = f.addr;
      c.stack = f.stack;
      log.crash = std::move(c);
    } else if (k.empty()) {
      return false;
    } else {
      // A later minor version's record: skipped by contract, counted by kind.
      if (log.unknown_kinds.size() < 64 || log.unknown_kinds.count(k)) ++log.unknown_kinds[k];
      else ++log.unknown_kinds["(other kinds)"];
    }
    return true;
  }

  bool aux_args(std::string_view raw, ArgsInfo &a) {
    aux_text = simdjson::padded_string(raw);
    od::document doc;
    if (aux.iterate(aux_text).get(doc) != SUCCESS) return false;
    od::object o;
    if (doc.get_object().get(o) != SUCCESS) return false;
    return args_of(o, a);
  }

  // Reads lines until an event can be released or the log ends.
  void fill(const std::function<void(Leak &&)> &on_leak) {
    std::string_view line;
    bool unterminated = false;
    while (!lines_done && !ready) {
      if (!heap.empty()) {
        const std::uint64_t top = heap.front().e.seq;
        if (releasable(top)) return;
        if (heap.size() >= (released_any ? kReorderWindow : 1024)) return;
      }
      if (!next_line(line, unterminated)) {
        lines_done = true;
        return;
      }
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      Fields f;
      if (!read_fields(line, f)) {
        if (unterminated) log.partial_last_line = true;
        else ++log.malformed;
        continue;
      }
      ++log.records;
      if (!record(f, on_leak)) ++log.malformed;
    }
  }
};

LogReader::LogReader(std::unique_ptr<ByteSource> src, std::string name, std::string open_error)
    : impl_(std::make_unique<Impl>()) {
  impl_->src = std::move(src);
  impl_->log.file = std::move(name);
  impl_->error = std::move(open_error);
}

LogReader::~LogReader() = default;

bool LogReader::open() {
  Impl &d = *impl_;
  if (d.opened) return d.status == ReadStatus::Ok;
  d.opened = true;
  if (d.status != ReadStatus::Ok) return false;
  if (!d.src) {
    d.status = ReadStatus::Unreadable;
    if (d.error.empty()) d.error = "cannot open";
    return false;
  }
  std::string_view line;
  bool unterminated = false;
  if (!d.next_line(line, unterminated)) {
    if (d.status == ReadStatus::Ok) {
      d.status = ReadStatus::NotALog;
      d.error = "not a cumemguard log (the file is empty)";
    }
    return false;
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return d.header(line);
}

ReadStatus LogReader::status() const {
  return impl_->status;
}

const std::string &LogReader::error() const {
  return impl_->error;
}

bool LogReader::next(Event &e) {
  Impl &d = *impl_;
  if (!d.opened && !open()) return false;
  if (d.status != ReadStatus::Ok && d.heap.empty() && !d.ready) return false;
  d.fill(on_leak);
  if (d.ready) {
    e = std::move(*d.ready);
    d.ready.reset();
  } else {
    if (d.heap.empty()) return false;
    std::pop_heap(d.heap.begin(), d.heap.end(), Impl::later);
    e = std::move(d.heap.back().e);
    d.heap.pop_back();
  }
  if (d.released_any && e.seq < d.last_seq) ++d.log.late;
  d.last_seq = d.released_any ? std::max(d.last_seq, e.seq) : e.seq;
  d.released_any = true;
  return true;
}

Log &LogReader::log() {
  return impl_->log;
}

const Log &LogReader::log() const {
  return impl_->log;
}

std::unique_ptr<LogReader> open_log_file(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return std::make_unique<LogReader>(nullptr, path,
                                       std::string("cannot open: ") + std::strerror(errno));
  return std::make_unique<LogReader>(fd_source(fd, true), path);
}

ReadResult read_all(LogReader &r) {
  ReadResult out;
  r.on_leak = [&](Leak &&l) { out.leaks.push_back(std::move(l)); };
  if (r.open()) {
    Event e;
    while (r.next(e)) out.events.push_back(std::move(e));
  }
  out.status = r.status();
  out.error = r.error();
  out.log = std::move(r.log());
  return out;
}

ReadResult read_log_text(std::string_view text, std::string name) {
  LogReader r(text_source(text), std::move(name));
  return read_all(r);
}

ReadResult read_log_file(const std::string &path) {
  auto r = open_log_file(path);
  return read_all(*r);
}

bool is_log_header(std::string_view first_line) {
  std::string text(first_line);
  LogReader r(text_source(text), "");
  if (r.open()) return true;
  return r.status() == ReadStatus::NewerFormat;
}

void merge_logs(std::vector<LogReader *> &readers,
                const std::function<void(std::size_t, const Event &)> &sink) {
  std::int64_t t0 = std::numeric_limits<std::int64_t>::max();
  for (auto *r : readers) t0 = std::min(t0, r->log().header.start_unix_ns);
  struct Head {
    std::int64_t t;
    std::size_t log;
  };
  // Earliest time first, then the log given first: a deterministic order for equal times.
  auto later = [](const Head &a, const Head &b) { return a.t != b.t ? a.t > b.t : a.log > b.log; };
  std::priority_queue<Head, std::vector<Head>, decltype(later)> heads(later);
  if (readers.size() == 1) {  // one log: nothing to merge
    Event e;
    while (readers[0]->next(e)) sink(0, e);
    return;
  }
  std::vector<Event> cur(readers.size());
  for (std::size_t i = 0; i < readers.size(); ++i)
    if (readers[i]->next(cur[i])) heads.push({rel_time(readers[i]->log().header, cur[i].ts, t0), i});
  while (!heads.empty()) {
    const Head h = heads.top();
    heads.pop();
    sink(h.log, cur[h.log]);
    if (readers[h.log]->next(cur[h.log]))
      heads.push({rel_time(readers[h.log]->log().header, cur[h.log].ts, t0), h.log});
  }
}

}  // namespace cmg::report
