// SPDX-License-Identifier: Apache-2.0
// Fake NCCL: what a communicator holds besides its own buffers, with the semantics of the NCCL
// release that introduced each entry point (NVIDIA/nccl at the tag named):
//
//  * registrations (ncclCommRegister/Deregister, v2.28.9-1 src/register/register.cc): page-aligned
//    slots, a range inside an existing slot takes a reference on it and gets the same handle;
//    NCCL_LOCAL_REGISTER=0 answers a NULL handle; deregistering NULL is success, an unknown handle
//    ncclInvalidUsage; the communicator's end drops them all (ncclRegCleanup);
//  * windows (ncclCommWindowRegister/Deregister, v2.28.9-1 src/dev_runtime.cc): a local
//    registration made through the global scope (libnccl 2.28.9 calls ncclCommRegister and
//    ncclCommDeregister through its PLT: `readelf -r` lists JUMP_SLOT relocations for both), the
//    user's allocation found with cuMemGetAddressRange (offset 4096-aligned, else
//    ncclInvalidArgument), retained and mapped again into the communicator's flat range. That
//    range (symMemoryMapLsaTeam) is reserved at the first window, lsaSize x bigSize bytes aligned
//    to NCCL_MAX_PAGE_SIZE (512 MiB), bigSize the device's memory rounded up to 4 GiB
//    (ncclDevrInitOnce; NCCL_WIN_STRIDE overrides it); a deregister unmaps the window's part and
//    releases the retained handle (symMemoryDropRef) and keeps the range; the communicator's end
//    unmaps the whole range, mapped or not, and frees it (ncclDevrFinalize, called by commFree
//    for destroy and abort). On the H200 with 2.28.9: 0x4900000000 +150323855360 bytes (140 GiB),
//    docs/gpu/nccl-window/. The fake maps only its own rank's memory (it has no peers), so its
//    range is one bigSize;
//  * suspend, resume and memory statistics (v2.29.7-1 src/mem_manager.cc): NCCL_SUSPEND_MEM
//    synchronizes the device, copies an offload buffer to host memory, unmaps and releases each
//    suspendable buffer and keeps its address range; a second suspend and a resume of a running
//    communicator are ncclInvalidUsage; resume creates, maps and fills the buffers again at the
//    same addresses. A teardown of a suspended communicator frees its buffers with ncclCuMemFree,
//    whose first call (cuMemRetainAllocationHandle on an unmapped address, real-driver.md D16)
//    fails: the destroy answers ncclUnhandledCudaError and the communicator stays suspended;
//  * peer memory the NET proxy imports (FAKENCCL_NET_SHARED bytes per communicator): a peer's
//    POSIX-fd export imported, reserved, mapped; destroy unmaps, releases and frees it, abort
//    leaves it mapped (NVIDIA/nccl#1968, open: "This leak can be triggered via ncclCommAbort()").
//
// The suspendable buffer exists in communicators of more than one rank (the proxy's buffer for
// its peers, 2.29.7 src/transport/p2p.cc allocates it as ncclMemOffload).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>

#include "nccl_internal.h"

namespace fakenccl {
namespace {

constexpr size_t kGran = size_t{2} << 20;
// NCCL_MAX_PAGE_SIZE (2.28.9 src/include/transport.h).
constexpr size_t kMaxPageSize = size_t{512} << 20;
constexpr unsigned char kOffloadPattern = 0xa7;

uintptr_t page_size() {
  static const uintptr_t p = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  return p;
}

// The global scope's definition, as NCCL's own PLT reaches it (an interposer first).
template <class F>
F global(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

ncclResult_t map_at(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h, int dev) {
  Driver &d = driver();
  CU_TRY(d.memMap(va, size, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CU_TRY(d.memSetAccess(va, size, &acc, 1));
  return ncclSuccess;
}

// ncclCuMemFree (2.29.7 src/include/alloc.h): retain from the address, release it, the range from
// cuMemGetAddressRange, unmap, release the kept handle, address free.
ncclResult_t cumem_free(const Buffer &b) {
  Driver &d = driver();
  CUmemGenericAllocationHandle h = 0;
  CU_TRY(d.memRetainAllocationHandle(&h, reinterpret_cast<void *>(b.va)));
  CU_TRY(d.memRelease(h));
  size_t size = 0;
  CU_TRY(d.memGetAddressRange(nullptr, &size, b.va));
  CU_TRY(d.memUnmap(b.va, size));
  CU_TRY(d.memRelease(b.handle));
  CU_TRY(d.memAddressFree(b.va, size));
  return ncclSuccess;
}

// A peer's export arriving over the proxy's Unix socket: a descriptor of its memory. In one
// process the fake makes it the way the fake driver makes an allocation's memfd.
int peer_export(int dev, size_t size) {
  char name[32];
  std::snprintf(name, sizeof name, "fakecuda-vmm:d%d", dev);
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(size)) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

ncclResult_t import_peer(ncclComm *c, size_t size) {
  Driver &d = driver();
  const int fd = peer_export(c->dev, size);
  if (fd < 0) {
    set_error("fake NCCL: cannot make the peer's memory");
    return ncclSystemError;
  }
  Buffer b;
  b.size = size;
  const CUresult r =
      d.memImportFromShareableHandle(&b.handle, reinterpret_cast<void *>(static_cast<intptr_t>(fd)),
                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);
  if (r != CUDA_SUCCESS) return cu_fail("cuMemImportFromShareableHandle", r);
  if (CUresult rr = d.memAddressReserve(&b.va, size, kGran, 0, 0)) {
    d.memRelease(b.handle);
    return cu_fail("cuMemAddressReserve", rr);
  }
  if (ncclResult_t m = map_at(b.va, size, b.handle, c->dev)) {
    d.memAddressFree(b.va, size);
    d.memRelease(b.handle);
    return m;
  }
  // The import path does not release its handle early (NVIDIA/nccl#1968): it is kept.
  c->peer_mem.push_back(b);
  return ncclSuccess;
}

ncclResult_t free_peer(const Buffer &b) {
  Driver &d = driver();
  CU_TRY(d.memUnmap(b.va, b.size));
  CU_TRY(d.memRelease(b.handle));
  CU_TRY(d.memAddressFree(b.va, b.size));
  return ncclSuccess;
}

Reg *find_reg(ncclComm *c, void *handle) {
  for (Reg *r : c->regs)
    if (r == handle) return r;
  return nullptr;
}

// symMemoryDropRef: the window's part of the flat range unmapped, the retained handle released.
ncclResult_t unmap_window(const Window &w) {
  Driver &d = driver();
  CU_TRY(d.memUnmap(w.flat.va, w.flat.size));
  CU_TRY(d.memRelease(w.flat.handle));
  return ncclSuccess;
}

// ncclDevrFinalize: the whole flat range unmapped (whatever is still mapped in it) and freed.
ncclResult_t free_flat(ncclComm *c) {
  if (!c->flat_base) return ncclSuccess;
  Driver &d = driver();
  const CUdeviceptr va = c->flat_base;
  const size_t size = c->flat_size;
  c->flat_base = 0;
  c->flat_size = 0;
  CU_TRY(d.memUnmap(va, size));
  CU_TRY(d.memAddressFree(va, size));
  return ncclSuccess;
}

// devr->bigSize (ncclDevrInitOnce): NCCL_WIN_STRIDE, else the device's memory, up to 4 GiB.
size_t big_size(int dev) {
  constexpr size_t k4G = size_t{1} << 32;
  size_t big = static_cast<size_t>(env_u64("NCCL_WIN_STRIDE", 0));
  if (!big) {
    CUdevice cd = 0;
    if (driver().deviceGet(&cd, dev) != CUDA_SUCCESS || driver().deviceTotalMem(&big, cd)) big = 1;
  }
  return (big + k4G - 1) / k4G * k4G;
}

// ncclSpaceAlloc: the first gap of `size` bytes, granularity-aligned, among the windows (by
// offset); the range's size if none.
size_t space_alloc(const ncclComm *c, size_t size) {
  size_t at = 0;
  for (const Window *w : c->windows) {
    if (w->big_offset >= at + size) break;
    at = std::max(at, (w->big_offset + w->flat.size + kGran - 1) / kGran * kGran);
  }
  return at + size <= c->flat_size ? at : c->flat_size;
}

ncclResult_t first_error(ncclResult_t a, ncclResult_t b) {
  return a != ncclSuccess ? a : b;
}

}  // namespace

ncclResult_t setup_dynamic(ncclComm *c) {
  Driver &d = driver();
  // The proxy thread sets its device before it makes buffers for peers (cudaSetDevice).
  if (ncclResult_t r = use_device(c->dev)) return r;
  if (c->nranks > 1) {
    Buffer b;
    if (ncclResult_t r = vmm_alloc(&b, CU_MEM_LOCATION_TYPE_DEVICE, c->dev, kGran, false)) return r;
    c->dynamic.push_back(b);
    // Contents that a suspend must carry over (an offload buffer).
    CU_TRY(d.memsetD8(b.va, kOffloadPattern, b.size));
  }
  const size_t net = static_cast<size_t>(env_u64("FAKENCCL_NET_SHARED", 0));
  if (net) return import_peer(c, (net + kGran - 1) / kGran * kGran);
  return ncclSuccess;
}

ncclResult_t check_teardown(ncclComm *c) {
  if (!c->suspended || c->dynamic.empty()) return ncclSuccess;
  CUmemGenericAllocationHandle h = 0;
  CU_TRY(driver().memRetainAllocationHandle(&h, reinterpret_cast<void *>(c->dynamic[0].va)));
  // A driver that answered anyway: give the reference back and go on as 2.29.7 would.
  driver().memRelease(h);
  return ncclSuccess;
}

ncclResult_t release_holdings(ncclComm *c, bool abort) {
  ncclResult_t res = ncclSuccess;
  for (Window *w : c->windows) {
    res = first_error(res, unmap_window(*w));
    delete w;
  }
  c->windows.clear();
  res = first_error(res, free_flat(c));
  for (Reg *r : c->regs) delete r;
  c->regs.clear();
  for (const Buffer &b : c->dynamic) res = first_error(res, cumem_free(b));
  c->dynamic.clear();
  if (!abort)
    for (const Buffer &b : c->peer_mem) res = first_error(res, free_peer(b));
  c->peer_mem.clear();
  return res;
}

}  // namespace fakenccl

using namespace fakenccl;

// ---- registration
// --------------------------------------------------------------------------------

FAKENCCL_EXPORT ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                                               void **handle) {
  if (!handle) return ncclInvalidArgument;
  if (env_u64("NCCL_LOCAL_REGISTER", 1) == 0) {
    *handle = nullptr;
    return ncclSuccess;
  }
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  const uintptr_t ps = page_size();
  const uintptr_t beg = reinterpret_cast<uintptr_t>(buff) & ~(ps - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(buff) + size + ps - 1) & ~(ps - 1);
  std::lock_guard<std::mutex> lk(c->mu);
  auto at = c->regs.begin();
  for (; at != c->regs.end(); ++at) {
    if (beg < (*at)->beg) break;
    if ((*at)->beg <= beg && (*at)->end >= end) {
      ++(*at)->refs;
      *handle = *at;
      return ncclSuccess;
    }
  }
  Reg *r = new Reg{beg, end, 1};
  c->regs.insert(at, r);
  *handle = r;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommRegister)

FAKENCCL_EXPORT ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle) {
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  if (!handle) return ncclSuccess;
  std::lock_guard<std::mutex> lk(c->mu);
  Reg *r = find_reg(c, handle);
  if (!r) {
    set_error("fake NCCL: Deregister: Could not find handle");
    return ncclInvalidUsage;
  }
  if (--r->refs > 0) return ncclSuccess;
  c->regs.erase(std::find(c->regs.begin(), c->regs.end(), r));
  delete r;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommDeregister)

// ---- windows
// -------------------------------------------------------------------------------------

FAKENCCL_EXPORT ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                                     ncclWindow_t *win, int winFlags) {
  (void)winFlags;
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  if (!buff || size == 0) return ncclSuccess;  // 2.28.9: nothing registered, *win untouched
  if (!win) return ncclInvalidArgument;
  if (ncclResult_t r = comm_ready(c)) return r;
  if (ncclResult_t r = use_device(c->dev)) return r;
  Driver &d = driver();
  auto reg_fn = global<decltype(&ncclCommRegister)>("ncclCommRegister");
  auto dereg_fn = global<decltype(&ncclCommDeregister)>("ncclCommDeregister");
  void *reg = nullptr;
  if (ncclResult_t r = reg_fn(comm, buff, size, &reg)) return r;
  auto fail = [&](ncclResult_t r) {
    dereg_fn(comm, reg);
    *win = nullptr;
    return r;
  };
  CUdeviceptr base = 0;
  size_t mem_size = 0;
  if (CUresult r = d.memGetAddressRange(&base, &mem_size, reinterpret_cast<CUdeviceptr>(buff)))
    return fail(cu_fail("cuMemGetAddressRange", r));
  if ((reinterpret_cast<CUdeviceptr>(buff) - base) % NCCL_WIN_REQUIRED_ALIGNMENT != 0) {
    set_error("fake NCCL: Window address must be suitably aligned.");
    return fail(ncclInvalidArgument);
  }
  auto *w = new Window;
  w->user = buff;
  w->size = size;
  w->reg = reg;
  w->flat.size = mem_size;
  if (CUresult r = d.memRetainAllocationHandle(&w->flat.handle, reinterpret_cast<void *>(base))) {
    delete w;
    return fail(cu_fail("cuMemRetainAllocationHandle", r));
  }
  std::unique_lock<std::mutex> lk(c->mu);
  ncclResult_t m = ncclSuccess;
  if (!c->flat_base) {  // created on first need, as symMemoryMapLsaTeam does
    const size_t flat = big_size(c->dev);
    if (CUresult rr = d.memAddressReserve(&c->flat_base, flat, kMaxPageSize, 0, 0))
      m = cu_fail("cuMemAddressReserve", rr);
    else
      c->flat_size = flat;
  }
  if (m == ncclSuccess) {
    w->big_offset = space_alloc(c, mem_size);
    if (w->big_offset + mem_size > c->flat_size) {
      set_error("fake NCCL: symmetric space exhausted");
      m = ncclInternalError;
    }
  }
  if (m == ncclSuccess) {
    w->flat.va = c->flat_base + w->big_offset;
    m = map_at(w->flat.va, mem_size, w->flat.handle, c->dev);
  }
  if (m != ncclSuccess) {  // the flat range stays for the communicator's end
    lk.unlock();
    d.memRelease(w->flat.handle);
    delete w;
    return fail(m);
  }
  c->windows.insert(std::find_if(c->windows.begin(), c->windows.end(),
                                 [&](const Window *o) { return o->big_offset > w->big_offset; }),
                    w);
  lk.unlock();
  *win = reinterpret_cast<ncclWindow_t>(w);
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommWindowRegister)

FAKENCCL_EXPORT ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  if (!win) return ncclSuccess;
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  Window *w = reinterpret_cast<Window *>(win);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    auto it = std::find(c->windows.begin(), c->windows.end(), w);
    if (it == c->windows.end()) {
      set_error("fake NCCL: unknown window");
      return ncclInvalidArgument;
    }
    c->windows.erase(it);
  }
  if (ncclResult_t r = use_device(c->dev)) return r;
  ncclResult_t res = unmap_window(*w);
  auto dereg_fn = global<decltype(&ncclCommDeregister)>("ncclCommDeregister");
  res = first_error(res, dereg_fn(comm, w->reg));
  delete w;
  return res;
}
FAKENCCL_ALIAS(ncclCommWindowDeregister)

// ---- suspend, resume, statistics (2.29.7)
// --------------------------------------------------------

FAKENCCL_EXPORT ncclResult_t pncclCommSuspend(ncclComm_t comm, int flags) {
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  if (ncclResult_t r = comm_ready(c)) return r;
  if (!(flags & NCCL_SUSPEND_MEM)) return ncclSuccess;
  if (c->suspended) {
    set_error("fake NCCL: MemManager: Already suspended");
    return ncclInvalidUsage;
  }
  if (ncclResult_t r = use_device(c->dev)) return r;
  Driver &d = driver();
  CU_TRY(d.ctxSynchronize());  // cudaDeviceSynchronize, then a barrier of all ranks
  for (Buffer &b : c->dynamic) {
    // An offload buffer's bytes go to host memory first (ncclCudaHostCalloc + cudaMemcpy).
    void *backup = nullptr;
    CU_TRY(d.memHostAlloc(&backup, b.size, 0));
    if (CUresult r = d.memcpyDtoH(backup, b.va, b.size)) {
      d.memFreeHost(backup);
      return cu_fail("cuMemcpyDtoH", r);
    }
    CU_TRY(d.memUnmap(b.va, b.size));  // the address range is kept
    CU_TRY(d.memRelease(b.handle));
    b.handle = 0;
    b.backup = backup;
  }
  c->suspended = true;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommSuspend)

FAKENCCL_EXPORT ncclResult_t pncclCommResume(ncclComm_t comm) {
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  if (ncclResult_t r = comm_ready(c)) return r;
  if (!c->suspended) {
    set_error("fake NCCL: MemManager: Not in suspended state");
    return ncclInvalidUsage;
  }
  if (ncclResult_t r = use_device(c->dev)) return r;
  Driver &d = driver();
  for (Buffer &b : c->dynamic) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = c->dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h = 0;
    CU_TRY(d.memCreate(&h, b.size, &prop, 0));
    if (ncclResult_t r = map_at(b.va, b.size, h, c->dev)) {
      d.memRelease(h);
      return r;
    }
    b.handle = h;
    CU_TRY(d.memcpyHtoD(b.va, b.backup, b.size));
    CU_TRY(d.memFreeHost(b.backup));
    b.backup = nullptr;
    // The fake checks its own bytes came back: a resume through an interposer must not lose them.
    unsigned char probe[64];
    CU_TRY(d.memcpyDtoH(probe, b.va + b.size - sizeof probe, sizeof probe));
    for (unsigned char v : probe)
      if (v != kOffloadPattern) {
        set_error("fake NCCL: resumed buffer lost its contents");
        return ncclInternalError;
      }
  }
  c->suspended = false;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommResume)

FAKENCCL_EXPORT ncclResult_t pncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat,
                                               uint64_t *value) {
  ncclComm *c = as_comm(comm);
  if (!c) {
    set_error("fake NCCL: corrupted comm object detected");
    return ncclInvalidArgument;
  }
  if (ncclResult_t r = comm_ready(c)) return r;
  if (!value) return ncclInvalidArgument;
  // GPU memory only: host buffers are not tracked by the memory manager.
  uint64_t persist = 0, dynamic = 0;
  for (const Buffer &b : c->buffers)
    if (b.device) persist += b.size;
  for (const Buffer &b : c->dynamic) dynamic += b.size;
  switch (stat) {
    case ncclStatGpuMemSuspend:
      *value = dynamic;
      return ncclSuccess;
    case ncclStatGpuMemSuspended:
      *value = c->suspended ? 1 : 0;
      return ncclSuccess;
    case ncclStatGpuMemPersist:
      *value = persist;
      return ncclSuccess;
    case ncclStatGpuMemTotal:
      *value = persist + dynamic;
      return ncclSuccess;
    default:
      return ncclInvalidArgument;
  }
}
FAKENCCL_ALIAS(ncclCommMemStats)
