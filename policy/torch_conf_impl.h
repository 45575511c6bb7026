// SPDX-License-Identifier: Apache-2.0
// Shared by the files of the PyTorch allocator-config model (torch_conf_*.cpp), not part of its
// interface: c10's errors as C++ exceptions, ConfigTokenizer, the parse state and the per-scope
// parsers the diagnostics and the merge reuse item by item.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "torch_conf.h"

namespace cmg::torchconf::impl {

// Constants of c10 (CachingAllocator.h / AllocatorConfig.h).
inline constexpr std::uint64_t kMB = 1ull << 20;
inline constexpr std::uint64_t kMinLargeAllocMb = 10;      // kMinLargeAlloc / kMB
inline constexpr std::uint64_t kMaxRegisterThreads = 128;  // pinned_max_register_threads(), L89-94
inline constexpr std::string_view kAsyncToken = "cudaMallocAsync";

// ---- c10 errors as C++ exceptions inside the model only (never leave the public functions)

struct Raised {
  TorchError e;
};

[[noreturn]] void raise_value(std::string msg);
// std::stoull / std::stod failures reach Python as RuntimeError with what() = "stoull" / "stod".
[[noreturn]] void raise_runtime(std::string msg);
// ConfigTokenizer::checkIndex, the assert seen as "…AllocatorConfig.h":124 in the [I] abort (§7).
[[noreturn]] void raise_index();
// skipKey and the roundup list parser assert on an unterminated '['; their line is not recorded.
[[noreturn]] void raise_bracket(std::string_view file);
// Vector S6: the runtime backend must equal the allocator chosen at load time by parser L.
[[noreturn]] void raise_backend_mismatch(Backend runtime, Backend load);

bool is_space(char c);
// llvm::isPowerOf2_64: 0 is not a power of 2.
bool is_power_of_2(std::uint64_t v);
std::string quote(std::string_view s);
// Python's repr of a float ("0.8", "1.0") and of a bool.
std::string py_float(double d);
std::string py_bool(bool b);

// ---- ConfigTokenizer (c10/core/AllocatorConfig.h L35-128), call for call

class Tokenizer {
 public:
  explicit Tokenizer(std::string_view s) : t_(tokenize(s)) {}
  std::size_t size() const { return t_.size(); }
  const std::string &operator[](std::size_t i) const {
    check(i);
    return t_[i];
  }
  // The result is ignored by every caller in PyTorch (§3): only the bound is checked.
  bool checkToken(std::size_t i, std::string_view tok) const {
    check(i);
    return t_[i] == tok;
  }
  std::uint64_t toSizeT(std::size_t i) const;  // std::stoull: sign, trailing garbage, ERANGE
  double toDouble(std::size_t i) const;        // std::stod
  bool toBool(std::size_t i) const;            // exactly True / False (L80-98)
  // Returns the index of the value, or of the ']' closing a list value.
  std::size_t skipKey(std::size_t i) const;

 private:
  void check(std::size_t i) const {
    if (i >= t_.size()) raise_index();
  }
  std::vector<std::string> t_;
};

// ---- parse state

inline std::size_t key_slot(Key k) {
  return static_cast<std::size_t>(k);
}

struct Ctx {
  Settings *s;
  std::array<bool, kKeyCount> set{};  // keys assigned by this parse
  std::size_t key_index = 0;          // key being parsed (for diagnostics)
  std::vector<std::string> *warnings = nullptr;
  const Grammar *g = &default_grammar();  // the release whose parser this is
  void mark(Key k) { set[key_slot(k)] = true; }
  void warn(std::string w) const {
    if (warnings) warnings->push_back(std::move(w));
  }
};

// ---- the per-scope parsers (torch_conf_parse.cpp); each returns the index of the item's last
// token

bool a_owns(Key k);  // parser A owns the key (else C, or L for the backend at load)
std::size_t a_large_segment(const Tokenizer &t, std::size_t i, Ctx &c);
// One item of an A-owned key (large_segment_size_mb included).
std::size_t a_known_item(const Tokenizer &t, std::size_t i, Ctx &c, Key k);
// One item of a C-owned key; `loaded`: the backend chosen at import, checked against `backend`.
std::size_t c_known_item(const Tokenizer &t, std::size_t i, Ctx &c, Key k,
                         std::optional<Backend> loaded);
void a_parse_args(std::string_view env, Ctx &c);
void c_parse_args(std::string_view env, Ctx &c, std::optional<Backend> loaded);
Backend l_parse(std::string_view env, Ctx &c);

// ---- the legacy parser of 2.0 to 2.7 (torch_conf_legacy.cpp)

// CUDAAllocatorConfig::parseArgs before the split: one parser for every key, RuntimeError for
// every failure. `loaded`: the backend BackendStaticInitializer chose at import.
void legacy_parse_args(std::string_view env, Ctx &c, std::optional<Backend> loaded);
// BackendStaticInitializer::parseEnvForBackend before the split: regex splits that never throw.
Backend legacy_load(std::string_view env, Ctx &c);

// ---- helpers of the diagnostics, shared with the plan (torch_conf_lint.cpp)

// Why the item at token `key` cannot be delimited ("'expandable_segments' has no ':' and value").
std::string structural_cause(const std::vector<Token> &toks, std::size_t key);
// " (did you mean max_split_size_mb?)", " (keys are case-sensitive: ...)", or "".
std::string key_hint(std::string_view key);

}  // namespace cmg::torchconf::impl
