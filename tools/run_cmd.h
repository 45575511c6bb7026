// SPDX-License-Identifier: Apache-2.0
// `cumemguard run` and the shim lookup shared by the subcommands.
#pragma once

#include <string>

namespace cmg::tools {

int run_main(int argc, char **argv);
// The shim to preload: $CUMEMGUARD_SHIM_PATH when set (an error when it names no file); beside a
// build tree's tools/ its shim/; otherwise the installed one (relative to this program's prefix,
// then the configured libdir), never a build tree's. Empty with *err saying why.
std::string find_shim(std::string *err = nullptr);

}  // namespace cmg::tools
