// SPDX-License-Identifier: Apache-2.0
// Other interposers loaded *before* the shim (earlier in LD_PRELOAD, or linked into the program
// ahead of it) that define CUDA memory entry points the shim intercepts: the program's calls reach
// them first, and whatever they answer themselves (a memory limiter's own out-of-memory, a
// GPU-sharing layer's virtual allocations) never reaches the shim. Found once, at activation, from
// the loader's list of objects; named on stderr and in the log header.
#pragma once

#include <string>
#include <vector>

namespace cmg::shim {

struct Interposer {
  std::string path;                 // the object, as the loader names it
  std::vector<const char *> names;  // the intercepted entry points it defines
};

// The objects loaded before the shim (the main program excepted) that define one of the names the
// shim intercepts.
std::vector<Interposer> interposers_before();

// One line for a user: who comes first, what the shim will and will not see.
std::string interposer_note(const Interposer &i);

}  // namespace cmg::shim
