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
  const std::vector<SuppressionFrame> vendor = {{"cudaFree", "/usr/lib/libcudart.so.13"},
                                                {"vendor_release", "/b/libcmgvendor.so"},
                                                {"main", "/b/suppress_cases"}};
  CHECK(s.match("double-free", vendor) == 0);
  CHECK(s.match("invalid-free", vendor) == 1);
  const std::vector<SuppressionFrame> own = {{"program_double_free", "/b/suppress_cases"},
                                             {"main", ""}};
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

// Two double frees through one function, `release`, from two callers: a rule naming it
// matches both; an anchored rule, the stack from its call site, only the one it names.
TEST_CASE("An anchored rule matches the stack from its call site, frame by frame, in order") {
  const std::vector<SuppressionFrame> a = {{"cudaFree", "/usr/lib/libcudart.so.13"},
                                           {"", "/usr/lib/x86_64-linux-gnu/libc.so.6"},
                                           {"release", "/b/prog"},
                                           {"path_a", "/b/prog"},
                                           {"main", "/b/prog"},
                                           {"", ""},
                                           {"_start", "/b/prog"}};
  std::vector<SuppressionFrame> b = a;
  b[3].function = "path_b";
  auto plain = Suppressions::parse("double-free:release\n", "f");
  CHECK(plain.match("double-free", a) == 0);
  CHECK(plain.match("double-free", b) == 0);
  auto s = Suppressions::parse("double-free:^release;path_a;main;*;_start\n", "f");
  REQUIRE(s.warnings.empty());
  CHECK(s.match("double-free", a) == 0);
  CHECK(s.match("double-free", b) == -1);
  // A prefix of the stack is enough; a frame globbed by its module or basename too.
  CHECK(Suppressions::parse("*:^release;path_?\n", "f").match("double-free", b) == 0);
  CHECK(Suppressions::parse("*:^prog;path_a\n", "f").match("double-free", a) == 0);
  // Anchored: the call site first, not any frame (path_a is the second frame), and every glob
  // needs a frame (the stack has 5 from its call site).
  CHECK(Suppressions::parse("*:^path_a\n", "f").match("double-free", a) == -1);
  CHECK(Suppressions::parse("*:^release;path_a;main;*;_start;*\n", "f").match("double-free", a) ==
        -1);
  // The infrastructure before the call site is skipped only before it.
  CHECK(Suppressions::parse("*:^release;main\n", "f").match("double-free", a) == -1);
}

TEST_CASE("An anchored rule on a Python stack names its Python frames, not the native ones") {
  const std::vector<SuppressionFrame> st = {{"ffi_call_unix64", "/usr/lib/libffi.so.8"},
                                            {"", "/usr/bin/python3.11"},
                                            {"free_buffer", "/app/b.py", true},
                                            {"cleanup", "/app/b.py", true},
                                            {"", "/usr/bin/python3.11"},
                                            {"<module>", "/app/b.py", true},
                                            {"__libc_start_main", "/lib/libc.so.6"}};
  auto m = [&](const char *rule) {
    return Suppressions::parse(rule, "f").match("double-free", st);
  };
  CHECK(m("double-free:^free_buffer;cleanup;<module>\n") == 0);
  CHECK(m("double-free:^free_buffer;b.py\n") == 0);
  CHECK(m("double-free:^ffi_call_unix64\n") == -1);
  CHECK(m("double-free:^free_buffer;<module>\n") == -1);
  CHECK(m("double-free:^free_buffer;cleanup;<module>;*\n") == -1);
}

TEST_CASE("An anchored FUNCTION@FILE frame names the function in that file only") {
  // report --gen-suppressions wrote `^main;<module>`: every script's main() matched it.
  const std::vector<SuppressionFrame> mine = {{"main", "/app/double_free.py", true},
                                              {"<module>", "/app/double_free.py", true}};
  const std::vector<SuppressionFrame> other = {{"main", "/app/train.py", true},
                                               {"<module>", "/app/train.py", true}};
  const std::vector<SuppressionFrame> native = {{"release", "/b/libvendor.so.1"},
                                                {"main", "/b/prog"}};
  auto m = [](const char *rule, const std::vector<SuppressionFrame> &st) {
    return Suppressions::parse(rule, "f").match("double-free", st);
  };
  const char *rule = "double-free:^main@/app/double_free.py;<module>@/app/double_free.py\n";
  CHECK(m(rule, mine) == 0);
  CHECK(m(rule, other) == -1);
  CHECK(m("double-free:^main@double_free.py\n", mine) == 0);  // the basename too
  CHECK(m("double-free:^main@double_free.py\n", other) == -1);
  CHECK(m("double-free:^release@libvendor.so.1;main@prog\n", native) == 0);
  CHECK(m("double-free:^release@libother.so;main@prog\n", native) == -1);
  // A frame string with an `@` of its own still matches as a whole.
  const std::vector<SuppressionFrame> versioned = {{"memcpy@@GLIBC_2.14", "/b/prog"}};
  CHECK(m("double-free:^memcpy@@GLIBC_2.14\n", versioned) == 0);
}

TEST_CASE("An anchored pattern with an empty frame is a malformed line") {
  auto s = Suppressions::parse("double-free:^\ndouble-free:^a;;b\ndouble-free:^a;\n", "f");
  CHECK(s.rules.empty());
  REQUIRE(s.warnings.size() == 3);
  CHECK(s.warnings[0] == "f:1: anchored pattern '^' has an empty frame (^F1;F2;...); skipped");
  CHECK(s.warnings[1] == "f:2: anchored pattern '^a;;b' has an empty frame (^F1;F2;...); skipped");
}
