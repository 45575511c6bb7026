// SPDX-License-Identifier: Apache-2.0
// The faulting thread's stack for the `crash` record (docs/log-format.md), captured and written
// from the fatal-signal handler with async-signal-safe code only: libgcc's unwinder, which finds
// unwind tables through glibc's _dl_find_object (lock-free, glibc 2.35) and reads the interrupted
// frame through the kernel's signal frame; module records from _dl_find_object and the ELF
// headers in memory; lines built with JsonLine (no allocation, no locale). A fault while walking a
// corrupted stack ends the walk, not the handler.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cmg::shim {

// The id of the crash stack's record: the highest id, never given to another stack (the table in
// stacks.cpp counts up from 1).
inline constexpr std::uint32_t kCrashStackId = 0xffffffffu;

// Appends to buf[used, cap) the module records the faulting thread's return addresses need that
// the log does not have yet, then its `stack` record. `uc` is the handler's ucontext. Returns the
// number of addresses (0: no stack record written).
// `python`: also the thread's Python frames (CUMEMGUARD_PYTHON_FRAMES), as far as the code objects
// were interned before (pyframes.h, capture_in_handler).
int write_crash_stack(const void *uc, char *buf, std::size_t cap, std::size_t &used, bool python);

// stacks.cpp: the module [lo, hi) has its record in the log. Lock-free, for the handler to read.
void remember_module_written(std::uintptr_t lo, std::uintptr_t hi);
// fork(): the child's log has no module records yet.
void forget_modules_written();
// Called where the handler is installed: the unwinder's one-time set-up runs outside a handler.
void crash_stack_warm_up();
// The handler asks first: a fault inside the walk jumps back out of it (true when it did).
bool crash_stack_fault_in_walk();

}  // namespace cmg::shim
