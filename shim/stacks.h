// SPDX-License-Identifier: Apache-2.0
// Stack capture for allocation/free/map/unmap/release events: return addresses only, stored once
// per distinct stack in the log (heaptrack's habit); symbolization happens later, in the report.
#pragma once

#include <cstdint>

#include "pyframes.h"

namespace cmg::shim {

// One captured stack: the return addresses (the shim's own frames dropped), and in a process that
// runs CPython the calling thread's Python frames, each placed at the eval frame that runs it.
struct Captured {
  std::uintptr_t pc[64];
  int n = 0;
  py::Stack py;
};

// Captures up to `max_frames` return addresses of the caller (the shim's own frames dropped),
// writes the `module` and `stack` records the first time they are seen, and returns the stack id
// (0 when nothing was captured).
std::uint32_t capture_stack(int max_frames);
// The two halves of capture_stack: the frames (up to max_frames return addresses), and the id of
// such a stack, writing its records (module, pycode, stack) the first time it is seen.
void capture(Captured &c, int max_frames);
std::uint32_t intern_stack(const Captured &c);
// capture() in two steps, for a caller that decides from the native frames alone whether it keeps
// the stack (the flush classification): the Python frames are read only for a stack that is kept.
void capture_native(Captured &c, int max_frames);
void capture_python(Captured &c);

// A stack interned before, as it was captured (its return addresses and Python frames); false
// when the id is unknown (0, or a stack of the parent in a forked child).
bool stack_frames(std::uint32_t id, Captured &out);

// The innermost return address of stack `id` (the caller of the intercepted function: the
// allocator's own call site), 0 for no stack. Snapshots and boundaries tell allocators apart by it.
std::uintptr_t stack_site(std::uint32_t id);

// Warm the unwinder once at activation (its first use may load or initialise data).
void stacks_warm_up();

// fork(): the table lock is held across it; the child's log starts empty, so the child forgets
// which stacks and modules were written.
void stacks_fork_prepare();
void stacks_fork_parent();
void stacks_fork_child();

}  // namespace cmg::shim
