// SPDX-License-Identifier: Apache-2.0
// ConfigTokenizer and c10's errors, transliterated from c10/core/AllocatorConfig.h (L35-128): every
// parser of the PyTorch allocator-config model reads its variable through these, so each quirk
// (whitespace dropped inside words, stoull's sign and trailing garbage, the index assert) is the
// one torch has. Spec: docs/reference/pytorch-alloc-conf.md §3, §7.
#include <cctype>
#include <charconv>
#include <stdexcept>
#include <utility>

#include "torch_conf_impl.h"

namespace cmg::torchconf {
namespace impl {

[[noreturn]] void raise_value(std::string msg) {
  throw Raised{TorchError{ErrorType::ValueError, std::move(msg), false, {}, {}}};
}

[[noreturn]] void raise_runtime(std::string msg) {
  throw Raised{TorchError{ErrorType::RuntimeError, std::move(msg), false, {}, {}}};
}

[[noreturn]] void raise_index() {
  throw Raised{TorchError{ErrorType::RuntimeError, "Index out of bounds in ConfigTokenizer", true,
                          "i < config_.size()", "\"/pytorch/c10/core/AllocatorConfig.h\":124"}};
}

[[noreturn]] void raise_bracket(std::string_view file) {
  throw Raised{
      TorchError{ErrorType::RuntimeError,
                 "Expected closing bracket ']' in ConfigTokenizer but reached end of config", true,
                 "", std::string(file)}};
}

// torch 2.11 prints the condition "tokenizer[i] == get()->name()".
[[noreturn]] void raise_backend_mismatch(Backend runtime, Backend load) {
  std::string msg =
      "Allocator backend parsed at runtime != allocator backend parsed at load time, ";
  msg.append(backend_name(runtime));
  msg += " != ";
  msg.append(backend_name(load));
  throw Raised{TorchError{ErrorType::RuntimeError, std::move(msg), true,
                          "tokenizer[i] == get()->name()",
                          "\"/pytorch/c10/cuda/CUDAAllocatorConfig.cpp\":44"}};
}

bool is_space(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

bool is_power_of_2(std::uint64_t v) {
  return v != 0 && (v & (v - 1)) == 0;
}

std::string quote(std::string_view s) {
  std::string r = "'";
  r.append(s);
  r += '\'';
  return r;
}

std::string py_float(double d) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, ec == std::errc() ? p : buf);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // Python repr of a whole float
  return s;
}

std::string py_bool(bool b) {
  return b ? "True" : "False";
}

std::uint64_t Tokenizer::toSizeT(std::size_t i) const {
  check(i);
  try {
    return std::stoull(t_[i]);  // the same libstdc++ call: sign, trailing garbage, ERANGE
  } catch (const std::exception &e) {
    raise_runtime(e.what());
  }
}

double Tokenizer::toDouble(std::size_t i) const {
  check(i);
  try {
    return std::stod(t_[i]);
  } catch (const std::exception &e) {
    raise_runtime(e.what());
  }
}

bool Tokenizer::toBool(std::size_t i) const {
  check(i);
  if (t_[i] == "True") return true;
  if (t_[i] == "False") return false;
  raise_value("Expected 'True' or 'False' at index " + std::to_string(i) +
              " in ConfigTokenizer but got '" + t_[i] + "'");
}

std::size_t Tokenizer::skipKey(std::size_t i) const {
  checkToken(++i, ":");
  ++i;
  check(i);
  if (t_[i] != "[") return i;
  while (++i < t_.size() && t_[i] != "]") {
  }
  if (i >= t_.size()) raise_bracket("\"/pytorch/c10/core/AllocatorConfig.h\":…");
  return i;
}

}  // namespace impl

// ---- public: tokenizer

std::vector<Token> tokenize_spans(std::string_view s) {
  std::vector<Token> out;
  Token cur;
  bool open = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (open) out.push_back(std::move(cur)), cur = Token{}, open = false;
      out.push_back(Token{std::string(1, ch), i, i + 1});
    } else if (!impl::is_space(ch)) {
      if (!open) cur.begin = i, open = true;
      cur.text += ch;
      cur.end = i + 1;
    }
  }
  if (open) out.push_back(std::move(cur));
  return out;
}

std::vector<std::string> tokenize(std::string_view s) {
  std::vector<std::string> out;
  for (Token &t : tokenize_spans(s)) out.push_back(std::move(t.text));
  return out;
}
}  // namespace cmg::torchconf
