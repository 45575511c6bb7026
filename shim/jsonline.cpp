// SPDX-License-Identifier: Apache-2.0
// The JSON-line builder (see jsonline.h).
#include "jsonline.h"

#include <algorithm>
#include <cstring>

namespace cmg::shim {

JsonLine::JsonLine(char *buf, std::size_t cap, Spill *spill)
    : buf_(buf), cap_(cap), spill_(spill) {
  buf_[len_++] = '{';
}

bool JsonLine::room_full(std::size_t n) {
  const std::size_t keep = kReserve + static_cast<std::size_t>(depth_);
  // With a spill target the bytes so far go out and the record goes on in the emptied buffer.
  if (spill_ && !cut_ && len_ > 0 && n + keep < cap_) {
    spill_->piece(std::string_view(buf_, len_));
    len_ = 0;
    return true;
  }
  cut_ = true;
  return false;
}

bool JsonLine::spill_now() {
  if (!spill_) return false;
  spill_->piece(std::string_view(buf_, len_));
  len_ = 0;
  return true;
}

// A raw value of any length: in pieces of what fits, each handed to the spill target.
void JsonLine::put_long(std::string_view s) {
  const std::size_t keep = kReserve + static_cast<std::size_t>(depth_);
  while (!s.empty()) {
    if (len_ + keep >= cap_) {
      spill_->piece(std::string_view(buf_, len_));
      len_ = 0;
    }
    const std::size_t n = std::min(s.size(), cap_ - keep - len_);
    put(s.substr(0, n));
    s.remove_prefix(n);
  }
}

void JsonLine::put(std::string_view s) {
  std::memcpy(buf_ + len_, s.data(), s.size());
  len_ += s.size();
}

void JsonLine::put_u00(unsigned char c) {
  static const char digits[] = "0123456789abcdef";
  const char u[6] = {'\\', 'u', '0', '0', digits[c >> 4], digits[c & 15]};
  put(std::string_view(u, 6));
}

// Strings are escaped as JSON; bytes that are not valid UTF-8 (an argv in Latin-1, a path with a
// stray byte) become \u00XX so the line stays valid JSON, and a multi-byte character is never cut.
void JsonLine::put_escaped(std::string_view s) {
  const auto *u = reinterpret_cast<const unsigned char *>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    if (len_ + 8 + kReserve + static_cast<std::size_t>(depth_) >= cap_) [[unlikely]] {
      if (!spill_now()) {
        cut_ = true;
        return;
      }
    }
    const unsigned char c = u[i];
    if (c < 0x80) {
      switch (c) {
        case '"': put("\\\""); break;
        case '\\': put("\\\\"); break;
        case '\n': put("\\n"); break;
        case '\t': put("\\t"); break;
        case '\r': put("\\r"); break;
        default:
          if (c < 0x20) {
            put_u00(c);
          } else {
            buf_[len_++] = static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence of 2 to 4 bytes is copied whole.
    std::size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (c >= 0xf5) len = 0;
    bool ok = len && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (u[i + k] & 0xc0) == 0x80;
    if (ok && len == 3 && ((c == 0xe0 && u[i + 1] < 0xa0) || (c == 0xed && u[i + 1] >= 0xa0)))
      ok = false;  // overlong, or a UTF-16 surrogate
    if (ok && len == 4 && ((c == 0xf0 && u[i + 1] < 0x90) || (c == 0xf4 && u[i + 1] >= 0x90)))
      ok = false;  // overlong, or beyond U+10FFFF
    if (ok) {
      std::memcpy(buf_ + len_, s.data() + i, len);
      len_ += len;
      i += len;
    } else {
      put_u00(c);
      ++i;
    }
  }
}

JsonLine &JsonLine::str(std::string_view k, std::string_view v) {
  if (!key(k, 2)) return *this;
  buf_[len_++] = '"';
  put_escaped(v);  // may cut the text short, never the closing quote (kReserve)
  buf_[len_++] = '"';
  return *this;
}

JsonLine &JsonLine::raw(std::string_view k, std::string_view json) {
  if (!spill_) {
    if (key(k, json.size())) put(json);
  } else if (key(k, 0)) {
    put_long(json);
  }
  return *this;
}

JsonLine &JsonLine::begin_array(std::string_view k) { return open(k, '['); }

JsonLine &JsonLine::end_array() { return close(']'); }

bool JsonLine::elem(std::size_t n) {
  if (skip_ || !room(n + 1)) return false;
  if (!first_) buf_[len_++] = ',';
  first_ = false;
  return true;
}

JsonLine &JsonLine::elem_str(std::string_view v) {
  if (!elem(2)) return *this;
  buf_[len_++] = '"';
  put_escaped(v);
  buf_[len_++] = '"';
  return *this;
}

JsonLine &JsonLine::elem_hex(std::uint64_t v) {
  const int n = jsonnum::hex_len(v);
  if (elem(static_cast<std::size_t>(n) + 4)) {
    jsonnum::put_hex_str_n(buf_ + len_, v, n);
    len_ += static_cast<std::size_t>(n) + 4;
  }
  return *this;
}

JsonLine &JsonLine::elem_raw(std::string_view json) {
  if (!spill_) {
    if (elem(json.size())) put(json);
  } else if (elem(0)) {
    put_long(json);
  }
  return *this;
}

JsonLine &JsonLine::elem_object() {
  if (!elem(2)) {
    ++skip_;
    return *this;
  }
  buf_[len_++] = '{';
  first_ = true;
  ++depth_;
  return *this;
}

std::string_view JsonLine::finish() {
  if (cut_) {
    if (!first_) buf_[len_++] = ',';
    put("\"cut\":true");
  }
  buf_[len_++] = '}';
  buf_[len_++] = '\n';
  return std::string_view(buf_, len_);
}

}  // namespace cmg::shim
