// SPDX-License-Identifier: Apache-2.0
// Bounded, iterative re-writing of one JSON value (json_bounded.h).
#include "json_bounded.h"

#include <cctype>

#include <string>
#include <vector>

#include <fmt/format.h>

namespace cmg::report {
namespace {

constexpr char kHex[] = "0123456789abcdef";

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// A JSON number, as RFC 8259 writes it.
bool valid_number(std::string_view s) {
  std::size_t i = 0;
  auto digits = [&] {
    const std::size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

class Writer {
 public:
  Writer(std::string_view in, std::size_t max_depth, std::size_t max_bytes)
      : in_(in), max_depth_(max_depth), max_bytes_(max_bytes) {}

  std::string run() {
    if (!value_sequence()) return "\"[not valid JSON]\"";
    return std::move(out_);
  }

 private:
  enum class Want { Value, KeyOrClose, ValueOrClose, Key, Colon, CommaOrClose, Done };

  void skip_space() {
    while (pos_ < in_.size() && is_space(in_[pos_])) ++pos_;
  }

  // Copies a string token (the opening quote at pos_); cuts its content once the output is past
  // the budget. False when the string is not valid JSON.
  bool string_token(bool cut_allowed) {
    ++pos_;
    out_ += '"';
    bool cut = false;
    while (pos_ < in_.size()) {
      const auto c = static_cast<unsigned char>(in_[pos_]);
      if (c == '"') {
        ++pos_;
        if (cut) out_ += "...[cut]";
        out_ += '"';
        return true;
      }
      // Cut only between characters: never inside an escape or a UTF-8 sequence.
      if (cut_allowed && !cut && out_.size() >= max_bytes_ && (c & 0xC0) != 0x80) cut = true;
      if (c == '\\') {
        if (pos_ + 1 >= in_.size()) return false;
        const char e = in_[pos_ + 1];
        std::size_t len = 2;
        if (e == 'u') {
          if (pos_ + 6 > in_.size()) return false;
          for (std::size_t k = 2; k < 6; ++k)
            if (!std::isxdigit(static_cast<unsigned char>(in_[pos_ + k]))) return false;
          len = 6;
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return false;
        }
        if (!cut) out_.append(in_.substr(pos_, len));
        pos_ += len;
        continue;
      }
      if (!cut) {
        if (c < 0x20) {
          out_ += "\\u00";
          out_ += kHex[c >> 4];
          out_ += kHex[c & 15];
        } else {
          out_ += static_cast<char>(c);
        }
      }
      ++pos_;
    }
    return false;
  }

  // Skips one container whose opening bracket is at pos_, counting brackets outside strings.
  bool skip_container() {
    std::size_t depth = 0;
    while (pos_ < in_.size()) {
      const char c = in_[pos_];
      if (c == '"') {
        ++pos_;
        while (pos_ < in_.size() && in_[pos_] != '"') pos_ += in_[pos_] == '\\' ? 2 : 1;
        if (pos_ >= in_.size()) return false;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) {
          ++pos_;
          return true;
        }
      }
      ++pos_;
    }
    return false;
  }

  bool atom() {
    const std::size_t start = pos_;
    while (pos_ < in_.size()) {
      const char c = in_[pos_];
      if (is_space(c) || c == ',' || c == ']' || c == '}' || c == ':' || c == '[' || c == '{' ||
          c == '"')
        break;
      ++pos_;
    }
    const std::string_view a = in_.substr(start, pos_ - start);
    if (a != "true" && a != "false" && a != "null" && !valid_number(a)) return false;
    out_.append(a);
    return true;
  }

  Want after_value() const {
    return open_.empty() ? Want::Done : Want::CommaOrClose;
  }

  // Past the budget at the start of an element: a marker, then every open container closed.
  void cut_here() {
    const std::string marker = fmt::format("\"[cut at {} bytes]\"", max_bytes_);
    if (open_.back() == '{') out_ += marker + ":null";
    else out_ += marker;
    while (!open_.empty()) {
      out_ += open_.back() == '{' ? '}' : ']';
      open_.pop_back();
    }
    cut_ = true;
  }

  bool value_sequence() {
    Want want = Want::Value;
    for (;;) {
      skip_space();
      if (pos_ >= in_.size()) return want == Want::Done;
      const char c = in_[pos_];
      if (want == Want::Done) return false;  // text after the value
      switch (want) {
        case Want::KeyOrClose:
        case Want::ValueOrClose:
          if (c == (want == Want::KeyOrClose ? '}' : ']')) break;  // empty container
          if (out_.size() >= max_bytes_) {
            cut_here();
            return true;
          }
          want = want == Want::KeyOrClose ? Want::Key : Want::Value;
          continue;
        case Want::Key:
          if (c != '"' || !string_token(false)) return false;
          want = Want::Colon;
          continue;
        case Want::Colon:
          if (c != ':') return false;
          out_ += ':';
          ++pos_;
          want = Want::Value;
          continue;
        case Want::CommaOrClose:
          if (c == ',') {
            out_ += ',';
            ++pos_;
            if (out_.size() >= max_bytes_) {
              out_.pop_back();
              cut_after_comma();
              return true;
            }
            want = open_.back() == '{' ? Want::Key : Want::Value;
            continue;
          }
          break;  // a close, checked below
        case Want::Value:
          if (c == '{' || c == '[') {
            if (open_.size() >= max_depth_) {
              if (!skip_container()) return false;
              out_ += fmt::format("\"[nested deeper than {} levels: cut]\"", max_depth_);
              want = after_value();
              continue;
            }
            open_.push_back(c);
            out_ += c;
            ++pos_;
            want = c == '{' ? Want::KeyOrClose : Want::ValueOrClose;
            continue;
          }
          if (c == '"') {
            if (!string_token(true)) return false;
          } else if (!atom()) {
            return false;
          }
          want = after_value();
          continue;
        case Want::Done:
          return false;
      }
      // A closing bracket.
      if (open_.empty() || c != (open_.back() == '{' ? '}' : ']')) return false;
      out_ += c;
      open_.pop_back();
      ++pos_;
      want = after_value();
    }
  }

  void cut_after_comma() {
    out_ += ',';
    cut_here();
  }

  std::string_view in_;
  std::size_t pos_ = 0;
  std::size_t max_depth_, max_bytes_;
  std::vector<char> open_;  // at most max_depth_ entries
  std::string out_;
  bool cut_ = false;
};

}  // namespace

std::string bounded_json(std::string_view raw, std::size_t max_depth, std::size_t max_bytes) {
  return Writer(raw, max_depth, max_bytes).run();
}

void append_json_string(std::string &out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == '<') {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}

std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

}  // namespace cmg::report
