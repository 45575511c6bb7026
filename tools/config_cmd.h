// SPDX-License-Identifier: Apache-2.0
// `cumemguard config`: how PyTorch reads its allocator variables, and every CUMEMGUARD_* option.
#pragma once

#include <iosfwd>

namespace cmg {

// cumemguard config [--json] [--env NAME=VALUE | --env NAME]...
// argv[0] is the subcommand's own name and is skipped (call it with argv pointing at "config").
// Exit status: 0; 2 when PyTorch would fail on this environment (an exception at the first CUDA
// allocation, or an abort during import torch); 64 for bad arguments (one line on stderr).
int config_main(int argc, char **argv, char **envp);
// The same, writing to the given streams (for tests).
int config_main(int argc, char **argv, char **envp, std::ostream &out, std::ostream &err);

}  // namespace cmg
