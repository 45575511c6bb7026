// SPDX-License-Identifier: Apache-2.0
// A stack walker with a per-thread cache of unwind rules, for the stacks the shim captures on
// allocation and VMM events. libgcc's _Unwind_Backtrace re-parses the DWARF call-frame information
// of every frame on every capture (measured: about 280 ns per frame, 4.4 us for 16 frames,
// docs/performance.md); libunwind caches it and is ~30x faster, but Debian's static libunwind is
// not position-independent and needs liblzma, so the shim cannot link it. This walker keeps, per
// return address, the rule that gives the caller's frame (CFA = rsp or rbp + offset, where the
// return address and rbp were saved), computed once from the same .eh_frame data libgcc reads.
// x86-64 only. Anything it does not model (CFA expressions, signal frames, registers saved in other
// registers, code without unwind data, a stack it cannot bound) makes it give up, and the caller
// falls back to _Unwind_Backtrace for that capture: the result is always what libgcc would give.
#pragma once

#include <cstdint>

namespace cmg::shim {

// Return addresses of the callers of cached_backtrace's caller, innermost first, exactly as
// _Unwind_Backtrace + _Unwind_GetIP report them, after the leading frames for which skip(pc) is
// true. Returns the number written (up to max), or -1 when the walk met something it does not
// model (nothing is then to be trusted in pcs).
int cached_backtrace(std::uintptr_t *pcs, int max, bool (*skip)(std::uintptr_t pc));

// The same walk with libgcc's unwinder (reference and fallback).
int libgcc_backtrace(std::uintptr_t *pcs, int max, bool (*skip)(std::uintptr_t pc));

// A number that changes when the loader adds or removes an object (checked at most once a second,
// by the walks themselves): what was looked up among the loaded objects may need looking up again.
std::uint64_t objects_generation();

// The calling thread's stack [lo, hi), once a walk on this thread has found it: false before.
// No allocation, no lock (the crash handler asks too).
bool this_thread_stack(std::uintptr_t &lo, std::uintptr_t &hi);

// Around fork: the child frees the per-thread caches of the threads it does not have.
void stackwalk_fork_prepare();
void stackwalk_fork_parent();
void stackwalk_fork_child();

}  // namespace cmg::shim
