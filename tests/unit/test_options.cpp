// SPDX-License-Identifier: Apache-2.0
// The CUMEMGUARD_* option table and parser: defaults, bad values, unknown names, modes, actions.
#include <catch2/catch.hpp>

#include <string>
#include <utility>
#include <vector>

#include "options.h"

using namespace cmg;

namespace {
ParsedOptions parse(std::vector<std::pair<std::string_view, std::string_view>> env) {
  return parse_options(env);
}
}  // namespace

TEST_CASE("Defaults come from the table") {
  auto p = parse({});
  CHECK(p.problems.empty());
  CHECK(p.options.mode == Mode::Guard);
  CHECK(p.options.log_level == LogLevel::Warn);
  CHECK(p.options.stacks == 0);
  CHECK(p.options.stack_sample == 1);
  CHECK(p.options.defer_limit == (4ull << 30));
  CHECK(p.options.ipc == IpcMode::Report);
  CHECK(p.options.opportunistic == FlushPolicy::Report);
  CHECK(p.options.warn_limit == 20);
  for (const auto &v : p.values) CHECK(v.source == OptionSource::Default);
}

TEST_CASE("Values of every kind are parsed") {
  auto p = parse({{"CUMEMGUARD_MODE", "strict"},
                  {"CUMEMGUARD_SUMMARY", "yes"},
                  {"CUMEMGUARD_STACKS", "16"},
                  {"CUMEMGUARD_QUARANTINE", "64M"},
                  {"CUMEMGUARD_LOG", "/tmp/x.%p.log"},
                  {"CUMEMGUARD_IPC", "Bridge"},
                  {"CUMEMGUARD_ACTION_DOUBLE_RELEASE", "forward"},
                  {"PATH", "/usr/bin"}});
  CHECK(p.problems.empty());
  CHECK(p.options.mode == Mode::Strict);
  CHECK(p.options.summary);
  CHECK(p.options.stacks == 16);
  CHECK(p.options.quarantine == (64ull << 20));
  CHECK(p.options.log == "/tmp/x.%p.log");
  CHECK(p.options.ipc == IpcMode::Bridge);
  CHECK(p.options.action[static_cast<std::size_t>(FindingClass::DoubleRelease)] ==
        ActionOverride::Forward);
}

TEST_CASE("A bad value warns once and keeps the default") {
  auto p = parse({{"CUMEMGUARD_STACKS", "abc"}, {"CUMEMGUARD_MODE", "loud"},
                  {"CUMEMGUARD_SUMMARY", ""}, {"CUMEMGUARD_STACKS", "99"}});
  REQUIRE(p.problems.size() == 4);
  CHECK(p.problems[0] ==
        "CUMEMGUARD_STACKS: 'abc' is not valid: not a whole number; keeping '0'");
  CHECK(p.problems[1] == "CUMEMGUARD_MODE: 'loud' is not valid: expected one of "
                         "guard|report|strict; keeping 'guard'");
  CHECK(p.problems[3] == "CUMEMGUARD_STACKS: '99' is not valid: must be between 0 and 64; "
                         "keeping '0'");
  CHECK(p.options.stacks == 0);
  CHECK(p.options.mode == Mode::Guard);
  CHECK_FALSE(p.fatal);
}

TEST_CASE("Unknown CUMEMGUARD_ names warn, with a suggestion only for near misses") {
  auto p = parse({{"CUMEMGUARD_STAKCS", "3"}, {"CUMEMGUARD_FOO", "1"}});
  REQUIRE(p.problems.size() == 2);
  CHECK(p.problems[0] ==
        "unknown option CUMEMGUARD_STAKCS (did you mean CUMEMGUARD_STACKS?); ignored");
  CHECK(p.problems[1] == "unknown option CUMEMGUARD_FOO; ignored");
  // Two adjacent letters swapped are one typo, even in a short name.
  auto q = parse({{"CUMEMGUARD_MOED", "report"}});
  REQUIRE(q.problems.size() == 1);
  CHECK(q.problems[0] == "unknown option CUMEMGUARD_MOED (did you mean CUMEMGUARD_MODE?); ignored");
  CHECK(cmg::edit_distance("MOED", "MODE") == 1);
  CHECK(cmg::edit_distance("MODE", "MODE") == 0);
  CHECK(cmg::edit_distance("STACKS", "STAKCS") == 1);
  CHECK(cmg::edit_distance("ABC", "CA") == 3);  // no edit of a letter twice (optimal alignment)
}

TEST_CASE("Strict config makes problems fatal") {
  auto p = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"}, {"CUMEMGUARD_QUARANTINE", "lots"}});
  CHECK(p.fatal);
  auto q = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"}});
  CHECK_FALSE(q.fatal);
}

TEST_CASE("Sizes and booleans") {
  std::uint64_t v = 0;
  CHECK(parse_size("0", v));
  CHECK(v == 0);
  CHECK(parse_size("4k", v));
  CHECK(v == 4096);
  CHECK(parse_size("2GiB", v));
  CHECK(v == (2ull << 30));
  CHECK(parse_size("512MB", v));
  CHECK(v == (512ull << 20));
  CHECK(parse_size("100b", v));
  CHECK(v == 100);
  CHECK_FALSE(parse_size("", v));
  CHECK_FALSE(parse_size("G", v));
  CHECK_FALSE(parse_size("12X", v));
  CHECK_FALSE(parse_size("99999999999T", v));
  bool b = false;
  CHECK(parse_bool("ON", b));
  CHECK(b);
  CHECK(parse_bool("off", b));
  CHECK_FALSE(b);
  CHECK_FALSE(parse_bool("2", b));
}

TEST_CASE("Actions follow the mode and the per-class overrides") {
  Options o = parse({}).options;
  CHECK(o.action_for(FindingClass::DoubleRelease) == Action::Skip);
  CHECK(o.action_for(FindingClass::PartialUnmap) == Action::Forward);
  CHECK(o.action_for(FindingClass::Leak) == Action::Forward);
  o.mode = Mode::Report;
  CHECK(o.action_for(FindingClass::DoubleRelease) == Action::Forward);
  o.mode = Mode::Strict;
  CHECK(o.action_for(FindingClass::DoubleFree) == Action::Abort);
  CHECK(o.action_for(FindingClass::Leak) == Action::Forward);
  CHECK(o.action_for(FindingClass::Config) == Action::Forward);
  o.strict_config = true;
  CHECK(o.action_for(FindingClass::Config) == Action::Abort);
  o.mode = Mode::Guard;
  o.action[static_cast<std::size_t>(FindingClass::UnmapUnmapped)] = ActionOverride::Abort;
  CHECK(o.action_for(FindingClass::UnmapUnmapped) == Action::Abort);
}

TEST_CASE("The table lists one ACTION_ option per finding class") {
  std::size_t actions = 0;
  for (const auto &s : option_specs())
    if (s.name.rfind("ACTION_", 0) == 0) ++actions;
  CHECK(actions == kFindingClassCount);
  CHECK(finding_info(FindingClass::StaleRelease).option == "ACTION_STALE_RELEASE");
  CHECK(finding_from_id("map-over-mapped") == FindingClass::MapOverMapped);
  CHECK_FALSE(finding_from_id("nope"));
}
