// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the suppressions file parser and the glob matcher (policy/suppressions.cpp), which
// read a file the user names and match frame names the host's libraries define.
// Input: the file; its first line is also used as a frame string against every rule.
// Invariants: no exception or crash, every warning one printable bounded line, at most
// kMaxProblemsPerKind + 1 warnings, every rule's class known or '*', a rule's own pattern text
// matching itself when it has no wildcard.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "findings.h"
#include "options.h"
#include "suppressions.h"

namespace {

[[noreturn]] void fail(const char *what) {
  std::fprintf(stderr, "fuzz_suppressions: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  const cmg::Suppressions s = cmg::Suppressions::parse(in, "fuzz.supp");
  if (s.warnings.size() > cmg::kMaxProblemsPerKind + 1) fail("warnings not capped");
  for (const std::string &w : s.warnings) {
    if (w.empty() || w.size() > 1024) fail("warning empty or unbounded");
    for (char c : w)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control character in a warning");
  }
  for (const cmg::SuppressionRule &r : s.rules) {
    if (r.cls != "*" && !cmg::finding_from_id(r.cls)) fail("a rule of an unknown class");
    if (r.pattern.empty()) fail("an empty pattern");
    if (r.pattern.find_first_of("*?") == std::string::npos && !cmg::glob_match(r.pattern, r.pattern))
      fail("a literal pattern does not match itself");
  }
  const std::string line(in.substr(0, in.find('\n')));
  const std::vector<cmg::SuppressionFrame> frames = {
      {line, std::string(in), false}, {std::string(in), line, true}, {"", "", false}};
  const int m = s.match("double-free", frames);
  if (m < -1 || m >= static_cast<int>(s.rules.size())) fail("match out of range");
  (void)cmg::glob_match(line, in);
  return 0;
}
