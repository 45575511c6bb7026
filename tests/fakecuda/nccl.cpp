// SPDX-License-Identifier: Apache-2.0
// Fake NCCL 2.28.9: communicator lifecycle, a few collectives with local semantics, ncclMemAlloc,
// and the driver traffic NCCL makes (its own libcuda lookup, the cuMem pattern of its buffers).
// Registration, windows, suspend/resume and peer memory are in nccl_mem.cpp.
#include "nccl_internal.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>

namespace fakenccl {
// ---- the driver, reached like NCCL's static cudart reaches it ------------------------------------

Driver &driver() {
  static Driver *d = [] {
    auto *drv = new Driver;  // leaked: communicators destroyed from static destructors still work
    if (fakecuda_entry::open_driver(&drv->entry) != fakecuda_entry::EntryError::None) return drv;
    drv->ok = true;
#define FNCCL_DRV(member, sym, ver, flags, pfn)                                                  \
  if (drv->entry.gpa(sym, reinterpret_cast<void **>(&drv->member), ver, flags, nullptr) != 0 || \
      !drv->member)                                                                            \
    drv->ok = false;
#include "nccl_driver.def"
#undef FNCCL_DRV
    return drv;
  }();
  return *d;
}

namespace {
std::mutex g_error_mu;
std::string g_last_error;
}  // namespace

void set_error(const std::string &s) {
  std::lock_guard<std::mutex> lk(g_error_mu);
  g_last_error = s;
}

ncclResult_t cu_fail(const char *what, CUresult r) {
  const char *name = "?";
  if (driver().getErrorName) driver().getErrorName(r, &name);
  set_error(std::string("fake NCCL: ") + what + " failed: " + name);
  return ncclUnhandledCudaError;
}

ncclResult_t need_driver() {
  if (driver().ok) return ncclSuccess;
  set_error("fake NCCL: libcuda.so.1 or one of its entry points is missing");
  return ncclUnhandledCudaError;
}

unsigned long long env_u64(const char *name, unsigned long long dflt) {
  const char *s = std::getenv(name);
  if (!s || !*s) return dflt;
  char *end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (*end || *s == '-') {
    std::fprintf(stderr, "fakenccl: ignoring %s=%s: expected a number\n", name, s);
    return dflt;
  }
  return v;
}

// NCCL's entry points make the communicator's device current the way cudaSetDevice does: the
// primary context of that device, retained once per device.
namespace {
std::mutex g_ctx_mu;
CUcontext g_primary[64];
}  // namespace

ncclResult_t use_device(int dev) {
  Driver &d = driver();
  CUcontext cur = nullptr;
  CUdevice cur_dev = -1;
  if (d.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur && d.ctxGetDevice_v2(&cur_dev, cur) == CUDA_SUCCESS &&
      cur_dev == dev)
    return ncclSuccess;
  if (dev < 0 || dev >= 64) return ncclInvalidArgument;
  CUcontext c;
  {
    std::lock_guard<std::mutex> lk(g_ctx_mu);
    if (!g_primary[dev]) CU_TRY(d.primaryCtxRetain(&g_primary[dev], dev));
    c = g_primary[dev];
  }
  CU_TRY(d.ctxSetCurrent(c));
  return ncclSuccess;
}

// The device a communicator is created on: that of the caller's current context (NCCL asks
// cudaGetDevice), device 0 on a thread without one.
ncclResult_t caller_device(int *dev) {
  Driver &d = driver();
  CUcontext cur = nullptr;
  CUdevice cd;
  *dev = 0;
  if (d.ctxGetCurrent(&cur) == CUDA_SUCCESS && cur && d.ctxGetDevice_v2(&cd, cur) == CUDA_SUCCESS)
    *dev = cd;
  return use_device(*dev);
}

// ---- cuMem buffers -----------------------------------------------------------------------------

// create (POSIX fd) -> reserve -> map -> set access [-> release at once]: real-driver.md section 6
// and bug-patterns.md P10, for device memory and for host memory (HOST_NUMA, no GPUDirect RDMA).
ncclResult_t vmm_alloc(Buffer *b, CUmemLocationType where, int dev, size_t want, bool release_now) {
  Driver &d = driver();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = where;
  prop.location.id = where == CU_MEM_LOCATION_TYPE_DEVICE ? dev : 0;
  if (where == CU_MEM_LOCATION_TYPE_DEVICE) {
    int rdma = 0;
    d.deviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
    prop.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
  }
  size_t gran = 0;
  CU_TRY(d.memGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const size_t size = (want + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h = 0;
  CU_TRY(d.memCreate(&h, size, &prop, 0));
  CUdeviceptr va = 0;
  CUresult r = d.memAddressReserve(&va, size, gran, 0, 0);
  if (r != CUDA_SUCCESS) {
    d.memRelease(h);
    return cu_fail("cuMemAddressReserve", r);
  }
  r = d.memMap(va, size, 0, h, 0);
  if (r != CUDA_SUCCESS) {
    d.memAddressFree(va, size);
    d.memRelease(h);
    return cu_fail("cuMemMap", r);
  }
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  r = d.memSetAccess(va, size, &acc, 1);
  if (r != CUDA_SUCCESS) {
    d.memUnmap(va, size);
    d.memAddressFree(va, size);
    d.memRelease(h);
    return cu_fail("cuMemSetAccess", r);
  }
  if (release_now) {
    // The mapping keeps the memory alive; NCCL retains a handle from the address when it frees.
    CU_TRY(d.memRelease(h));
    h = 0;
  }
  *b = Buffer{va, size, h, where == CU_MEM_LOCATION_TYPE_DEVICE, nullptr};
  return ncclSuccess;
}

// retain from the address -> unmap -> release the retained handle -> address free.
ncclResult_t vmm_free(const Buffer &b) {
  Driver &d = driver();
  CUmemGenericAllocationHandle h = 0;
  CU_TRY(d.memRetainAllocationHandle(&h, reinterpret_cast<void *>(b.va)));
  CU_TRY(d.memUnmap(b.va, b.size));
  CU_TRY(d.memRelease(h));
  CU_TRY(d.memAddressFree(b.va, b.size));
  return ncclSuccess;
}

// ---- communicators -------------------------------------------------------------------------------

namespace {
// The live communicators: NCCL's CommCheck reads the magic of whatever the pointer names, which
// for a destroyed one is freed memory (init.cc clears it before the free); the fake answers the
// same error without reading freed memory.
std::mutex g_comms_mu;
std::set<ncclComm *> g_comms;
}  // namespace

ncclComm *as_comm(ncclComm_t c) {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  return c && g_comms.count(c) ? c : nullptr;
}

ncclResult_t comm_ready(ncclComm *c) {
  if (!c) return ncclInvalidArgument;
  int a = c->async.load();
  if (a == ncclInProgress) {
    set_error("fake NCCL: communicator used before its initialization completed");
    return ncclInvalidUsage;
  }
  return static_cast<ncclResult_t>(a);
}

namespace {

void publish(ncclComm *c) {
  std::lock_guard<std::mutex> lk(g_comms_mu);
  g_comms.insert(c);
}

void join_worker(ncclComm *c) {
  std::lock_guard<std::mutex> lk(c->mu);
  if (c->worker.joinable()) c->worker.join();
}

ncclResult_t free_buffers(ncclComm *c) {
  ncclResult_t res = ncclSuccess;
  for (const Buffer &b : c->buffers)
    if (ncclResult_t r = vmm_free(b); r != ncclSuccess && res == ncclSuccess) res = r;
  c->buffers.clear();
  return res;
}

// What init allocates: device buffers on the calling thread, and more device memory plus host
// memory (HOST_NUMA) on a helper thread that has no current context, where cuCtxGetDevice fails
// with INVALID_CONTEXT as on NCCL's proxy threads (bug-patterns.md P27).
ncclResult_t comm_setup(ncclComm *c) {
  Driver &d = driver();
  std::vector<Buffer> made;
  Buffer b;
  ncclResult_t res = vmm_alloc(&b, CU_MEM_LOCATION_TYPE_DEVICE, c->dev, 2 << 20, true);
  if (res == ncclSuccess) made.push_back(b);
  ncclResult_t helper_res = ncclSuccess;
  if (res == ncclSuccess) {
    std::thread helper([&] {
      CUdevice ignored;
      (void)d.ctxGetDevice_v2(&ignored, nullptr);  // INVALID_CONTEXT here, and NCCL carries on
      const struct {
        CUmemLocationType where;
        size_t size;
      } plan[] = {{CU_MEM_LOCATION_TYPE_DEVICE, 4 << 20},
                  {CU_MEM_LOCATION_TYPE_HOST_NUMA, 2 << 20},
                  {CU_MEM_LOCATION_TYPE_HOST_NUMA, 2 << 20}};
      for (const auto &p : plan) {
        Buffer hb;
        helper_res = vmm_alloc(&hb, p.where, c->dev, p.size, true);
        if (helper_res != ncclSuccess) break;
        made.push_back(hb);
      }
      // The proxy's buffers for peers and what it imports from them (nccl_mem.cpp).
      if (helper_res == ncclSuccess) helper_res = setup_dynamic(c);
    });
    helper.join();
    res = helper_res;
  }
  c->buffers = std::move(made);
  if (res != ncclSuccess) {
    release_holdings(c, false);
    free_buffers(c);
  }
  return res;
}

ncclResult_t check_config(const ncclConfig_t *config, bool *blocking) {
  *blocking = true;
  if (const char *env = std::getenv("NCCL_COMM_BLOCKING")) *blocking = std::atoi(env) != 0;
  if (!config) return ncclSuccess;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize)) {
    set_error("fake NCCL: config not initialized with NCCL_CONFIG_INITIALIZER");
    return ncclInvalidArgument;
  }
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = config->blocking != 0;
  return ncclSuccess;
}

// Creates a communicator; with blocking == false the setup finishes on a background thread and
// the call returns ncclInProgress (ncclCommGetAsyncError: ncclInProgress, then the result).
ncclResult_t comm_create(ncclComm_t *out, int nranks, int rank, int dev, const ncclConfig_t *config) {
  if (!out) return ncclInvalidArgument;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    set_error("fake NCCL: invalid rank or size");
    return ncclInvalidArgument;
  }
  bool blocking;
  if (ncclResult_t r = check_config(config, &blocking)) return r;
  if (ncclResult_t r = need_driver()) return r;
  if (dev < 0) {
    if (ncclResult_t r = caller_device(&dev)) return r;
  } else if (ncclResult_t r = use_device(dev)) {
    return r;
  }
  auto *c = new ncclComm;
  c->nranks = nranks;
  c->rank = rank;
  c->dev = dev;
  c->blocking = blocking;
  if (blocking) {
    if (ncclResult_t r = comm_setup(c)) {
      delete c;
      *out = nullptr;
      return r;
    }
    publish(c);
    *out = c;
    return ncclSuccess;
  }
  c->async = ncclInProgress;
  publish(c);
  const unsigned long long delay = env_u64("FAKENCCL_INIT_NS", 10'000'000);
  c->worker = std::thread([c, delay] {
    // Long enough for a caller to see ncclInProgress before the result.
    std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
    c->async = comm_setup(c);
  });
  *out = c;
  return ncclInProgress;
}

ncclResult_t bad_comm() {
  set_error("fake NCCL: corrupted comm object detected");
  return ncclInvalidArgument;
}

// ncclCommDestroy and ncclCommAbort: NULL is success (init.cc); a destroyed communicator is the
// CommCheck error; a suspended one fails as 2.29.7's teardown does and stays (nccl_mem.cpp).
ncclResult_t comm_destroy(ncclComm_t comm, bool abort) {
  if (!comm) return ncclSuccess;
  ncclComm *c = as_comm(comm);
  if (!c) return bad_comm();
  join_worker(c);
  ncclResult_t r = ncclSuccess;
  if (driver().ok) {
    use_device(c->dev);
    if (ncclResult_t t = check_teardown(c)) return t;
    r = release_holdings(c, abort);
    if (ncclResult_t f = free_buffers(c); r == ncclSuccess) r = f;
  }
  {
    std::lock_guard<std::mutex> lk(g_comms_mu);
    g_comms.erase(c);
  }
  delete c;
  return r;
}

// A communicator that takes collectives: initialized, not revoked, not suspended ("The
// communicator cannot be used while suspended", 2.29.7 nccl.h.in).
ncclResult_t usable(ncclComm *c) {
  if (ncclResult_t r = comm_ready(c)) return r;
  if (c->revoked || c->suspended) {
    set_error(c->revoked ? "fake NCCL: communicator revoked" : "fake NCCL: communicator suspended");
    return ncclInvalidUsage;
  }
  return ncclSuccess;
}

size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

// A collective is a kernel that holds the device for FAKENCCL_COLL_NS (default 0): the fake
// driver's frees and synchronisations then wait for it (real-driver.md section 3).
void mark_busy(int dev) {
  static const unsigned long long ns = env_u64("FAKENCCL_COLL_NS", 0);
  if (!ns) return;
  using SetBusy = void (*)(int, unsigned long long);
  static SetBusy set_busy =
      reinterpret_cast<SetBusy>(dlsym(driver().entry.handle, "fakecuda_set_busy"));  // NULL on a real driver
  if (set_busy) set_busy(dev, ns);
}

ncclResult_t local_copy(ncclComm *c, void *dst, const void *src, size_t count, ncclDataType_t t) {
  if (ncclResult_t r = usable(c)) return r;
  const size_t sz = type_size(t);
  if (!sz) return ncclInvalidArgument;
  if (ncclResult_t r = use_device(c->dev)) return r;
  if (dst != src && count)
    CU_TRY(driver().memcpyDtoD(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src),
                               count * sz));
  mark_busy(c->dev);
  return ncclSuccess;
}

// ---- groups and point-to-point ------------------------------------------------------------------

struct PendingSend {
  ncclComm *comm;
  const void *buf;
  size_t bytes;
  int peer;
};
thread_local int t_group_depth = 0;
thread_local std::vector<PendingSend> t_sends;

// ---- ncclMemAlloc registry ----------------------------------------------------------------------

std::mutex g_mem_mu;
std::map<CUdeviceptr, Buffer> g_mem;

}  // namespace
}  // namespace fakenccl

using namespace fakenccl;

// ---- API -----------------------------------------------------------------------------------------

FAKENCCL_EXPORT ncclResult_t pncclGetVersion(int *version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclGetVersion)

// Bootstraps the driver like NCCL's init does (the place where a wrong cuGetProcAddress answer
// surfaced as ncclUnhandledCudaError: real-driver.md section 5).
FAKENCCL_EXPORT ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  if (ncclResult_t r = need_driver()) return r;
  std::random_device rd;
  std::memset(uniqueId, 0, sizeof *uniqueId);
  for (size_t i = 0; i < sizeof uniqueId->internal; i += sizeof(unsigned)) {
    unsigned v = rd();
    std::memcpy(uniqueId->internal + i, &v, sizeof v);
  }
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclGetUniqueId)

FAKENCCL_EXPORT ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId, int rank) {
  return comm_create(comm, nranks, rank, -1, nullptr);
}
FAKENCCL_ALIAS(ncclCommInitRank)

FAKENCCL_EXPORT ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId,
                                                     int rank, ncclConfig_t *config) {
  return comm_create(comm, nranks, rank, -1, config);
}
FAKENCCL_ALIAS(ncclCommInitRankConfig)

FAKENCCL_EXPORT ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank,
                                                       int nId, ncclUniqueId *commIds,
                                                       ncclConfig_t *config) {
  if (nId < 1 || !commIds) return ncclInvalidArgument;
  return comm_create(newcomm, nranks, myrank, -1, config);
}
FAKENCCL_ALIAS(ncclCommInitRankScalable)

FAKENCCL_EXPORT ncclResult_t pncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  if (!comms || ndev < 1) return ncclInvalidArgument;
  for (int i = 0; i < ndev; ++i) {
    if (ncclResult_t r = comm_create(&comms[i], ndev, i, devlist ? devlist[i] : i, nullptr)) {
      for (int j = 0; j < i; ++j) comm_destroy(comms[j], false);
      return r;
    }
  }
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommInitAll)

FAKENCCL_EXPORT ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                            ncclConfig_t *config) {
  (void)key;
  ncclComm *c = as_comm(comm);
  if (!newcomm) return ncclInvalidArgument;
  if (ncclResult_t r = comm_ready(c)) return r;
  if (color == NCCL_SPLIT_NOCOLOR) {
    *newcomm = nullptr;
    return ncclSuccess;
  }
  if (color < 0) return ncclInvalidArgument;
  // Ranks do not talk to each other here, so each member ends up alone in its new communicator.
  return comm_create(newcomm, 1, 0, c->dev, config);
}
FAKENCCL_ALIAS(ncclCommSplit)

FAKENCCL_EXPORT ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                                             int excludeRanksCount, ncclComm_t *newcomm,
                                             ncclConfig_t *config, int shrinkFlags) {
  ncclComm *c = as_comm(comm);
  if (!newcomm || excludeRanksCount < 0 || (excludeRanksCount && !excludeRanksList) ||
      (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT))
    return ncclInvalidArgument;
  if (ncclResult_t r = comm_ready(c)) return r;
  int below = 0;
  for (int i = 0; i < excludeRanksCount; ++i) {
    if (excludeRanksList[i] == c->rank) {
      *newcomm = nullptr;
      return ncclSuccess;
    }
    if (excludeRanksList[i] < c->rank) ++below;
  }
  if (c->nranks - excludeRanksCount < 1) return ncclInvalidArgument;
  return comm_create(newcomm, c->nranks - excludeRanksCount, c->rank - below, c->dev, config);
}
FAKENCCL_ALIAS(ncclCommShrink)

FAKENCCL_EXPORT ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  ncclComm *c = as_comm(comm);
  if (!c) return bad_comm();
  // nccl.h (2.28.9): "Calling ncclCommFinalize after revoke is invalid."
  if (c->revoked) return ncclInvalidUsage;
  join_worker(c);
  c->finalized = true;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommFinalize)

FAKENCCL_EXPORT ncclResult_t pncclCommDestroy(ncclComm_t comm) { return comm_destroy(comm, false); }
FAKENCCL_ALIAS(ncclCommDestroy)

FAKENCCL_EXPORT ncclResult_t pncclCommAbort(ncclComm_t comm) { return comm_destroy(comm, true); }
FAKENCCL_ALIAS(ncclCommAbort)

// 2.28.9 src/init.cc: NULL is success; flags other than NCCL_REVOKE_DEFAULT, a finalized or an
// already revoked communicator are ncclInvalidArgument. It stops the proxy; operations after it
// are refused, and the communicator still has to be destroyed.
FAKENCCL_EXPORT ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm) return ncclSuccess;
  ncclComm *c = as_comm(comm);
  if (!c) return bad_comm();
  if (revokeFlags != NCCL_REVOKE_DEFAULT || c->finalized || c->revoked) return ncclInvalidArgument;
  join_worker(c);
  c->revoked = true;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommRevoke)

// 2.29.2 nccl.h.in: existing ranks pass their communicator (rank -1), new ranks NULL and their
// assigned rank. Ranks do not talk to each other here: each caller gets a communicator of nRanks.
FAKENCCL_EXPORT ncclResult_t pncclCommGrow(ncclComm_t comm, int nRanks,
                                           const ncclUniqueId *uniqueId, int rank,
                                           ncclComm_t *newcomm, ncclConfig_t *config) {
  if (!newcomm) return ncclInvalidArgument;
  if (comm) {
    ncclComm *c = as_comm(comm);
    if (!c) return bad_comm();
    if (ncclResult_t r = usable(c)) return r;
    if (rank != -1 || nRanks <= c->nranks) return ncclInvalidArgument;
    return comm_create(newcomm, nRanks, c->rank, c->dev, config);
  }
  if (!uniqueId) return ncclInvalidArgument;
  return comm_create(newcomm, nRanks, rank, -1, config);
}
FAKENCCL_ALIAS(ncclCommGrow)

FAKENCCL_EXPORT ncclResult_t pncclCommCount(const ncclComm_t comm, int *count) {
  ncclComm *c = as_comm(comm);
  if (!c || !count) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommCount)

FAKENCCL_EXPORT ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device) {
  ncclComm *c = as_comm(comm);
  if (!c || !device) return ncclInvalidArgument;
  *device = c->dev;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommCuDevice)

FAKENCCL_EXPORT ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank) {
  ncclComm *c = as_comm(comm);
  if (!c || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommUserRank)

FAKENCCL_EXPORT ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
  ncclComm *c = as_comm(comm);
  if (!c || !asyncError) return ncclInvalidArgument;
  *asyncError = static_cast<ncclResult_t>(c->async.load());
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclCommGetAsyncError)

FAKENCCL_EXPORT const char *pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}
FAKENCCL_ALIAS(ncclGetErrorString)

FAKENCCL_EXPORT const char *pncclGetLastError(ncclComm_t) {
  static thread_local std::string copy;
  std::lock_guard<std::mutex> lk(g_error_mu);
  copy = g_last_error;
  return copy.c_str();
}
FAKENCCL_ALIAS(ncclGetLastError)

FAKENCCL_EXPORT ncclResult_t pncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclGroupStart)

FAKENCCL_EXPORT ncclResult_t pncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth == 0) t_sends.clear();
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclGroupEnd)

FAKENCCL_EXPORT ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t) {
  if (op < ncclSum || op >= ncclNumOps) return ncclInvalidArgument;
  // One contribution per rank reaches this process, so every reduction is a copy.
  return local_copy(as_comm(comm), recvbuff, sendbuff, count, datatype);
}
FAKENCCL_ALIAS(ncclAllReduce)

FAKENCCL_EXPORT ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                            ncclDataType_t datatype, int root, ncclComm_t comm,
                                            cudaStream_t) {
  ncclComm *c = as_comm(comm);
  if (c && (root < 0 || root >= c->nranks)) return ncclInvalidArgument;
  return local_copy(c, recvbuff, sendbuff, count, datatype);
}
FAKENCCL_ALIAS(ncclBroadcast)

// A send to one's own rank is matched with the receive of the same group.
FAKENCCL_EXPORT ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                                       int peer, ncclComm_t comm, cudaStream_t) {
  ncclComm *c = as_comm(comm);
  if (ncclResult_t r = usable(c)) return r;
  if (!type_size(datatype) || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
  if (t_group_depth > 0) t_sends.push_back({c, sendbuff, count * type_size(datatype), peer});
  mark_busy(c->dev);
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclSend)

FAKENCCL_EXPORT ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                                       int peer, ncclComm_t comm, cudaStream_t) {
  ncclComm *c = as_comm(comm);
  if (ncclResult_t r = usable(c)) return r;
  if (!type_size(datatype) || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
  for (auto it = t_sends.begin(); it != t_sends.end(); ++it) {
    if (it->comm == c && it->peer == c->rank && peer == c->rank) {
      const size_t bytes = std::min(it->bytes, count * type_size(datatype));
      const void *src = it->buf;
      t_sends.erase(it);
      return local_copy(c, recvbuff, src, bytes, ncclUint8);
    }
  }
  mark_busy(c->dev);
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclRecv)

// nccl-and-cleanup.md 1.3: cuMem memory with the recommended granularity; the handle is kept.
FAKENCCL_EXPORT ncclResult_t pncclMemAlloc(void **ptr, size_t size) {
  if (!ptr || size == 0) return ncclInvalidArgument;
  if (ncclResult_t r = need_driver()) return r;
  int dev;
  if (ncclResult_t r = caller_device(&dev)) return r;
  Buffer b;
  if (ncclResult_t r = vmm_alloc(&b, CU_MEM_LOCATION_TYPE_DEVICE, dev, size, false)) return r;
  std::lock_guard<std::mutex> lk(g_mem_mu);
  g_mem[b.va] = b;
  *ptr = reinterpret_cast<void *>(b.va);
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclMemAlloc)

// ncclCuMemFree: retain from the address, release it, unmap the range cuMemGetAddressRange gives,
// release the allocation's own handle (NCCL releases its retained value twice; with the fake's
// default of a new value per retain, the second release is the creating handle), address free.
FAKENCCL_EXPORT ncclResult_t pncclMemFree(void *ptr) {
  if (!ptr) return ncclSuccess;
  if (ncclResult_t r = need_driver()) return r;
  Buffer b;
  {
    std::lock_guard<std::mutex> lk(g_mem_mu);
    auto it = g_mem.find(reinterpret_cast<CUdeviceptr>(ptr));
    if (it == g_mem.end()) return ncclInvalidArgument;
    b = it->second;
    g_mem.erase(it);
  }
  Driver &d = driver();
  const CUdeviceptr va = b.va;
  int dev = 0;
  CU_TRY(d.pointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, va));
  if (ncclResult_t r = use_device(dev)) return r;
  CUmemGenericAllocationHandle h = 0;
  CU_TRY(d.memRetainAllocationHandle(&h, ptr));
  CU_TRY(d.memRelease(h));
  size_t size = 0;
  CU_TRY(d.memGetAddressRange(nullptr, &size, va));
  CU_TRY(d.memUnmap(va, size));
  CU_TRY(d.memRelease(b.handle));
  CU_TRY(d.memAddressFree(va, size));
  return ncclSuccess;
}
FAKENCCL_ALIAS(ncclMemFree)
