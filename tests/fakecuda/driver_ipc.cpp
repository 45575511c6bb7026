// SPDX-License-Identifier: Apache-2.0
// Fake driver: legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle / cuIpcCloseMemHandle) over the
// exporter's arena memfd, opened through /proc/<pid>/fd so that the bytes are really shared.
#include "driver_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace fc {
namespace {

// The 64 bytes of a CUipcMemHandle; what is not used stays zero so that two exports of the same
// allocation give identical bytes (bug-patterns.md P14).
struct IpcWire {
  unsigned magic;
  unsigned version;
  long long pid;
  int fd;
  int dev;
  unsigned long long nonce;
  unsigned long long offset;
  unsigned long long size;
};
static_assert(sizeof(IpcWire) <= sizeof(CUipcMemHandle));
constexpr unsigned kIpcMagic = 0xfc1bc0de;

CUresult get_handle(CUipcMemHandle *out, CUdeviceptr p) {
  if (CUresult r = require_init()) return r;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  Region r = m.describe(p);
  // real-driver.md section 2: VMM memory is refused with INVALID_VALUE; so is memory that is not
  // cuMemAlloc memory (pool and managed allocations cannot be exported this way either).
  if (r.kind != Region::Linear || r.lkind != LinearKind::Device) return CUDA_ERROR_INVALID_VALUE;
  const Linear &l = m.linear.at(r.base);
  IpcWire w{};
  w.magic = kIpcMagic;
  w.version = 1;
  w.pid = getpid();
  w.fd = l.arena->fd;
  w.dev = l.dev;
  w.nonce = l.arena->nonce;
  w.offset = l.offset;
  w.size = l.size;
  std::memset(out, 0, sizeof *out);
  std::memcpy(out->reserved, &w, sizeof w);
  return CUDA_SUCCESS;
}

// Opens the exporter's arena and checks its header, so that a dead exporter or a reused fd number
// is an error code and never a wrong mapping.
int open_arena(const IpcWire &w) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/fd/%d", w.pid, w.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return -1;
  ArenaHeader h{};
  if (pread(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
      std::memcmp(h.magic, kArenaMagic, sizeof h.magic) != 0 || h.pid != w.pid || h.nonce != w.nonce) {
    close(fd);
    return -1;
  }
  return fd;
}

CUresult open_handle(CUdeviceptr *pdptr, const CUipcMemHandle &handle, unsigned int flags) {
  if (CUresult r = require_init()) return r;
  if (!pdptr || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
    return CUDA_ERROR_INVALID_VALUE;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  IpcWire w;
  std::memcpy(&w, handle.reserved, sizeof w);
  if (w.magic != kIpcMagic || w.version != 1 || w.size == 0 || w.fd < 0 || w.pid <= 0)
    return CUDA_ERROR_INVALID_VALUE;
  // A handle opened in the process that exported it is refused like on the real driver.
  if (w.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
  const IpcKey key{w.pid, w.fd, w.nonce, w.offset};
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  // real-driver.md section 2: a second open of the same handle returns the same pointer and
  // needs its own close.
  if (auto it = m.import_by_key.find(key); it != m.import_by_key.end()) {
    ++m.imports.at(it->second).refs;
    *pdptr = it->second;
    return CUDA_SUCCESS;
  }
  int fd = open_arena(w);
  if (fd < 0) return CUDA_ERROR_MAP_FAILED;
  const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  const std::size_t start = w.offset / page * page;
  const std::size_t len = align_up(w.offset + w.size - start, page);
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(start));
  close(fd);
  if (p == MAP_FAILED) return CUDA_ERROR_MAP_FAILED;
  const auto ptr = reinterpret_cast<std::uintptr_t>(p) + (w.offset - start);
  m.imports.emplace(ptr, Import{key, static_cast<char *>(p), len, w.size, dev, 1});
  m.import_by_key.emplace(key, ptr);
  *pdptr = ptr;
  return CUDA_SUCCESS;
}

CUresult close_handle(CUdeviceptr p) {
  if (CUresult r = require_init()) return r;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.imports.find(p);
  if (it == m.imports.end()) return CUDA_ERROR_INVALID_VALUE;
  if (--it->second.refs == 0) {
    munmap(it->second.map_base, it->second.map_len);
    m.import_by_key.erase(it->second.key);
    m.imports.erase(it);
  }
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr) {
  return FC_CALL(cuIpcGetMemHandle, get_handle(pHandle, dptr));
}

FC_EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags) {
  return FC_CALL(cuIpcOpenMemHandle, open_handle(pdptr, handle, Flags));
}

FC_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                         unsigned int Flags) {
  return FC_CALL(cuIpcOpenMemHandle_v2, open_handle(pdptr, handle, Flags));
}

FC_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr) {
  return FC_CALL(cuIpcCloseMemHandle, close_handle(dptr));
}
