// SPDX-License-Identifier: Apache-2.0
// Standalone `cumemguard-config` (same as `cumemguard config`) until the cumemguard dispatcher
// exists.
#include "config_cmd.h"

int main(int argc, char **argv, char **envp) {
  return cmg::config_main(argc, argv, envp);
}
