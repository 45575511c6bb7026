// SPDX-License-Identifier: Apache-2.0
// In-process symbolizer used to classify a free's stack: the function around each return
// address, read from the ELF symbol table of the object on disk. PyTorch's allocator functions
// are local symbols, in .symtab and absent from .dynsym, so dladdr() cannot name them
// (nccl-and-cleanup.md 0.4 and 4.5). The shim links no libelf or libdw: <elf.h> and mmap only.
// Results are cached per address for the life of the process, and the cost is paid only where
// the flush policy asks (frees while opportunistic cleanup is suppressed).
#pragma once

#include <cstdint>
#include <string>

#include "transport.h"

namespace cmg::shim {

struct FrameSym {
  std::string module;              // path of the object, empty when no object holds the address
  std::uintptr_t module_base = 0;  // its load bias
  std::string name;                // the symbol as in the file (mangled), empty when unknown
  std::string demangled;           // demangled, or the name itself when it is not a C++ name
  std::uintptr_t start = 0;        // absolute start of the function, 0 when unknown
  FrameKind kind = FrameKind::Other;
};

// Frames of n return addresses (innermost first), looked up at pc - 1 (the call instruction)
// under one lock. The entries stay valid for the rest of the process.
void frame_syms(const std::uintptr_t *pc, int n, const FlushPatterns &patterns,
                const FrameSym **out);

// "function+0x1c (libfoo.so)", "libfoo.so+0x1234" or "0x7f..." by what is known.
std::string frame_text(const FrameSym &f, std::uintptr_t pc);

// fork(): the lock is held across it; the child keeps the cache (same address space).
void symtab_fork_prepare();
void symtab_fork_parent();
void symtab_fork_child();

}  // namespace cmg::shim
