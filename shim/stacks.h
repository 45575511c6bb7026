// SPDX-License-Identifier: Apache-2.0
// Stack capture for allocation/free/map/unmap/release events: return addresses only, stored once
// per distinct stack in the log (heaptrack's habit); symbolization happens later, in the report.
#pragma once

#include <cstdint>

namespace cmg::shim {

// Captures up to `max_frames` return addresses of the caller (the shim's own frames dropped),
// writes the `module` and `stack` records the first time they are seen, and returns the stack id
// (0 when nothing was captured).
std::uint32_t capture_stack(int max_frames);
// The two halves of capture_stack: the return addresses alone (into pc[0..max), count returned),
// and the id of such a list, writing its records the first time it is seen.
int capture_pcs(std::uintptr_t *pc, int max_frames);
std::uint32_t intern_stack(const std::uintptr_t *pc, int n);

// Warm the unwinder once at activation (its first use may load or initialise data).
void stacks_warm_up();

// fork(): the table lock is held across it; the child's log starts empty, so the child forgets
// which stacks and modules were written.
void stacks_fork_prepare();
void stacks_fork_parent();
void stacks_fork_child();

}  // namespace cmg::shim
