// SPDX-License-Identifier: Apache-2.0
// Placeholder entry points until the report and config subcommands are linked in.
#include <cstdio>

#include "subcommands.h"

namespace cmg::tools {

int report_entry(int, char **) {
  std::fprintf(stderr, "cumemguard report: not available in this build\n");
  return 70;
}

int config_entry(int, char **, char **) {
  std::fprintf(stderr, "cumemguard config: not available in this build\n");
  return 70;
}

}  // namespace cmg::tools
