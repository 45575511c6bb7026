// SPDX-License-Identifier: Apache-2.0
// The suppressions matcher: file parsing with its warnings, globs, and matching frame strings.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "suppressions.h"

using namespace cmg;

TEST_CASE("Globs match the whole string") {
  CHECK(glob_match("*libvendor*", "/opt/v/libvendor.so.1"));
  CHECK(glob_match("libvendor.so.?", "libvendor.so.1"));
  CHECK_FALSE(glob_match("libvendor.so.?", "libvendor.so.12"));
  CHECK(glob_match("vendor_*", "vendor_release"));
  CHECK_FALSE(glob_match("vendor", "vendor_release"));  // anchored
  CHECK(glob_match("*", ""));
  CHECK(glob_match("a*b*c", "aXXbYYc"));
  CHECK_FALSE(glob_match("a*b*c", "aXXbYY"));
  CHECK(glob_match("ns::f(*)", "ns::f(int, char const*)"));
  // Many stars against a long miss: linear backtracking, no blow-up and no recursion.
  std::string p(2000, '*');
  p += "x";
  CHECK_FALSE(glob_match(p, std::string(100000, 'a')));
}

TEST_CASE("The file: rules, comments, and one warning per malformed line naming file:line") {
  auto s = Suppressions::parse("# vendor bugs\n"
                               "\n"
                               "double-free:vendor_release\n"
                               "  * : *libcmgvendor*  \n"
                               "no colon here\n"
                               "dobule-free:x\n"
                               "double-release:\n"
                               "stale-release:libfoo.so.?\r\n",
                               "supp.txt");
  REQUIRE(s.rules.size() == 3);
  CHECK(s.rules[0].text() == "double-free:vendor_release");
  CHECK(s.rules[0].line == 3);
  CHECK(s.rules[1].text() == "*:*libcmgvendor*");
  CHECK(s.rules[2].text() == "stale-release:libfoo.so.?");
  REQUIRE(s.warnings.size() == 3);
  CHECK(s.warnings[0] == "supp.txt:5: 'no colon here' is not CLASS:PATTERN; skipped");
  CHECK(s.warnings[1] == "supp.txt:6: unknown finding class 'dobule-free'; skipped");
  CHECK(s.warnings[2] == "supp.txt:7: empty pattern after 'double-release:'; skipped");
}

TEST_CASE("A finding is suppressed by the first rule whose class fits and a frame matches") {
  auto s = Suppressions::parse("double-free:vendor_release\n*:*libcmgvendor*\n", "f");
  const std::vector<std::string> vendor = {"cudaFree", "/usr/lib/libcudart.so.13", "libcudart.so.13",
                                           "vendor_release", "/b/libcmgvendor.so", "libcmgvendor.so",
                                           "main", "/b/suppress_cases", "suppress_cases"};
  CHECK(s.match("double-free", vendor) == 0);
  CHECK(s.match("invalid-free", vendor) == 1);
  const std::vector<std::string> own = {"program_double_free", "/b/suppress_cases",
                                        "suppress_cases", "main"};
  CHECK(s.match("double-free", own) == -1);
  CHECK(Suppressions{}.match("double-free", vendor) == -1);
}

TEST_CASE("Malformed lines are capped: a huge file of junk gives a bounded number of warnings") {
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "junk\n";
  auto s = Suppressions::parse(text, "big");
  CHECK(s.rules.empty());
  REQUIRE(s.warnings.size() == 9);
  CHECK(s.warnings[8] == "big: and 19992 more malformed lines; skipped");
}
