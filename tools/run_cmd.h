// SPDX-License-Identifier: Apache-2.0
// `cumemguard run` and the shim lookup shared by the subcommands.
#pragma once

#include <string>

namespace cmg::tools {

int run_main(int argc, char **argv);
// The shim to preload: $CUMEMGUARD_SHIM_PATH, the build tree, then the install location.
std::string find_shim();

}  // namespace cmg::tools
