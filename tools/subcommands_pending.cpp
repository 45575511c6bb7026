// SPDX-License-Identifier: Apache-2.0
// Placeholder entry point until the report subcommand is linked in.
#include <cstdio>

#include "subcommands.h"

namespace cmg::tools {

int report_entry(int, char **) {
  std::fprintf(stderr, "cumemguard report: not available in this build\n");
  return 70;
}

}  // namespace cmg::tools
