// SPDX-License-Identifier: Apache-2.0
// Entry points of the subcommands that live in their own files (argv[0] is the subcommand name).
#pragma once

namespace cmg::tools {

int report_entry(int argc, char **argv);
int config_entry(int argc, char **argv, char **envp);

}  // namespace cmg::tools
