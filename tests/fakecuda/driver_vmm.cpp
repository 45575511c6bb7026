// SPDX-License-Identifier: Apache-2.0
// Fake driver: the VMM API (cuMemCreate ... cuMemAddressFree) with the results of real-driver.md
// section 1. Physical allocations are memfds, so exported handles really share bytes.
#include "driver_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace fc {
namespace {

// None of these need a current context (bug-patterns.md P27: NCCL calls them from threads without
// one) and none of them waits for the device (real-driver.md section 3).

constexpr std::size_t kFreedVaKept = 64;

bool valid_location(const CUmemLocation &l) {
  switch (l.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: return valid_device(l.id);
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return true;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA: return l.id >= 0;
    default: return false;
  }
}

CUresult check_prop(const CUmemAllocationProp *prop) {
  if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !valid_device(prop->location.id))
    return CUDA_ERROR_INVALID_DEVICE;
  return valid_location(prop->location) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult granularity(std::size_t *gran, const CUmemAllocationProp *prop,
                     CUmemAllocationGranularity_flags option) {
  if (CUresult r = require_init()) return r;
  if (!gran) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_prop(prop)) return r;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *gran = kGranularity;  // D19: minimum = recommended = 2 MiB
  return CUDA_SUCCESS;
}

CUresult create(CUmemGenericAllocationHandle *handle, std::size_t size,
                const CUmemAllocationProp *prop, unsigned long long flags) {
  if (CUresult r = require_init()) return r;
  if (!handle || flags != 0 || size == 0 || size % kGranularity) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_prop(prop)) return r;
  const unsigned types = prop->requestedHandleTypes;
  if (types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR |
                                     CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT |
                                     CU_MEM_HANDLE_TYPE_FABRIC))
    return CUDA_ERROR_INVALID_VALUE;
  // Measured on the H200 (driver 580): a Windows handle type is INVALID_VALUE on Linux.
  if (types & (CU_MEM_HANDLE_TYPE_WIN32 | CU_MEM_HANDLE_TYPE_WIN32_KMT)) return CUDA_ERROR_INVALID_VALUE;
  // real-driver.md section 6: an H200 without an IMEX domain refuses FABRIC with NOT_PERMITTED
  // (PyTorch then retries with POSIX_FD). FAKECUDA_FABRIC=accept models the drivers that accept
  // the request and fail the export later (bug-patterns.md P15).
  if ((types & CU_MEM_HANDLE_TYPE_FABRIC) && !config().fabric_accept) return CUDA_ERROR_NOT_PERMITTED;
  const bool on_device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  const int dev = on_device ? prop->location.id : -1;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  if (on_device && m.used[dev] + size > config().device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  // The memfd name carries the location so that an importer in another process recovers it.
  char name[48];
  if (on_device)
    std::snprintf(name, sizeof name, "fakecuda-vmm:d%d", dev);
  else
    std::snprintf(name, sizeof name, "fakecuda-vmm:host");
  // Benchmark mode: no memfd (two syscalls per create, and their cost varies with the kernel).
  int fd = config().bench ? -1 : memfd_create(name, MFD_CLOEXEC);
  if (fd < 0 && !config().bench) return CUDA_ERROR_OUT_OF_MEMORY;
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const unsigned long long id = m.next_id++;
  PhysAlloc &a = m.allocs[id];
  a.fd = fd;
  a.size = size;
  a.prop = *prop;
  a.charged_dev = dev;
  a.handle_refs = 1;
  if (on_device) m.used[dev] += size;
  const unsigned long long v = m.issue_value();
  m.handles[v] = HandleRef{id, 1};
  m.released_props.erase(v);  // the value names this allocation now
  *handle = v;
  return CUDA_SUCCESS;
}

// D5-D7: a value that is not live (0, never issued, already released) -> INVALID_VALUE.
CUresult release(CUmemGenericAllocationHandle v) {
  if (CUresult r = require_init()) return r;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.handles.find(v);
  if (it == m.handles.end()) return m.release_multicast(v) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
  const unsigned long long id = it->second.alloc;
  if (--it->second.refs == 0) {
    m.released_props[v] = m.allocs.at(id).prop;
    m.handles.erase(it);
    m.retire_value(v);
  }
  --m.allocs.at(id).handle_refs;
  m.drop_if_unused(id);
  return CUDA_SUCCESS;
}

// Benchmark mode hands out reservations from an address range nothing is mapped at (no pages,
// no mmap); they are never touched, since copies and sets are refused in that mode.
std::uintptr_t g_bench_va = std::uintptr_t{0x6f0000000000};

void *map_none(std::uintptr_t at, std::size_t size, bool fixed) {
  if (config().bench) {
    if (fixed) return reinterpret_cast<void *>(at);
    const std::uintptr_t p = g_bench_va;  // callers hold mem().mu
    g_bench_va += align_up(size, kGranularity) + kGranularity;
    return reinterpret_cast<void *>(p);
  }
  return mmap(reinterpret_cast<void *>(at), size, PROT_NONE,
              MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (fixed ? MAP_FIXED : 0), -1, 0);
}

CUresult reserve(CUdeviceptr *ptr, std::size_t size, std::size_t alignment, CUdeviceptr addr,
                 unsigned long long flags) {
  if (CUresult r = require_init()) return r;
  if (!ptr || size == 0 || size % kGranularity || flags != 0 || (alignment & (alignment - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  const std::size_t align = alignment > kGranularity ? alignment : kGranularity;
  if (size > (std::size_t{1} << 47)) return CUDA_ERROR_OUT_OF_MEMORY;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  std::uintptr_t got = 0;
  // D18: address ranges come back like handle values, deterministically the last freed first.
  for (auto it = m.freed_va.rbegin(); it != m.freed_va.rend(); ++it) {
    if (it->second == size && it->first % align == 0 && (!addr || it->first == addr)) {
      got = it->first;
      m.freed_va.erase(std::next(it).base());
      break;
    }
  }
  if (!got && addr && addr % align == 0 && !config().bench) {  // a hint, honoured when free
    void *p = mmap(reinterpret_cast<void *>(addr), size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    if (p != MAP_FAILED && reinterpret_cast<std::uintptr_t>(p) == addr)
      got = addr;
    else if (p != MAP_FAILED)
      munmap(p, size);
  }
  if (!got) {
    void *p = map_none(0, size + align, false);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    const auto b = reinterpret_cast<std::uintptr_t>(p);
    got = align_up(b, align);
    if (!config().bench) {
      if (got > b) munmap(p, got - b);
      if (b + size + align > got + size)
        munmap(reinterpret_cast<void *>(got + size), b + size + align - got - size);
    }
  }
  m.reservations[got] = Reservation{size, {}};
  *ptr = got;
  return CUDA_SUCCESS;
}

// D8, D14: the range must be exactly a live reservation; D11: with nothing mapped in it.
CUresult address_free(CUdeviceptr ptr, std::size_t size) {
  if (CUresult r = require_init()) return r;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.reservations.find(ptr);
  if (it == m.reservations.end() || it->second.size != size || !it->second.maps.empty())
    return CUDA_ERROR_INVALID_VALUE;
  m.reservations.erase(it);
  // The range stays PROT_NONE in this process, kept for deterministic reuse.
  m.freed_va.emplace_back(ptr, size);
  if (m.freed_va.size() > kFreedVaKept) {
    if (!config().bench)
      munmap(reinterpret_cast<void *>(m.freed_va.front().first), m.freed_va.front().second);
    m.freed_va.erase(m.freed_va.begin());
  }
  return CUDA_SUCCESS;
}

CUresult map(CUdeviceptr ptr, std::size_t size, std::size_t offset, CUmemGenericAllocationHandle v,
             unsigned long long flags) {
  if (CUresult r = require_init()) return r;
  if (flags != 0 || size == 0 || ptr % kGranularity || size % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  // cuda.h: "offset ... currently must be zero"; the H200 (driver 580) answered NOT_SUPPORTED.
  if (offset != 0) return CUDA_ERROR_NOT_SUPPORTED;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto h = m.handles.find(v);
  if (h == m.handles.end()) return CUDA_ERROR_INVALID_VALUE;  // bug-patterns.md P31: handle 0
  PhysAlloc &a = m.allocs.at(h->second.alloc);
  if (offset > a.size || size > a.size - offset) return CUDA_ERROR_INVALID_VALUE;
  Reservation *res = m.reservation_of(ptr, size, nullptr);
  if (!res) return CUDA_ERROR_INVALID_VALUE;
  // D12: nothing of the range may be mapped already.
  auto next = res->maps.lower_bound(ptr);
  if (next != res->maps.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
  if (next != res->maps.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second.size > ptr) return CUDA_ERROR_INVALID_VALUE;
  }
  if (!config().bench) {
    void *p = mmap(reinterpret_cast<void *>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, a.fd,
                   static_cast<off_t>(offset));
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Mapping mp{};
  mp.size = size;
  mp.alloc = h->second.alloc;
  mp.offset = offset;
  res->maps.emplace(ptr, mp);
  ++a.mappings;
  return CUDA_SUCCESS;
}

CUresult unmap(CUdeviceptr ptr, std::size_t size) {
  if (CUresult r = require_init()) return r;
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  Reservation *res = m.reservation_of(ptr, size, nullptr);
  if (!res) return CUDA_ERROR_INVALID_VALUE;  // D10: not inside one reservation
  const std::uintptr_t end = ptr + size;
  auto first = res->maps.lower_bound(ptr);
  if (first != res->maps.begin() && std::prev(first)->first + std::prev(first)->second.size > ptr)
    --first;
  auto last = first;
  std::size_t covered = 0;
  for (; last != res->maps.end() && last->first < end; ++last) {
    // D9: only whole mappings can be unmapped.
    if (last->first < ptr || last->first + last->second.size > end) return CUDA_ERROR_INVALID_VALUE;
    covered += last->second.size;
  }
  if (covered == 0) return CUDA_SUCCESS;  // D3, D4: nothing mapped there is not an error
  if (covered != size) return CUDA_ERROR_INVALID_VALUE;  // bug-patterns.md P06: partly mapped
  for (auto it = first; it != last;) {
    map_none(it->first, it->second.size, true);  // back to a plain reservation (D2)
    const unsigned long long id = it->second.alloc;
    --m.allocs.at(id).mappings;
    it = res->maps.erase(it);
    m.drop_if_unused(id);  // D13: a handle released while mapped dies here
  }
  return CUDA_SUCCESS;
}

CUresult set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc *desc, std::size_t count) {
  if (CUresult r = require_init()) return r;
  if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (std::size_t i = 0; i < count; ++i) {
    const CUmemAccessDesc &d = desc[i];
    if (!valid_location(d.location)) return CUDA_ERROR_INVALID_VALUE;
    if (d.flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
      prot = PROT_READ | PROT_WRITE;
    else if (d.flags == CU_MEM_ACCESS_FLAGS_PROT_READ)
      prot |= PROT_READ;
    else if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE)
      return CUDA_ERROR_INVALID_VALUE;
  }
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  if (!m.reservation_of(ptr, size, nullptr)) return CUDA_ERROR_INVALID_VALUE;
  // The range must be whole mappings, back to back: a part of a mapping or an unmapped granule
  // is INVALID_VALUE (both measured on the H200, driver 580).
  for (std::uintptr_t q = ptr; q < ptr + size;) {
    auto *mp = m.mapping_at(q);
    if (!mp || mp->first != q || mp->second.size > ptr + size - q) return CUDA_ERROR_INVALID_VALUE;
    q += mp->second.size;
  }
  if (!config().bench && mprotect(reinterpret_cast<void *>(ptr), size, prot) != 0)
    return CUDA_ERROR_INVALID_VALUE;
  for (std::uintptr_t q = ptr; q < ptr + size;) {
    auto *mp = m.mapping_at(q);
    for (std::size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc &d = desc[i];
      if (d.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        mp->second.dev_access[d.location.id] = static_cast<unsigned char>(d.flags);
      else
        mp->second.host_access = static_cast<unsigned char>(d.flags);
    }
    q = mp->first + mp->second.size;
  }
  return CUDA_SUCCESS;
}

CUresult get_access(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr ptr) {
  if (CUresult r = require_init()) return r;
  if (!flags || !loc || !valid_location(*loc)) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto *mp = m.mapping_at(ptr);
  if (!mp) return CUDA_ERROR_INVALID_VALUE;
  *flags = loc->type == CU_MEM_LOCATION_TYPE_DEVICE ? mp->second.dev_access[loc->id]
                                                    : mp->second.host_access;
  return CUDA_SUCCESS;
}

// D16: a mapped address gives another handle reference to the allocation behind it. Measured on
// the H200 (driver 580): while a handle of the allocation is live, retain returns that same value
// and counts a reference (release, release again both succeed, a third fails); once every handle
// was released, retain issues a new one, whose value may be the released one again (D18), which
// is why D16 saw "same" in one run and "different" in another. FAKECUDA_RETAIN_SAME=0 makes every
// retain issue a new value, the other behaviour a shim must survive.
CUresult retain(CUmemGenericAllocationHandle *handle, void *addr) {
  if (CUresult r = require_init()) return r;
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto *mp = m.mapping_at(reinterpret_cast<std::uintptr_t>(addr));
  if (!mp) return CUDA_ERROR_INVALID_VALUE;
  const unsigned long long id = mp->second.alloc;
  PhysAlloc &a = m.allocs.at(id);
  if (config().retain_same) {
    unsigned long long best = 0;
    for (auto &[v, h] : m.handles)
      if (h.alloc == id && (!best || v < best)) best = v;
    if (best) {
      ++m.handles[best].refs;
      ++a.handle_refs;
      *handle = best;
      return CUDA_SUCCESS;
    }
  }
  const unsigned long long v = m.issue_value();
  m.handles[v] = HandleRef{id, 1};
  m.released_props.erase(v);  // the value names this allocation now
  ++a.handle_refs;
  *handle = v;
  return CUDA_SUCCESS;
}

CUresult properties(CUmemAllocationProp *prop, CUmemGenericAllocationHandle v) {
  if (CUresult r = require_init()) return r;
  if (!prop) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto h = m.handles.find(v);
  if (h == m.handles.end()) {
    // A released value is still answered, with what it last was (D23 on the H200): this query
    // cannot tell a released handle from a live one.
    auto r = m.released_props.find(v);
    if (r == m.released_props.end()) return CUDA_ERROR_INVALID_VALUE;
    *prop = r->second;
    return CUDA_SUCCESS;
  }
  *prop = m.allocs.at(h->second.alloc).prop;
  return CUDA_SUCCESS;
}

CUresult export_handle(void *out, CUmemGenericAllocationHandle v, CUmemAllocationHandleType type,
                       unsigned long long flags) {
  if (CUresult r = require_init()) return r;
  if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto h = m.handles.find(v);
  if (h == m.handles.end()) return CUDA_ERROR_INVALID_VALUE;
  const PhysAlloc &a = m.allocs.at(h->second.alloc);
  // Only POSIX fds exist here; a FABRIC export fails even when the create accepted the type
  // (bug-patterns.md P15), and so does any type the allocation was not created with.
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(a.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_INVALID_VALUE;
  if (a.fd < 0) return CUDA_ERROR_NOT_SUPPORTED;  // benchmark mode: nothing to share
  int fd = dup(a.fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  std::memcpy(out, &fd, sizeof fd);
  return CUDA_SUCCESS;
}

CUresult import_handle(CUmemGenericAllocationHandle *handle, void *os_handle,
                       CUmemAllocationHandleType type) {
  if (CUresult r = require_init()) return r;
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  const int fd = static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle));
  // Only descriptors of fake VMM allocations import: "/memfd:fakecuda-vmm:d0 (deleted)".
  char link[64], target[128];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n <= 0) return CUDA_ERROR_INVALID_VALUE;
  target[n] = 0;
  const char kPrefix[] = "/memfd:fakecuda-vmm:";
  if (std::strncmp(target, kPrefix, sizeof kPrefix - 1) != 0) return CUDA_ERROR_INVALID_VALUE;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0 || st.st_size % kGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  int dev = 0;
  if (std::sscanf(target + sizeof kPrefix - 1, "d%d", &dev) == 1) {
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = valid_device(dev) ? dev : 0;
  } else {
    prop.location.type = CU_MEM_LOCATION_TYPE_HOST;
  }
  int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (own < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  const unsigned long long id = m.next_id++;
  PhysAlloc &a = m.allocs[id];
  a.fd = own;
  a.size = static_cast<std::size_t>(st.st_size);
  a.prop = prop;
  a.imported = true;  // the exporter's device memory: not charged again here
  a.handle_refs = 1;
  const unsigned long long v = m.issue_value();
  m.handles[v] = HandleRef{id, 1};
  m.released_props.erase(v);  // the value names this allocation now
  *handle = v;
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags) {
  return FC_CALL(cuMemCreate, create(handle, size, prop, flags));
}

FC_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return FC_CALL(cuMemRelease, release(handle));
}

FC_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags) {
  return FC_CALL(cuMemAddressReserve, reserve(ptr, size, alignment, addr, flags));
}

FC_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return FC_CALL(cuMemAddressFree, address_free(ptr, size));
}

FC_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return FC_CALL(cuMemMap, map(ptr, size, offset, handle, flags));
}

FC_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return FC_CALL(cuMemUnmap, unmap(ptr, size));
}

FC_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count) {
  return FC_CALL(cuMemSetAccess, set_access(ptr, size, desc, count));
}

FC_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                  CUdeviceptr ptr) {
  return FC_CALL(cuMemGetAccess, get_access(flags, location, ptr));
}

FC_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
  return FC_CALL(cuMemRetainAllocationHandle, retain(handle, addr));
}

FC_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                CUmemGenericAllocationHandle handle,
                                                CUmemAllocationHandleType handleType,
                                                unsigned long long flags) {
  return FC_CALL(cuMemExportToShareableHandle, export_handle(shareableHandle, handle, handleType, flags));
}

FC_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                  void *osHandle,
                                                  CUmemAllocationHandleType shHandleType) {
  return FC_CALL(cuMemImportFromShareableHandle, import_handle(handle, osHandle, shHandleType));
}

FC_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option) {
  return FC_CALL(cuMemGetAllocationGranularity, fc::granularity(granularity, prop, option));
}

FC_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                          CUmemGenericAllocationHandle handle) {
  return FC_CALL(cuMemGetAllocationPropertiesFromHandle, properties(prop, handle));
}
