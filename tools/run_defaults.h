// SPDX-License-Identifier: Apache-2.0
// What `cumemguard run` sets in the program's environment when the user set nothing for it (by
// its variable or an entry of CUMEMGUARD_OPTIONS): the debug profile, the exit summary, an event
// log in the current directory. `cumemguard config --run` shows these, marked as set by run, so
// that the listing and the run agree (tests/integration/check_config_run.py compares the two).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "options.h"

namespace cmg::tools {

struct RunDefault {
  std::string name;   // CUMEMGUARD_PROFILE, CUMEMGUARD_SUMMARY, CUMEMGUARD_LOG
  std::string value;  // as exported
  std::string by;     // the run option that set it ("--mode"), empty for run's own default
};
// RunDefault::by of the user's own relative CUMEMGUARD_LOG, made absolute by run.
inline constexpr std::string_view kMadeAbsolute = "(made absolute)";

// `user`: the options as the environment sets them before the launcher adds anything;
// `program`: the program as given (its file name names the log); `cwd`: the directory the log
// goes to (absolute, so a program that changes directory still writes where the launcher looks).
std::vector<RunDefault> run_defaults(const ParsedOptions &user, const std::string &program,
                                     const std::string &cwd);

// Why `cumemguard run` does not start a program with these CUMEMGUARD_* settings, one line each
// (without the shim's fallback, "; ignored" and the like): an unknown name, a bad value, a
// malformed CUMEMGUARD_OPTIONS entry. A name set twice is let through (the shim says which entry it
// used). `cumemguard config --run` refuses the same.
std::vector<std::string> run_refusals(const ParsedOptions &parsed);

// True when the user set option `name` (without the prefix) by a variable or an entry.
bool set_by_user(const ParsedOptions &user, std::string_view name);

}  // namespace cmg::tools
