// SPDX-License-Identifier: Apache-2.0
// The checks of the program's environment that stop `cumemguard run` before it starts the
// program, as it will be (the user's settings, -e and run's own exports applied), shared by run
// and `cumemguard config --run`, which refuses what run refuses with run's status and words.
#pragma once

#include <string>
#include <string_view>

#include "options.h"
#include "run_args.h"

namespace cmg::tools {

struct EnvRefusal {
  int status = 0;    // 0: the program can start; 64 a value that cannot apply; 73 a log unwritable
  std::string line;  // without the command's name
};

// `user`: the options as the user set them (before run's defaults); `eff`: as the program gets
// them; `getenv`: the program's environment; `not_started`: how the line says the refusal ("the
// program was not started"). In order: the suppressions file (a regular file of at most 1 MiB the
// shim can read), the event log's name (%q{VAR} of a variable that is not set, an unknown
// placeholder: 64) and its place (73; the default log in the current directory too).
EnvRefusal program_env_refusal(const RunArgs &a, const ParsedOptions &user, const Options &eff,
                               const char *(*getenv)(const char *),
                               std::string_view not_started);

}  // namespace cmg::tools
