// SPDX-License-Identifier: Apache-2.0
// Checked reads of this process's own memory for the Python frame reader: a pointer taken from an
// interpreter structure is never dereferenced before the page it lies in has been read once
// through the kernel (process_vm_readv on our own pid, which answers EFAULT instead of faulting).
// Pages proven readable are remembered per thread, so a repeated site reads directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cmg::shim::py {

inline constexpr std::uintptr_t kPage = 4096;
inline constexpr int kPages = 64;  // per thread, direct-mapped by page number

// Pages of this thread's own Python objects read once through the kernel. Initial-exec TLS: the
// shim is preloaded, so its block is in the static TLS of every thread.
struct PageCache {
  std::uintptr_t page[kPages];
};
extern thread_local __attribute__((tls_model("initial-exec"))) PageCache t_pages;

inline bool page_known(std::uintptr_t page) {
  return t_pages.page[(page / kPage) % kPages] == page;
}

bool read_slow(std::uintptr_t addr, void *out, std::size_t n, bool owned);

// [addr, addr + n) as a pointer when every page of it was proven readable before (owned memory
// only), else nullptr.
inline const unsigned char *known(std::uintptr_t addr, std::size_t n) {
  if (n > kPage || !addr || addr + n <= addr) return nullptr;
  const std::uintptr_t first = addr & ~(kPage - 1), last = (addr + n - 1) & ~(kPage - 1);
  if (!page_known(first) || (last != first && !page_known(last))) return nullptr;
  return reinterpret_cast<const unsigned char *>(addr);
}

// Copies n bytes at addr into out. False when any byte is not readable (nothing is then to be
// trusted in out). `owned`: the memory belongs to objects the calling thread keeps alive (its own
// thread state, frames, their code objects and strings), so a page proven readable once stays so
// and is read directly afterwards; other memory (another thread's state) is read through the
// kernel every time.
// Inline: a repeated site reads its frames through here tens of times per stack.
inline bool read(std::uintptr_t addr, void *out, std::size_t n, bool owned = true) {
  if (const unsigned char *p = owned ? known(addr, n) : nullptr) {
    std::memcpy(out, p, n);
    return true;
  }
  return read_slow(addr, out, n, owned);
}

template <class T>
bool read_as(std::uintptr_t addr, T &v, bool owned = true) {
  return read(addr, &v, sizeof v, owned);
}

// False when the kernel refuses process_vm_readv (a seccomp filter): no read can be checked.
// The first call tries one read of the shim's own memory.
bool checked_reads_available();

}  // namespace cmg::shim::py
