// SPDX-License-Identifier: Apache-2.0
// The one text writer of the exit, crash and signal paths: text built in a caller's buffer with
// numbers formatted by hand (no stdio, no locale, no allocation: usable from a signal handler).
// Without a sink, what does not fit is dropped and full() says so (a record cut short must not
// be written: the caller drops it). With one (the exit summary on stderr), a full buffer is handed
// to the sink and writing goes on, so a text of any length needs only the buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace cmg::shim {

class TextBuf {
 public:
  using Sink = void (*)(std::string_view);
  TextBuf(char *buf, std::size_t cap, Sink sink = nullptr) : buf_(buf), cap_(cap), sink_(sink) {}
  TextBuf(const TextBuf &) = delete;
  TextBuf &operator=(const TextBuf &) = delete;

  TextBuf &s(std::string_view v) {
    while (!v.empty()) {
      std::size_t room = cap_ - len_;
      if (room == 0) {
        if (!spill()) {
          full_ = true;
          return *this;
        }
        room = cap_;
      }
      const std::size_t n = v.size() < room ? v.size() : room;
      std::memcpy(buf_ + len_, v.data(), n);
      len_ += n;
      col_ = last_newline(v.substr(0, n), col_);
      v.remove_prefix(n);
    }
    return *this;
  }
  TextBuf &c(char ch) { return s(std::string_view(&ch, 1)); }
  TextBuf &u(std::uint64_t v) {
    char tmp[24];
    return s(digits(v, tmp));
  }
  TextBuf &i(std::int64_t v) {
    if (v < 0) {
      c('-');
      return u(static_cast<std::uint64_t>(-(v + 1)) + 1);
    }
    return u(static_cast<std::uint64_t>(v));
  }
  TextBuf &hex(std::uint64_t v) {
    char tmp[18];
    int n = 0;
    do {
      tmp[sizeof tmp - 1 - n++] = "0123456789abcdef"[v & 15];
      v >>= 4;
    } while (v);
    tmp[sizeof tmp - 1 - n++] = 'x';
    tmp[sizeof tmp - 1 - n++] = '0';
    return s(std::string_view(tmp + sizeof tmp - n, static_cast<std::size_t>(n)));
  }
  // v in a field of `width`, padded with spaces after (left) or before (right) it.
  TextBuf &left(std::string_view v, std::size_t width) {
    s(v);
    return spaces(width > v.size() ? width - v.size() : 0);
  }
  TextBuf &right(std::string_view v, std::size_t width) {
    spaces(width > v.size() ? width - v.size() : 0);
    return s(v);
  }
  TextBuf &spaces(std::size_t n) {
    for (; n; --n) c(' ');
    return *this;
  }
  // The column after the last newline written (for wrapping a list of items).
  std::size_t column() const { return col_; }

  bool full() const { return full_; }
  std::size_t size() const { return len_; }
  std::string_view view() const { return std::string_view(buf_, len_); }
  void truncate(std::size_t n) {
    if (n < len_) len_ = n;
    full_ = false;
  }
  // Hands what is buffered to the sink (the end of a text written through one).
  void flush() {
    if (sink_ && len_) sink_(view());
    len_ = 0;
  }

  // Decimal digits of v in tmp (24 bytes), as a view into it.
  static std::string_view digits(std::uint64_t v, char (&tmp)[24]) {
    int n = 0;
    do {
      tmp[23 - n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v);
    return std::string_view(tmp + 24 - n, static_cast<std::size_t>(n));
  }

 private:
  static std::size_t last_newline(std::string_view v, std::size_t col) {
    for (char ch : v) col = ch == '\n' ? 0 : col + 1;
    return col;
  }
  bool spill() {
    if (!sink_) return false;
    sink_(view());
    len_ = 0;
    return true;
  }
  char *buf_;
  std::size_t cap_;
  Sink sink_;
  std::size_t len_ = 0, col_ = 0;
  bool full_ = false;
};

}  // namespace cmg::shim
