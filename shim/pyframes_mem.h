// SPDX-License-Identifier: Apache-2.0
// Checked reads of this process's own memory for the Python frame reader: a pointer taken from an
// interpreter structure is never dereferenced before the page it lies in has been read once
// through the kernel (process_vm_readv on our own pid, which answers EFAULT instead of faulting).
// Pages proven readable are remembered per thread, so a repeated site reads directly.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cmg::shim::py {

// Copies n bytes at addr into out. False when any byte is not readable (nothing is then to be
// trusted in out). `owned`: the memory belongs to objects the calling thread keeps alive (its own
// thread state, frames, their code objects and strings), so a page proven readable once stays so
// and is read directly afterwards; other memory (another thread's state) is read through the
// kernel every time.
bool read(std::uintptr_t addr, void *out, std::size_t n, bool owned = true);

template <class T>
bool read_as(std::uintptr_t addr, T &v, bool owned = true) {
  return read(addr, &v, sizeof v, owned);
}

// False when the kernel refuses process_vm_readv (a seccomp filter): no read can be checked.
bool checked_reads_available();

}  // namespace cmg::shim::py
