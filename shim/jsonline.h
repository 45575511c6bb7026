// SPDX-License-Identifier: Apache-2.0
// The JSON-line builder every log record is written with: one JSON object in a caller-provided
// buffer, without allocating. Strings are escaped (bytes that are not UTF-8 become \u00XX).
// Without a spill target, a record that does not fit is cut (string values shortened, later
// members left out, "cut":true added) and the object is still closed properly. With one, the
// buffer is handed to it whenever it fills and the record goes on: a record of any length is
// built in a fixed buffer (LogLine in eventlog.h writes such pieces straight into the log).
// The members of a call record (keys, numbers, hex strings, the shim's own names) are built inline
// in the caller, with one room check each; escaping, spilling and cutting stay out of line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "jsonnum.h"

namespace cmg::shim {

class JsonLine {
 public:
  // Receives the bytes of a record in order, as the buffer fills (never the final piece: that is
  // what finish() returns).
  class Spill {
   public:
    virtual void piece(std::string_view bytes) = 0;

   protected:
    ~Spill() = default;
  };

  JsonLine(char *buf, std::size_t cap, Spill *spill = nullptr);
  JsonLine &str(std::string_view key, std::string_view v);
  // A string the shim's own tables hold (an API, kind or class name: a C identifier or a word of
  // letters and '-', by construction of api_*.def and mem_kind_name), written without the
  // escaping pass.
  JsonLine &ident(std::string_view key, std::string_view v);
  JsonLine &hex(std::string_view key, std::uint64_t v);
  JsonLine &num(std::string_view key, std::int64_t v);
  JsonLine &unum(std::string_view key, std::uint64_t v);
  JsonLine &boolean(std::string_view key, bool v);
  JsonLine &raw(std::string_view key, std::string_view json);  // an already-rendered JSON value
  JsonLine &begin_object(std::string_view key);
  JsonLine &end_object();
  JsonLine &begin_array(std::string_view key);
  JsonLine &end_array();
  // Array elements (inside begin_array): a string, a hex string, raw JSON, or an object (closed
  // with end_object).
  JsonLine &elem_str(std::string_view v);
  JsonLine &elem_hex(std::uint64_t v);
  JsonLine &elem_raw(std::string_view json);
  JsonLine &elem_object();
  // Closes the object and adds '\n'. The view (the last piece, with a spill target) stays valid
  // while the buffer lives.
  std::string_view finish();

  // Members written without a room check each, after one check for all of them (the call
  // record's numbers and names: a record is built per intercepted call). fits(n) says whether n
  // more bytes fit now, depth included; when it does, members of at most n bytes in all (each
  // member's key + 4 + its largest value, +1 per object begun) are exactly what the checked
  // members would write, since none of their checks could fail. Strings are never among them.
  class Unchecked;
  bool fits(std::size_t n) const {
    return !skip_ && !cut_ && len_ + n + kReserve + static_cast<std::size_t>(depth_) < cap_;
  }
  // The most bytes unum, num or hex writes after its key: 20 digits, a sign and 19 digits, or
  // "0x" and 16 digits in quotes.
  static constexpr std::size_t kNumMax = 20;

 private:
  // Room kept back so the closing brackets, a "cut" marker and the newline always fit.
  static constexpr std::size_t kReserve = 48;
  bool room(std::size_t n);
  JsonLine &open(std::string_view k, char bracket);
  JsonLine &close(char bracket);
  __attribute__((noinline, cold)) bool room_full(std::size_t n);
  __attribute__((noinline, cold)) bool spill_now();  // false without a spill target
  void put(std::string_view s);
  void put_long(std::string_view s);  // a raw value that may exceed the buffer (spill target)
  void put_escaped(std::string_view s);
  void put_u00(unsigned char c);
  bool key(std::string_view k, std::size_t extra);
  bool elem(std::size_t n);
  char *buf_;
  std::size_t cap_, len_ = 0;
  Spill *spill_;
  bool first_ = true;
  int skip_ = 0;   // objects/arrays left out because they did not fit
  int depth_ = 0;  // objects/arrays open: one closing byte each is kept free (fuzz_jsonline found
                   // deep nesting writing its closing brackets past the buffer)
  bool cut_ = false;
};

// ---- the members every call record has, inline -------------------------------------------------
// Always inline: the compiler's own choice kept key() out of line, where a key's length is no
// longer a constant and its copy is a loop (callgrind: more instructions than the memcpy call).
#define CMG_JSON_INLINE __attribute__((always_inline)) inline

namespace jsonline_put {
// `,"key":` at p (no comma before the first member); a key the caller names as a literal has a
// constant length here: its bytes are a few stores, with no call to memcpy.
CMG_JSON_INLINE char *key(char *p, bool first, std::string_view k) {
  *p = ',';  // kept only after a member (the quote overwrites it otherwise)
  p += !first;
  *p++ = '"';
  jsonnum::copy_short(p, k.data(), k.size());
  p += k.size();
  p[0] = '"';
  p[1] = ':';
  return p + 2;
}
CMG_JSON_INLINE char *ident(char *p, std::string_view v) {
  p[0] = '"';
  jsonnum::copy_short(p + 1, v.data(), v.size());
  p[v.size() + 1] = '"';
  return p + v.size() + 2;
}
CMG_JSON_INLINE char *dec(char *p, std::uint64_t v, int n) {
  jsonnum::put_dec_n(p, v, n);
  return p + n;
}
CMG_JSON_INLINE char *num(char *p, std::int64_t v, std::uint64_t m, int d) {
  *p = '-';
  p += v < 0;
  jsonnum::put_dec_n(p, m, d);
  return p + d;
}
CMG_JSON_INLINE char *hex(char *p, std::uint64_t v, int n) {
  jsonnum::put_hex_str_n(p, v, n);
  return p + n + 4;
}
CMG_JSON_INLINE char *boolean(char *p, bool v) {
  if (v) {
    std::memcpy(p, "true", 4);
    return p + 4;
  }
  std::memcpy(p, "false", 5);
  return p + 5;
}
}  // namespace jsonline_put

// The check every member makes: inline, the spill and the cut out of line.
CMG_JSON_INLINE bool JsonLine::room(std::size_t n) {
  if (!cut_ && len_ + n + kReserve + static_cast<std::size_t>(depth_) < cap_) [[likely]]
    return true;
  return room_full(n);
}

// Writes `,"key":` only when the key and `extra` more bytes fit; once a value is left out, every
// later one is too, so the line never holds a half-written member.
CMG_JSON_INLINE bool JsonLine::key(std::string_view k, std::size_t extra) {
  if (skip_ || !room(k.size() + 4 + extra)) [[unlikely]]
    return false;
  len_ = static_cast<std::size_t>(jsonline_put::key(buf_ + len_, first_, k) - buf_);
  first_ = false;
  return true;
}

CMG_JSON_INLINE JsonLine &JsonLine::ident(std::string_view k, std::string_view v) {
  if (key(k, v.size() + 2))
    len_ = static_cast<std::size_t>(jsonline_put::ident(buf_ + len_, v) - buf_);
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::hex(std::string_view k, std::uint64_t v) {
  const int n = jsonnum::hex_len(v);
  if (key(k, static_cast<std::size_t>(n) + 4))
    len_ = static_cast<std::size_t>(jsonline_put::hex(buf_ + len_, v, n) - buf_);
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::unum(std::string_view k, std::uint64_t v) {
  const int n = jsonnum::dec_len(v);
  if (key(k, static_cast<std::size_t>(n)))
    len_ = static_cast<std::size_t>(jsonline_put::dec(buf_ + len_, v, n) - buf_);
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::num(std::string_view k, std::int64_t v) {
  const std::uint64_t m = jsonnum::magnitude(v);
  const int d = jsonnum::dec_len(m);
  if (key(k, static_cast<std::size_t>(d) + (v < 0)))
    len_ = static_cast<std::size_t>(jsonline_put::num(buf_ + len_, v, m, d) - buf_);
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::boolean(std::string_view k, bool v) {
  if (key(k, 5)) len_ = static_cast<std::size_t>(jsonline_put::boolean(buf_ + len_, v) - buf_);
  return *this;
}

// Objects and arrays open and close alike: a member that does not fit skips everything up to
// its close (skip_ counts the levels), so the record stays well formed.
CMG_JSON_INLINE JsonLine &JsonLine::open(std::string_view k, char bracket) {
  if (!key(k, 2)) {
    ++skip_;
    return *this;
  }
  buf_[len_++] = bracket;
  first_ = true;
  ++depth_;
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::close(char bracket) {
  if (skip_) {
    --skip_;
    return *this;
  }
  --depth_;
  buf_[len_++] = bracket;
  first_ = false;
  return *this;
}

CMG_JSON_INLINE JsonLine &JsonLine::begin_object(std::string_view k) { return open(k, '{'); }
CMG_JSON_INLINE JsonLine &JsonLine::end_object() { return close('}'); }

// The same members without their checks (see fits()): the write position and the first-member
// flag live in the writer until it ends, so a record's fixed part is built in registers.
class JsonLine::Unchecked {
 public:
  explicit Unchecked(JsonLine &j) : j_(j), p_(j.buf_ + j.len_), first_(j.first_) {}
  ~Unchecked() { sync(); }
  Unchecked(const Unchecked &) = delete;
  Unchecked &operator=(const Unchecked &) = delete;
  CMG_JSON_INLINE Unchecked &ident(std::string_view k, std::string_view v) {
    p_ = jsonline_put::ident(key(k), v);
    return *this;
  }
  CMG_JSON_INLINE Unchecked &hex(std::string_view k, std::uint64_t v) {
    p_ = jsonline_put::hex(key(k), v, jsonnum::hex_len(v));
    return *this;
  }
  CMG_JSON_INLINE Unchecked &unum(std::string_view k, std::uint64_t v) {
    p_ = jsonline_put::dec(key(k), v, jsonnum::dec_len(v));
    return *this;
  }
  CMG_JSON_INLINE Unchecked &num(std::string_view k, std::int64_t v) {
    const std::uint64_t m = jsonnum::magnitude(v);
    p_ = jsonline_put::num(key(k), v, m, jsonnum::dec_len(m));
    return *this;
  }
  CMG_JSON_INLINE Unchecked &boolean(std::string_view k, bool v) {
    p_ = jsonline_put::boolean(key(k), v);
    return *this;
  }
  CMG_JSON_INLINE Unchecked &begin_object(std::string_view k) {
    *key(k) = '{';
    ++p_;
    first_ = true;
    ++j_.depth_;
    return *this;
  }
  CMG_JSON_INLINE Unchecked &end_object() {
    *p_++ = '}';
    first_ = false;
    --j_.depth_;
    return *this;
  }
  // A string is escaped and may be cut: the checked member, from where this writer stands. Its
  // room is in no bound, so a caller checks fits() only for members without one (args_bound in
  // records.h says a call's arguments have none); a string cut here would be followed by
  // unchecked members.
  Unchecked &str(std::string_view k, std::string_view v) {
    sync();
    j_.str(k, v);
    p_ = j_.buf_ + j_.len_;
    first_ = j_.first_;
    return *this;
  }

 private:
  CMG_JSON_INLINE char *key(std::string_view k) {
    char *p = jsonline_put::key(p_, first_, k);
    first_ = false;
    p_ = p;
    return p;
  }
  void sync() {
    j_.len_ = static_cast<std::size_t>(p_ - j_.buf_);
    j_.first_ = first_;
  }
  JsonLine &j_;
  char *p_;
  bool first_;
};

}  // namespace cmg::shim

#undef CMG_JSON_INLINE
