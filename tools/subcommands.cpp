// SPDX-License-Identifier: Apache-2.0
// Subcommand entry points that forward to their implementations.
#include "subcommands.h"

#include "config_cmd.h"

namespace cmg::tools {

int config_entry(int argc, char **argv, char **envp) { return cmg::config_main(argc, argv, envp); }

}  // namespace cmg::tools
