// SPDX-License-Identifier: Apache-2.0
// Subcommand entry points that forward to their implementations.
#include "subcommands.h"

#include <cstdio>
#include <cstring>

#include "cmg_config.h"
#include "config_cmd.h"
#include "report.h"

namespace cmg::tools {

int config_entry(int argc, char **argv, char **envp) { return cmg::config_main(argc, argv, envp); }

// `--version` is answered the same way by every subcommand; report's own parser does not know it.
int report_entry(int argc, char **argv) {
  for (int i = 1; i < argc && argv[i] && std::strcmp(argv[i], "--") != 0; ++i)
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("cumemguard report %s\n", CMG_VERSION);
      return 0;
    }
  return cmg::report_main(argc, argv);
}

}  // namespace cmg::tools
