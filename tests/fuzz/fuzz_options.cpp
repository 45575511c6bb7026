// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the CUMEMGUARD_* option parser (policy/options.cpp) on hostile environments.
// Input: NAME=VALUE entries separated by '\n' or NUL; names without the prefix get it added, so
// most inputs reach the value parsers. Invariants: no exception, every problem is one printable
// line of bounded length, and every option parsed without a problem keeps a value it can print.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "options.h"

namespace {

[[noreturn]] void fail(const char *what) {
  std::fprintf(stderr, "fuzz_options: invariant broken: %s\n", what);
  std::abort();  // libFuzzer saves the input as a crash
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  std::vector<std::string> owned;
  std::size_t pos = 0;
  while (pos <= in.size() && owned.size() < 64) {
    std::size_t end = in.find_first_of(std::string_view("\n\0", 2), pos);
    if (end == std::string_view::npos) end = in.size();
    std::string_view e = in.substr(pos, end - pos);
    if (e.rfind(cmg::kOptionPrefix, 0) != 0) owned.push_back(std::string(cmg::kOptionPrefix) + std::string(e));
    else owned.emplace_back(e);
    pos = end + 1;
  }
  std::vector<std::pair<std::string_view, std::string_view>> env;
  for (const std::string &e : owned) {
    const std::size_t eq = e.find('=');
    if (eq == std::string::npos) continue;
    env.emplace_back(std::string_view(e).substr(0, eq), std::string_view(e).substr(eq + 1));
  }
  cmg::ParsedOptions p = cmg::parse_options(env);
  for (const std::string &msg : p.problems) {
    // One line on the host's stderr per problem: no control characters (a value with a newline
    // or an escape sequence must not forge a second line or drive the terminal), bounded length.
    if (msg.empty() || msg.size() > 1024) fail("problem line empty or unbounded");
    for (char c : msg)
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) fail("control character in a problem line");
  }
  if (p.values.size() != cmg::option_specs().size()) fail("one value per option");
  if (p.fatal && !p.options.strict_config) fail("fatal without strict_config");
  // The helpers on their own, with the whole input.
  std::uint64_t sz = 0;
  if (cmg::parse_size(in, sz) && sz == 0 && in.find_first_not_of("0") != std::string_view::npos &&
      in.find_first_of("123456789") != std::string_view::npos)
    fail("parse_size accepted a non-zero number as zero");
  bool b = false;
  (void)cmg::parse_bool(in, b);
  if (in.size() < 256) (void)cmg::edit_distance(in, "QUARANTINE");
  return 0;
}
