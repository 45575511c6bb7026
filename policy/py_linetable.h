// SPDX-License-Identifier: Apache-2.0
// The line a CPython code object is running, from its location table and the byte offset of the
// instruction: what PyCode_Addr2Line computes, decoded here without the interpreter.
//   3.11 and later: co_linetable is the location table of CPython's Objects/locations.md (entries
//   of a start byte 1cccclll, c the kind, l+1 code units, then varints by kind).
//   3.10: co_linetable holds (bytes of code, signed line delta) pairs, -128 meaning no line (PEP
//   626).
#pragma once

#include <cstdint>
#include <span>

namespace cmg {

enum class PyLineTable : std::uint8_t { Pep626, Locations };

// The line of the instruction at byte offset `addr` (a negative offset: the first line), or -1
// when the table gives none (an instruction with no location, a table cut short).
int py_line_for(std::span<const std::uint8_t> table, PyLineTable format, int first_line, int addr);

}  // namespace cmg
