// SPDX-License-Identifier: Apache-2.0
// The CUMEMGUARD_* option table and parser: defaults, bad values, unknown names, modes, actions.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cctype>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "options.h"
#include "units.h"

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
  auto p = parse({{"CUMEMGUARD_STACKS", "abc"},
                  {"CUMEMGUARD_MODE", "loud"},
                  {"CUMEMGUARD_SUMMARY", ""},
                  {"CUMEMGUARD_WARN_LIMIT", "-1"},
                  {"CUMEMGUARD_STACK_SAMPLE", "0"},
                  {"CUMEMGUARD_QUARANTINE", "auto"}});
  REQUIRE(p.problems.size() == 5);
  CHECK(p.problems[0] == "CUMEMGUARD_STACKS: 'abc' is not valid: not a whole number; keeping '0'");
  CHECK(p.problems[1] ==
        "CUMEMGUARD_MODE: 'loud' is not valid: expected one of "
        "guard|report|strict; keeping 'guard'");
  CHECK(p.problems[3] ==
        "CUMEMGUARD_WARN_LIMIT: '-1' is not valid: must not be negative; "
        "keeping '20'");
  CHECK(p.problems[4] ==
        "CUMEMGUARD_STACK_SAMPLE: '0' is not valid: must be at least 1; "
        "keeping '1'");
  CHECK(p.options.quarantine == kAutoSize);  // auto is a value of QUARANTINE, carried as is
  CHECK(p.values.front().spec->name == "PROFILE");
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

TEST_CASE("A misspelt prefix is an unknown option with the name it meant") {
  // Read by nothing: it passed without a word, and run started the program without the option.
  auto p = parse({{"CUMEMGAURD_STACKS", "3"}, {"CUMEMGURD_OPTIONS", "mode=report"},
                  {"cumemgaurd_mode", "report"}, {"CUMEMGAURD_FOO", "1"}, {"CUDA_STACKS", "1"},
                  {"CUMEMXXXRD_STACKS", "1"}, {"CUMEMGUARD", "1"}});
  REQUIRE(p.problems.size() == 3);
  CHECK(p.problems[0] ==
        "unknown option CUMEMGAURD_STACKS (did you mean CUMEMGUARD_STACKS?); ignored");
  CHECK(p.problems[1] ==
        "unknown option CUMEMGURD_OPTIONS (did you mean CUMEMGUARD_OPTIONS?); ignored");
  CHECK(p.problems[2] ==
        "unknown option cumemgaurd_mode (did you mean CUMEMGUARD_MODE?); ignored");
  CHECK(p.problem_kinds[0] == p.problem_kinds[1]);
  CHECK(p.options.stacks == 0);
  CHECK(p.options.mode == Mode::Guard);
  CHECK(cmg::misspelt_prefix_meant("CUMEMGUARD_STACKS").empty());  // the real prefix
  CHECK(cmg::misspelt_prefix_meant("CMG_STACKS").empty());         // three edits away
  CHECK(cmg::misspelt_prefix_meant("CUMEMGUADR_STACKS") == "CUMEMGUARD_STACKS");
  // The shim reads environ: the misspelt name is not filtered out before the check.
  char a[] = "CUMEMGAURD_STACKS=3", b[] = "PATH=/bin", c[] = "CUMEMGAURD_STACKS";
  char *envp[] = {a, b, c, nullptr};
  const auto q = cmg::parse_options(envp);
  REQUIRE(q.problems.size() == 1);
  CHECK(q.problems[0] ==
        "unknown option CUMEMGAURD_STACKS (did you mean CUMEMGUARD_STACKS?); ignored");
}

TEST_CASE("Strict config makes problems fatal") {
  auto p = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"}, {"CUMEMGUARD_QUARANTINE", "lots"}});
  CHECK(p.fatal);
  auto q = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"}});
  CHECK_FALSE(q.fatal);
  // The process aborts at these lines: none says what a run that went on would have done.
  auto r = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"},
                  {"CUMEMGUARD_STAKS", "1"},
                  {"CUMEMGUARD_QUARANTINE", "lots"},
                  {"CUMEMGUARD_MODE", "guard"},
                  {"CUMEMGUARD_MODE", "report"},
                  {"CUMEMGUARD_OPTIONS", "verbose:frob=1"}});
  CHECK(r.fatal);
  CHECK(r.problems == std::vector<std::string>{
                          "unknown option CUMEMGUARD_STAKS (did you mean CUMEMGUARD_STACKS?)",
                          "CUMEMGUARD_MODE is set 2 times in the environment",
                          "CUMEMGUARD_OPTIONS: 'verbose' is not NAME=VALUE",
                          "CUMEMGUARD_OPTIONS: unknown option frob",
                          "CUMEMGUARD_QUARANTINE: 'lots' is not valid: not a size (a number of "
                          "bytes, optionally with K, M, G or T) nor auto"});
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

namespace {
const OptionValue &value_of(const ParsedOptions &p, std::string_view name) {
  for (const auto &v : p.values)
    if (v.spec->name == name) return v;
  FAIL("no option " << name);
  return p.values.front();
}
}  // namespace

TEST_CASE("A name present twice is read as getenv reads it: the first entry wins") {
  auto p = parse({{"CUMEMGUARD_MODE", "strict"},
                  {"CUMEMGUARD_LOG", "/tmp/a"},
                  {"CUMEMGUARD_MODE", "report"},
                  {"CUMEMGUARD_LOG", "/tmp/b"},
                  {"CUMEMGUARD_MODE", "loud"}});
  CHECK(p.options.mode == Mode::Strict);
  CHECK(p.options.log == "/tmp/a");
  REQUIRE(p.problems.size() == 2);
  CHECK(p.problems[0] ==
        "CUMEMGUARD_MODE is set 3 times in the environment; the first ('strict') is used, as "
        "getenv() does");
  CHECK(p.problems[1] ==
        "CUMEMGUARD_LOG is set 2 times in the environment; the first ('/tmp/a') is used, as "
        "getenv() does");
  CHECK(value_of(p, "MODE").raw == "strict");
}

TEST_CASE("Every kind of problem is capped: 20,000 bad values print a bounded number of lines") {
  std::vector<std::string> names;
  for (int i = 0; i < 20000; ++i) names.push_back("CUMEMGUARD_NOPE" + std::to_string(i));
  std::vector<std::pair<std::string_view, std::string_view>> env;
  for (const auto &n : names) env.emplace_back(n, "1");
  for (int i = 0; i < 20000; ++i) env.emplace_back("CUMEMGUARD_MODE", "loud");
  std::string opts;
  for (int i = 0; i < 20000; ++i) opts += "stacks=x:";
  for (int i = 0; i < 20000; ++i) opts += "junk:";
  for (int i = 0; i < 20000; ++i) opts += "warn_limit=-" + std::to_string(i + 1) + ":";
  env.emplace_back("CUMEMGUARD_OPTIONS", opts);
  // Many different bad variables: each a line, up to the cap.
  std::vector<std::string> bad_names;
  for (const auto &s : option_specs())
    if (s.kind == OptionKind::Int || s.kind == OptionKind::Bool)
      bad_names.push_back("CUMEMGUARD_" + std::string(s.name));
  for (const auto &n : bad_names) env.emplace_back(n, "zzz");
  auto p = parse_options(env);
  // unknown: 8 + 1; repeated MODE: 1; malformed: 8 + 1; bad values (MODE, the last stacks= and
  // warn_limit= entries, one per Int or Bool variable): 8 + 1.
  CHECK(p.problems.size() == 28);
  auto has = [&](const std::string &line) {
    return std::find(p.problems.begin(), p.problems.end(), line) != p.problems.end();
  };
  CHECK(has("and 19992 more unknown CUMEMGUARD_* names; ignored"));
  CHECK(has("and 19992 more malformed CUMEMGUARD_OPTIONS entries; ignored"));
  CHECK(
      has("CUMEMGUARD_MODE is set 20000 times in the environment; the first ('loud') is used, "
          "as getenv() does"));
  std::size_t capped_bad = 0;
  for (const auto &l : p.problems)
    if (l.rfind("and ", 0) == 0 && l.find("invalid CUMEMGUARD_* values") != std::string::npos)
      ++capped_bad;
  CHECK(capped_bad == 1);
}

TEST_CASE("CUMEMGUARD_OPTIONS holds many options; a separate variable wins over it") {
  auto p =
      parse({{"CUMEMGUARD_OPTIONS", "mode=strict:stacks=16:QUARANTINE=64M:log='/tmp/a:b.log'"}});
  CHECK(p.problems.empty());
  CHECK(p.options.mode == Mode::Strict);
  CHECK(p.options.stacks == 16);
  CHECK(p.options.quarantine == (64ull << 20));
  CHECK(p.options.log == "/tmp/a:b.log");
  CHECK(p.has_options_variable);
  CHECK(value_of(p, "MODE").source == OptionSource::Options);
  CHECK(value_of(p, "MODE").raw == "strict");
  CHECK(value_of(p, "IPC").source == OptionSource::Default);

  auto q = parse({{"CUMEMGUARD_MODE", "report"},
                  {"CUMEMGUARD_OPTIONS", "mode=strict:stacks=8:stacks=12:cumemguard_ipc=deny"}});
  CHECK(q.problems.empty());
  CHECK(q.options.mode == Mode::Report);  // the variable wins
  CHECK(value_of(q, "MODE").source == OptionSource::Environment);
  CHECK(q.options.stacks == 12);          // a later entry wins over an earlier one
  CHECK(q.options.ipc == IpcMode::Deny);  // the prefix may be written

  // A bad variable keeps what the entry gave, and says so.
  auto r = parse({{"CUMEMGUARD_STACKS", "lots"}, {"CUMEMGUARD_OPTIONS", "stacks=4"}});
  REQUIRE(r.problems.size() == 1);
  CHECK(r.problems[0] == "CUMEMGUARD_STACKS: 'lots' is not valid: not a whole number; keeping '4'");
  CHECK(r.options.stacks == 4);

  auto e = parse({{"CUMEMGUARD_OPTIONS", "mdoe=strict:verbose:stacks=99::"}});
  REQUIRE(e.problems.size() == 3);
  CHECK(e.problems[0] == "CUMEMGUARD_OPTIONS: unknown option mdoe (did you mean mode?); ignored");
  CHECK(e.problems[1] == "CUMEMGUARD_OPTIONS: 'verbose' is not NAME=VALUE; ignored");
  CHECK(e.problems[2] ==
        "CUMEMGUARD_OPTIONS entry stacks: '99' is not valid: must be between 0 "
        "and 64; keeping '0'");
  auto f = parse({{"CUMEMGUARD_STRICT_CONFIG", "1"}, {"CUMEMGUARD_OPTIONS", "frob=1"}});
  CHECK(f.fatal);
}

TEST_CASE("CUMEMGUARD_OPTIONS: an unclosed quote is said and eats nothing after it") {
  // The quote opened in stacks's value is never closed: it swallowed mode=report and log=...
  auto p = parse({{"CUMEMGUARD_OPTIONS", "stacks='8:mode=report:log=/tmp/x.log"}});
  REQUIRE(p.problems.size() == 2);
  CHECK(p.problems[0] ==
        "CUMEMGUARD_OPTIONS: the quote in 'stacks='8' is not closed; taken as a plain character, "
        "the entry ends at the next ':'");
  CHECK(p.problems[1] ==
        "CUMEMGUARD_OPTIONS entry stacks: ''8' is not valid: not a whole number; keeping '0'");
  CHECK(p.options.mode == Mode::Report);
  CHECK(p.options.log == "/tmp/x.log");
  CHECK(value_of(p, "MODE").source == OptionSource::Options);
  // A closed quote still holds a ':'; a quote character inside a closed quote of the other kind
  // is a plain character, and says nothing.
  auto q = parse({{"CUMEMGUARD_OPTIONS", "log=\"/tmp/it's:here.log\":mode=strict"}});
  CHECK(q.problems.empty());
  CHECK(q.options.log == "/tmp/it's:here.log");
  CHECK(q.options.mode == Mode::Strict);
}

TEST_CASE("Actions a class cannot take are refused with one line") {
  auto p = parse({{"CUMEMGUARD_ACTION_LEAK", "abort"},
                  {"CUMEMGUARD_ACTION_FREE_EXPORTED", "skip"},
                  {"CUMEMGUARD_ACTION_DOUBLE_FREE", "skip"},
                  {"CUMEMGUARD_ACTION_INVALID_FREE", "abort"}});
  REQUIRE(p.problems.size() == 2);
  CHECK(p.problems[0] ==
        "CUMEMGUARD_ACTION_LEAK: 'abort' is not valid: abort cannot apply to leak "
        "findings (they are found at exit); it takes default|forward; keeping "
        "'default'");
  CHECK(p.problems[1] ==
        "CUMEMGUARD_ACTION_FREE_EXPORTED: 'skip' is not valid: skip cannot apply to free-exported "
        "findings (the shim cannot prove the call redundant); it takes default|forward|abort; "
        "keeping 'default'");
  CHECK(p.options.action[static_cast<std::size_t>(FindingClass::Leak)] == ActionOverride::Default);
  CHECK(p.options.action[static_cast<std::size_t>(FindingClass::DoubleFree)] ==
        ActionOverride::Skip);
  CHECK(p.options.action[static_cast<std::size_t>(FindingClass::InvalidFree)] ==
        ActionOverride::Abort);
  // The listing shows what each class takes.
  CHECK(value_of(p, "ACTION_LEAK").spec->choices == "default|forward");
  CHECK(value_of(p, "ACTION_DOUBLE_RELEASE").spec->choices == "default|skip|forward|abort");
  for (std::size_t c = 0; c < kFindingClassCount; ++c) {
    const auto &f = finding_info(static_cast<FindingClass>(c));
    CHECK_FALSE(f.accepts.empty());
    // Skip is offered only where the guard mode itself may skip, or the class can be proven.
    if (f.guard_action == Action::Skip) CHECK(f.accepts.find("skip") != std::string_view::npos);
  }
}

TEST_CASE("Profiles: guard is the default, debug changes only its own column") {
  auto g = parse({});
  CHECK(g.options.profile == Profile::Guard);
  CHECK(g.profile_source == OptionSource::Default);
  CHECK(g.options.stacks == 0);
  CHECK(g.options.quarantine == 0);

  auto d = parse({{"CUMEMGUARD_PROFILE", "debug"}});
  CHECK(d.problems.empty());
  CHECK(d.options.profile == Profile::Debug);
  CHECK(d.profile_source == OptionSource::Environment);
  CHECK(d.options.stacks == 16);
  CHECK(d.options.stack_sample == 1);
  CHECK(d.options.quarantine == kAutoSize);
  CHECK(value_of(d, "STACKS").source == OptionSource::Profile);
  CHECK(value_of(d, "STACKS").effective == "16");
  CHECK(value_of(d, "QUARANTINE").effective == "auto");
  // Sizes print as written, with the largest exact suffix (4294967296 was printed under '4G').
  CHECK(value_of(d, "DEFER_LIMIT").effective == "4G");
  auto sz = parse({{"CUMEMGUARD_QUARANTINE", "1536M"}, {"CUMEMGUARD_DEFER_LIMIT", "1000"}});
  CHECK(value_of(sz, "QUARANTINE").effective == "1536M");
  CHECK(value_of(sz, "DEFER_LIMIT").effective == "1000");
  auto sz2 = parse({{"CUMEMGUARD_QUARANTINE", "2048K"}, {"CUMEMGUARD_DEFER_LIMIT", "0"}});
  CHECK(value_of(sz2, "QUARANTINE").effective == "2M");
  CHECK(value_of(sz2, "DEFER_LIMIT").effective == "0");
  CHECK(value_of(d, "STACK_SAMPLE").source == OptionSource::Default);  // same in both columns
  CHECK(value_of(d, "MODE").source == OptionSource::Default);

  // An explicit setting wins over the profile, from either place.
  auto e = parse({{"CUMEMGUARD_PROFILE", "debug"},
                  {"CUMEMGUARD_STACKS", "4"},
                  {"CUMEMGUARD_OPTIONS", "quarantine=0"}});
  CHECK(e.options.stacks == 4);
  CHECK(e.options.quarantine == 0);
  CHECK(value_of(e, "QUARANTINE").source == OptionSource::Options);

  auto o = parse({{"CUMEMGUARD_OPTIONS", "profile=debug"}});
  CHECK(o.options.profile == Profile::Debug);
  CHECK(o.profile_source == OptionSource::Options);
  CHECK(o.options.stacks == 16);
  // The variable wins over the entry; a bad profile keeps guard.
  auto v = parse({{"CUMEMGUARD_PROFILE", "guard"}, {"CUMEMGUARD_OPTIONS", "profile=debug"}});
  CHECK(v.options.profile == Profile::Guard);
  CHECK(v.problems.empty());
  auto b = parse({{"CUMEMGUARD_PROFILE", "loud"}});
  REQUIRE(b.problems.size() == 1);
  CHECK(b.problems[0] ==
        "CUMEMGUARD_PROFILE: 'loud' is not valid: expected one of guard|debug; "
        "keeping 'guard'");
  CHECK(b.options.stacks == 0);
}

TEST_CASE("The options table round-trips: every effective value parses back to itself") {
  for (const char *profile : {"guard", "debug"}) {
    auto p = parse({{"CUMEMGUARD_PROFILE", profile}});
    std::vector<std::string> names;
    std::vector<std::pair<std::string_view, std::string_view>> env;
    names.reserve(p.values.size());
    for (const auto &v : p.values) names.push_back("CUMEMGUARD_" + std::string(v.spec->name));
    for (std::size_t i = 0; i < p.values.size(); ++i)
      env.emplace_back(names[i], p.values[i].effective);
    auto q = parse_options(env);
    CHECK(q.problems.empty());
    REQUIRE(q.values.size() == p.values.size());
    for (std::size_t i = 0; i < p.values.size(); ++i) {
      CHECK(q.values[i].effective == p.values[i].effective);
      CHECK(q.values[i].source == OptionSource::Environment);
    }
    // And through CUMEMGUARD_OPTIONS, quoted.
    std::string all;
    for (const auto &v : p.values) {
      std::string lower_name;
      for (char c : v.spec->name) lower_name += static_cast<char>(std::tolower(c));
      all += lower_name + "='" + v.effective + "':";
    }
    auto r = parse({{"CUMEMGUARD_OPTIONS", all}});
    CHECK(r.problems.empty());
    for (std::size_t i = 0; i < p.values.size(); ++i)
      CHECK(r.values[i].effective == p.values[i].effective);
  }
}

TEST_CASE("Each problem line has its kind, the count lines too") {
  std::vector<std::pair<std::string_view, std::string_view>> env = {
      {"CUMEMGUARD_STAKS", "3"},
      {"CUMEMGUARD_STACKS", "99"},
      {"CUMEMGUARD_MODE", "report"},
      {"CUMEMGUARD_MODE", "strict"},
      {"CUMEMGUARD_OPTIONS", "mode:warn_limit=1"}};
  std::vector<std::string> many;
  for (int i = 0; i < 12; ++i) many.push_back("CUMEMGUARD_NOPE" + std::to_string(i));
  for (const auto &n : many) env.emplace_back(n, "1");
  const cmg::ParsedOptions p = cmg::parse_options(env);
  REQUIRE(p.problem_kinds.size() == p.problems.size());
  using K = cmg::ProblemKind;
  auto kind_of = [&](std::string_view text) {
    for (std::size_t i = 0; i < p.problems.size(); ++i)
      if (p.problems[i].find(text) != std::string::npos) return p.problem_kinds[i];
    FAIL("no problem line with " << text);
    return K::Unknown;
  };
  CHECK(kind_of("unknown option CUMEMGUARD_STAKS") == K::Unknown);
  CHECK(kind_of("'99' is not valid") == K::BadValue);
  CHECK(kind_of("CUMEMGUARD_MODE is set 2 times") == K::Repeated);
  CHECK(kind_of("'mode' is not NAME=VALUE") == K::Malformed);
  CHECK(kind_of("more unknown CUMEMGUARD_* names") == K::Unknown);
}

TEST_CASE("The buffer forms of escape_controls, shown and human_bytes equal the string forms") {
  const std::string inputs[] = {"",
                                "plain",
                                "tab\there",
                                "esc\x1b[31mred",
                                "c1 \xc2\x9b csi",
                                "rlo \xe2\x80\xae txt",
                                std::string(70, 'x') + "\n",
                                std::string(3000, '\x01')};
  for (const std::string &in : inputs) {
    for (std::size_t max_out :
         {std::size_t{0}, std::size_t{5}, std::size_t{2000}, std::string::npos}) {
      std::size_t used_a = 0, used_b = 0;
      const std::string a = escape_controls(in, max_out, used_a);
      char buf[4 * 3000 + 16];
      const std::string b(buf, escape_controls_to(in, max_out, buf, sizeof buf, used_b));
      CHECK(a == b);
      CHECK(used_a == used_b);
    }
    char sbuf[kShownMax];
    CHECK(shown(in) == std::string(sbuf, shown_to(in, sbuf, sizeof sbuf)));
  }
  // A buffer too small stops before an escape that would not fit, never in the middle of one.
  char small[5];
  std::size_t used = 0;
  CHECK(std::string(small, escape_controls_to("ab\x01", 100, small, sizeof small, used)) == "ab");
  CHECK(used == 2);
  for (std::int64_t v : std::initializer_list<std::int64_t>{
           0, 512, 1023, 1024, 1280, 3 << 20, -(std::int64_t{5} << 30),
           std::numeric_limits<std::int64_t>::max()}) {
    char hb[kHumanMax];
    CHECK(human_bytes(v) == std::string(hb, human_bytes_to(hb, sizeof hb, v)));
  }
  CHECK(human_bytes(3 << 20) == "3.0 MiB");
  char ns[kHumanMax];
  CHECK(std::string(ns, human_ns_to(ns, sizeof ns, 12500)) == "12.5 us");
}
