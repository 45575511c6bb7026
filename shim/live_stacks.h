// SPDX-License-Identifier: Apache-2.0
// The stacks printed under a live finding message (CUMEMGUARD_WARN_FRAMES, on in the debugging
// profile `cumemguard run` uses), ASan style: the call's stack, then the stack of each earlier
// event the finding names (the allocation, the first free, the sleep-time unmap), each native frame
// named by the in-process symbolizer (symtab.h: .symtab/.dynsym names and offsets; the report
// tool symbolizes with files and lines from the log later), each Python frame by its code object
// (pyframes.h: qualified name, file and line) in place of the eval frame that runs it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event.h"

namespace cmg::shim {

// Lines (each ending in '\n', each starting with prefix) of at most `frames` frames per stack;
// empty when frames is 0 or no stack is known. call_stack is the finding's own stack id.
std::string finding_stack_lines(const Finding &f, std::uint32_t call_stack, int frames,
                                std::string_view prefix);

}  // namespace cmg::shim
