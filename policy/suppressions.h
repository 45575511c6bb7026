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
//
// An anchored PATTERN, `^G1;G2;...;Gn`, names the stack itself instead of one frame: its first n
// frames, in order, must match G1..Gn (each glob as above, against one frame's names), where the
// stack starts at the call site: with Python frames, the innermost Python frame (the Python frames
// alone, as the interpreter's native frames differ between builds); otherwise the innermost native
// frame that is not the shim's, the CUDA libraries' or libc's. A glob `FUNCTION@FILE` there names a
// frame by its function and its module (or Python file: path or basename) at once. `report
// --gen-suppressions` writes these, so that a rule stands for the one stack it came from (that
// script's main(), not every script's), not every stack through a frame.
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
// Native frames the shim captures to match a finding against: an anchored rule longer than this
// could never match, so `report --gen-suppressions` writes at most this many.
inline constexpr int kSuppressionFrames = 48;

struct SuppressionRule {
  std::string cls;      // a finding class id, or "*"
  std::string pattern;  // the glob
  std::size_t line;     // 1-based line in the file
  std::string text() const { return cls + ":" + pattern; }  // as the log and summary name it
};

// One frame of a finding's stack as the matcher sees it, innermost first.
struct SuppressionFrame {
  std::string function;  // demangled name, or a Python frame's qualified name; empty: unknown
  std::string module;    // the module's path, or a Python frame's file; empty: unknown
  bool python = false;
};

struct Suppressions {
  std::vector<SuppressionRule> rules;
  std::vector<std::string> warnings;  // "FILE:LINE: why; skipped" (capped, then counted)

  // `file` only names the source in warnings.
  static Suppressions parse(std::string_view text, std::string_view file);
  // The index of the first rule for class id `cls` whose pattern matches `frames` (one of them,
  // or for an anchored rule the stack from its call site), or -1.
  int match(std::string_view cls, std::span<const SuppressionFrame> frames) const;
};

// The shim, the CUDA driver and runtime, and libc: the frames a call passes through below its call
// site (by the module's basename), never where an anchored stack starts.
bool suppression_infrastructure(std::string_view module);

// Whole-string glob match: `*` any run (also empty), `?` any one character, anything else itself.
// Iterative (no recursion, linear backtracking): a hostile pattern cannot exhaust the stack.
bool glob_match(std::string_view pattern, std::string_view s);

}  // namespace cmg
