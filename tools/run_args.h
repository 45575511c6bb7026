// SPDX-License-Identifier: Apache-2.0
// The options of `cumemguard run` (run_options.def) as one reader, one set of checks and one list
// of what they export, shared by the launcher and by `cumemguard config --run`: the listing shows
// the environment the same options give the program, and refuses what run refuses.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "options.h"
#include "run_defaults.h"

namespace cmg::tools {

struct RunArgs {
  std::string log, mode, stacks, exitcode, suppressions;
  bool no_log = false, no_summary = false, fail_on_leaks = false, brief = false;
  bool help = false, version = false;
  std::vector<std::string> env_sets;    // -e NAME=VALUE, as given
  std::vector<std::string_view> given;  // the options given, by their table name
};

enum class RunOptionRead { NotOne, Taken, Bad };

// argv[i] as one of run's options: NotOne when the table has no such option; Taken, with i on its
// value when it takes one; Bad with `err` set (one line, without the command's name) for a
// missing value, an empty --log or a second --suppressions. `command` ("run", "config") is the
// one whose --help the line names.
RunOptionRead read_run_option(int argc, char **argv, int &i, RunArgs &r, std::string_view command,
                              std::string &err);

// True for NAME of a variable the launcher sets or reads for itself (a row of policy/options.def
// marked Internal): -e cannot give it to the program.
bool launcher_variable(std::string_view name);

struct RunChecked {
  int error_exitcode = 0;
  std::vector<std::pair<std::string, std::string>> sets;  // the -e values, NAME and VALUE
  std::vector<std::string> refusals;  // one line each, without the command's name; empty: all apply
};

// The checks run makes of its own options before anything starts, in its order, stopping at the
// first that fails: --mode one of its choices, --log with --no-log, --error-exitcode 0 to 255,
// --fail-on-leaks with it, --stacks a valid CUMEMGUARD_STACKS, each -e a NAME=VALUE, of no
// launcher variable, with a CUMEMGUARD_* value the shim accepts, and no launcher option with an -e
// of the setting it makes. `not_started` ends the line refusing a setting ("the program was not
// started").
RunChecked check_run_args(const RunArgs &a, std::string_view not_started);

// What the launcher exports after the -e values, in order: the settings of its options
// (CUMEMGUARD_MODE, _STACKS, _SUPPRESSIONS made absolute, _WARN_FRAMES for --brief), its defaults
// where the user set nothing (run_defaults(), less the summary with --no-summary and the log with
// --log or --no-log), then CUMEMGUARD_LOG for --log (absolute) or --no-log (empty). `user`: the
// options of the environment with the -e values in it; `cwd`: absolute.
std::vector<RunDefault> run_exports(const RunArgs &a, const ParsedOptions &user,
                                    const std::string &program, const std::string &cwd);

// The line refusing CUMEMGUARD_TORCH_ALLOC_CONF=`value` for the plan's `reason`, naming the
// variable and its value when the reason does not (a result PyTorch would raise on), without the
// shim's fallback ("; keeping the original"): the launcher keeps nothing, it does not start the
// program. `entry`: the value is CUMEMGUARD_OPTIONS' torch_alloc_conf entry, named so (the
// label already says CUMEMGUARD_OPTIONS; the variable it names was not set).
std::string torch_override_refusal(std::string_view value, const std::string &reason,
                                   bool entry = false);

// The CUMEMGUARD_TORCH_ALLOC_CONF override in force (`po`: the program's environment parsed) and
// the words naming where it was set, for a refusal: the variable or the torch_alloc_conf entry of
// CUMEMGUARD_OPTIONS (the variable wins over the entry), given with -e (`sets`) or inherited
// ("environment"). Run and config plan this value, as the shim does.
struct TorchOverride {
  std::string value;  // empty: none
  std::string label;
  bool entry = false;  // CUMEMGUARD_OPTIONS' torch_alloc_conf entry, not the variable
};
TorchOverride torch_override(const ParsedOptions &po,
                             const std::vector<std::pair<std::string, std::string>> &sets);

// The launcher options given (`given`: their names as the table spells them, "--log") against the
// -e NAME=VALUE settings (`sets`): the line refusing the first option whose shim option an -e
// also sets, as CUMEMGUARD_NAME or as an entry of CUMEMGUARD_OPTIONS (run_options.def,
// CMG_RUN_OPTION_SETS), or empty. One rule for every such option: neither silently wins.
// check_run_args() adds what follows from it ("the program was not started").
std::string option_env_conflict(const std::vector<std::string_view> &given,
                                const std::vector<std::pair<std::string, std::string>> &sets);

}  // namespace cmg::tools
