// SPDX-License-Identifier: Apache-2.0
// Suppressions (CUMEMGUARD_SUPPRESSIONS): silence a known finding in a library without turning
// its class off, in the spirit of ASan's and valgrind's suppression files. Pure C++: the shim
// reads the file and symbolizes the frames; this parses, globs and matches.
//
// File: one rule a line, `CLASS:PATTERN`; blank lines and lines starting with `#` are skipped.
// CLASS is a finding class id (`double-release`, ...) or `*`. PATTERN is a glob (`*` any run of
// characters, `?` one) matched against the whole of each frame string: a frame's function name
// (demangled), its module's path, or the module's basename. A finding is suppressed by the first
// rule whose class fits and whose pattern matches any frame.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cmg {

// A suppressions file is a few lines; one larger than this is not one (the shim refuses it, and
// `cumemguard run` stops before the program starts).
inline constexpr std::size_t kMaxSuppressionsBytes = 1u << 20;

struct SuppressionRule {
  std::string cls;      // a finding class id, or "*"
  std::string pattern;  // the glob
  std::size_t line;     // 1-based line in the file
  std::string text() const { return cls + ":" + pattern; }  // as the log and summary name it
};

struct Suppressions {
  std::vector<SuppressionRule> rules;
  std::vector<std::string> warnings;  // "FILE:LINE: why; skipped" (capped, then counted)

  // `file` only names the source in warnings.
  static Suppressions parse(std::string_view text, std::string_view file);
  // The index of the first rule for class id `cls` whose pattern matches one of `frames`, or -1.
  int match(std::string_view cls, std::span<const std::string> frames) const;
};

// Whole-string glob match: `*` any run (also empty), `?` any one character, anything else itself.
// Iterative (no recursion, linear backtracking): a hostile pattern cannot exhaust the stack.
bool glob_match(std::string_view pattern, std::string_view s);

}  // namespace cmg
