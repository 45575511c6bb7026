// SPDX-License-Identifier: Apache-2.0
// The `cumemguard` command: run a program under the shim, read its logs, inspect configuration.
// It never loads the shim into itself.
#include <cstdio>
#include <cstring>
#include <string>

#include "cmg_config.h"
#include "run_cmd.h"
#include "subcommands.h"

namespace {

void usage(FILE *f) {
  std::fprintf(f,
               "Usage: cumemguard COMMAND [ARGS...]\n"
               "\n"
               "Guards and explains CUDA memory management in a program it preloads\n"
               "libcumemguard.so into, and reads the event logs that leaves.\n"
               "\n"
               "Commands:\n"
               "  run [options] -- PROGRAM [ARGS...]   run PROGRAM with the shim preloaded\n"
               "  report [options] LOG...             read event logs: findings, leaks, bytes\n"
               "  config [--json] [--env NAME=VALUE]  PyTorch allocator config and CUMEMGUARD_* options\n"
               "  version                             print the version\n"
               "\n"
               "Options:\n"
               "  -h, --help     this help\n"
               "  --version      print the version\n"
               "\n"
               "`cumemguard COMMAND --help` describes each command; each takes --version too.\n"
               "\n"
               "Exit status (every command):\n"
               "  0    success\n"
               "  1    findings (report; config: PyTorch would fail on the environment)\n"
               "  64   a usage error: an unknown command or option, a bad argument\n"
               "  66   an input file cannot be read\n"
               "  73   run: the event log cannot be written (the program is not started)\n"
               "  run passes the program's own status otherwise (see cumemguard run --help)\n");
}

}  // namespace

int main(int argc, char **argv, char **envp) {
  if (argc < 2) {
    usage(stderr);
    return 64;
  }
  std::string cmd = argv[1];
  if (cmd == "run") return cmg::tools::run_main(argc - 2, argv + 2);
  if (cmd == "report") return cmg::tools::report_entry(argc - 1, argv + 1);
  if (cmd == "config") return cmg::tools::config_entry(argc - 1, argv + 1, envp);
  if (cmd == "version" || cmd == "--version") {
    std::printf("cumemguard %s\n", CMG_VERSION);
    return 0;
  }
  if (cmd == "help" || cmd == "--help" || cmd == "-h") {
    usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "cumemguard: unknown command '%s' (see cumemguard --help)\n", cmd.c_str());
  return 64;
}
