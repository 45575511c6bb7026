// SPDX-License-Identifier: Apache-2.0
// Subcommand entry points that forward to their implementations.
#include "subcommands.h"

#include "config_cmd.h"
#include "report.h"

namespace cmg::tools {

int config_entry(int argc, char **argv, char **envp) { return cmg::config_main(argc, argv, envp); }

int report_entry(int argc, char **argv) { return cmg::report_main(argc, argv); }

}  // namespace cmg::tools
