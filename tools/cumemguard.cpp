// SPDX-License-Identifier: Apache-2.0
// The `cumemguard` command: run a program under the shim, read its logs, inspect configuration.
// It never loads the shim into itself.
#include <cstdio>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>

#include "cli.h"
#include "cmg_config.h"
#include "options.h"
#include "run_cmd.h"
#include "subcommands.h"

namespace {

void usage(FILE *f) {
  std::fputs(cmg::tools::cli::help_text(cmg::tools::cli::command("")).c_str(), f);
}

}  // namespace

int main(int argc, char **argv, char **envp) {
  if (argc < 2) {
    // One usage line and where the rest is (git's and valgrind's habit), not the whole help.
    const auto &top = cmg::tools::cli::command("");
    std::fprintf(stderr, "Usage: cumemguard %.*s\ntry 'cumemguard --help' for more information\n",
                 static_cast<int>(top.synopsis.size()), top.synopsis.data());
    return 64;
  }
  std::string cmd = argv[1];
  if (cmd == "run") return cmg::tools::run_main(argc - 2, argv + 2);
  if (cmd == "report") return cmg::tools::report_entry(argc - 1, argv + 1);
  if (cmd == "config") return cmg::tools::config_entry(argc - 1, argv + 1, envp);
  if (cmd == "version" && argc > 2) {
    // `version --help` used to print the version: it has no options of its own.
    const std::string arg = argv[2];
    if (arg == "--help" || arg == "-h") {
      std::printf("Usage: cumemguard version\n\nPrints the version of cumemguard.\n\nExit "
                  "status:\n  0   the version was printed\n  64  an argument was given\n");
      return 0;
    }
    // Every command answers --version, this one too (the README and --help say so).
    if (arg == "--version") {
      std::printf("cumemguard %s\n", CMG_VERSION);
      return 0;
    }
    std::fprintf(stderr, "cumemguard version: unexpected argument '%s' (see cumemguard --help)\n",
                 arg.c_str());
    return 64;
  }
  if (cmd == "version" || cmd == "--version") {
    std::printf("cumemguard %s\n", CMG_VERSION);
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  // "reprot": the command meant, as git says it, before where the list is.
  constexpr std::string_view kCommands[] = {"run", "report", "config", "version"};
  const std::size_t near = cmg::closest_name(cmd, kCommands);
  std::fprintf(stderr, "cumemguard: unknown command '%s'%s%s%s (see cumemguard --help)\n",
               cmd.c_str(), near < std::size(kCommands) ? " (did you mean " : "",
               near < std::size(kCommands) ? kCommands[near].data() : "",
               near < std::size(kCommands) ? "?)" : "");
  return 64;
}
