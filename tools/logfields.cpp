// SPDX-License-Identifier: Apache-2.0
// The fields of one record line (logfields.h): read in one forward pass with simdjson's On-Demand
// API and kept by meaning, to be interpreted by the record's kind in logreader.cpp.
#include "logfields.h"

#include <cstring>

#include "json_bounded.h"

namespace cmg::report::fields {
using simdjson::SUCCESS;
using namespace std::string_view_literals;

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
  std::int64_t fast = 0;
  if (v.get_int64().get(fast) == SUCCESS) return fast;  // negative deltas parse once too
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

bool read_args(od::object o, ArgsInfo &a) {
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

AllFailed all_failed_of(od::object o) {
  AllFailed a;
  for (auto field : o) {
    std::string_view k;
    if (!key_of(field, k)) break;
    od::value v;
    if (field.value().get(v) != SUCCESS) break;
    if (k == "calls"sv)
      a.calls = i64_of(v).value_or(0);
    else if (k == "res"sv)
      a.res = i64_of(v).value_or(0);
    else if (k == "name"sv)
      a.name = str_of(v).value_or("");
    else if (k == "cause"sv)
      a.cause = str_of(v).value_or("");
    else if (k == "fake_cuda"sv)
      a.fake_cuda = str_of(v).value_or("");
  }
  return a;
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
      case pack("buff"):
        if (!typed()) return false;
        f.buff = text_of(v, t);
        return true;
      case pack("flags"): f.flags = i64_of(v); return true;
      case pack("stat"): f.stat = i64_of(v); return true;
      case pack("value"): f.value = u64_of(v); return true;
      case pack("ranges"): f.ranges = u64_of(v); return true;
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
      case pack("py"): {  // [[at, code, line], ...]: Python frames of a stack record
        if (!typed()) return false;
        if (t != od::json_type::array) {
          f.py_ok = false;
          return true;
        }
        od::array a;
        if (v.get_array().get(a) != SUCCESS) return false;
        for (auto el : a) {
          od::array e;
          if (el.get_array().get(e) != SUCCESS) return false;
          std::int64_t n[3] = {0, 0, 0};
          int k = 0;
          for (auto x : e) {
            od::value xv;
            if (x.get(xv) != SUCCESS) return false;
            auto i = i64_of(xv);
            if (!i) f.py_ok = false;
            else if (k < 3) n[k] = *i;
            ++k;
          }
          if (k != 3 || n[0] < 0 || n[1] <= 0) f.py_ok = false;
          else if (f.py.size() < kMaxPyFrames)
            f.py.push_back({static_cast<std::size_t>(n[0]), static_cast<std::uint64_t>(n[1]),
                            static_cast<int>(n[2])});
        }
        return true;
      }
      case pack("py_end"): f.py_end = str_of(v); return true;
      case pack("file"): f.file = str_of(v); return true;
      case pack("first"): f.first = i64_of(v); return true;
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
      case pack("bridge"): f.bridge = counts_of(v); return true;
      case pack("signal"): f.signal = i64_of(v); return true;
      case pack("aborted"): f.aborted = bool_of(v); return true;
      case pack("_exit"): f.quick_exit = bool_of(v); return true;
      case pack("addr"): f.addr = u64_of(v); return true;
      case pack("name"): f.name = str_of(v); return true;
      case pack("sticky"): f.sticky = bool_of(v); return true;
      case pack("ret_seq"): f.ret_seq = u64_of(v); return true;
      case pack("capture"): f.capture = u64_of(v); return true;
      default: return true;  // a field this reader does not know
    }
  }
  if (key == "deferred"sv) f.deferred = bool_of(v);
  else if (key == "released_from"sv)
    f.released_from = str_of(v);
  else if (key == "range_bytes"sv)
    f.range_bytes = u64_of(v);
  else if (key == "blocked_ns"sv) f.blocked_ns = i64_of(v);
  else if (key == "call_seq"sv) f.call_seq = u64_of(v);
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
  else if (key == "every_call_failed"sv) {
    od::object o;
    if (v.get_object().get(o) != SUCCESS) return false;
    f.all_failed = all_failed_of(o);
  }
  return true;
}

bool read_record(od::parser &parser, std::string_view line, std::size_t room, Fields &f) {
  od::document doc;
  if (parser.iterate(line.data(), line.size(), room).get(doc) != SUCCESS) return false;
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

}  // namespace cmg::report::fields
