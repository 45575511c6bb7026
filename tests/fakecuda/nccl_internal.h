// SPDX-License-Identifier: Apache-2.0
// Internals shared by the fake NCCL's sources: the driver it reaches through its own static
// cudart, errors, NCCL's cuMem buffer patterns and the communicator object.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <nccl.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "driver_entry.h"
#include "nccl_late.h"

// Like NCCL_API in NCCL's src/include/core.h (checked on libnccl 2.28.9): the implementation is the
// strong global pncclX, and ncclX is a weak alias of it.
#define FAKENCCL_EXPORT extern "C" __attribute__((visibility("default")))
#define FAKENCCL_ALIAS(name)                                       \
  extern "C" __attribute__((weak, alias("p" #name), copy(p##name), \
                            visibility("default"))) decltype(p##name) name;

namespace fakenccl {

// ---- the driver, reached like NCCL's static cudart reaches it
// ------------------------------------

struct Driver {
  fakecuda_entry::DriverEntry entry;
  bool ok = false;
#define FNCCL_DRV(member, sym, ver, flags, pfn) pfn member = nullptr;
#include "nccl_driver.def"
#undef FNCCL_DRV
};
Driver &driver();

void set_error(const std::string &s);
ncclResult_t cu_fail(const char *what, CUresult r);
ncclResult_t need_driver();

#define CU_TRY(call)                                                     \
  do {                                                                   \
    CUresult cu_r_ = (call);                                             \
    if (cu_r_ != CUDA_SUCCESS) return ::fakenccl::cu_fail(#call, cu_r_); \
  } while (0)

// A FAKENCCL_* variable of unsigned decimal digits (a bad value: one line, the default).
unsigned long long env_u64(const char *name, unsigned long long dflt);

// Makes the device's primary context current, as cudaSetDevice does.
ncclResult_t use_device(int dev);
// The device of the caller's current context (device 0 without one), made current.
ncclResult_t caller_device(int *dev);

// ---- cuMem buffers
// -------------------------------------------------------------------------------

struct Buffer {
  CUdeviceptr va = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle handle = 0;  // kept by ncclMemAlloc and the suspendable buffers
  bool device = false;                      // device memory (what ncclCommMemStats counts)
  void *backup = nullptr;                   // a suspended offload buffer's bytes in host memory
};

// create (POSIX fd) -> reserve -> map -> set access [-> release at once].
ncclResult_t vmm_alloc(Buffer *b, CUmemLocationType where, int dev, size_t want, bool release_now);
// retain from the address -> unmap -> release the retained handle -> address free.
ncclResult_t vmm_free(const Buffer &b);

// ---- communicators
// -------------------------------------------------------------------------------

// A registration slot of ncclCommRegister (2.28.9 src/register/register.cc): page-aligned range
// and its local reference count; the slot's address is the handle.
struct Reg {
  uintptr_t beg = 0, end = 0;
  int refs = 0;
};

// A window of ncclCommWindowRegister: its local registration, the user's allocation retained and
// mapped a second time into the communicator's flat range (2.28.9 src/dev_runtime.cc,
// symMemoryObtain, symMemoryMapLsaTeam).
struct Window {
  void *user = nullptr;
  size_t size = 0;
  void *reg = nullptr;
  // Where in the flat range (ncclSpaceAlloc of devr->bigSpace).
  size_t big_offset = 0;
  Buffer flat;  // NCCL's mapping of the user's memory; flat.handle is the retained handle
};

}  // namespace fakenccl

struct ncclComm {
  int nranks = 1;
  int rank = 0;
  int dev = 0;
  bool blocking = true;
  std::atomic<int> async{
      ncclSuccess};  // ncclResult_t; ncclInProgress while a nonblocking init runs
  std::thread worker;
  std::mutex mu;
  std::vector<fakenccl::Buffer> buffers;   // released right after mapping (P10): persistent
  std::vector<fakenccl::Buffer> dynamic;   // handle kept: what NCCL_SUSPEND_MEM releases
  std::vector<fakenccl::Buffer> peer_mem;  // imported from peers by the NET proxy
  std::vector<fakenccl::Reg *> regs;       // by beg
  // By big_offset.
  std::vector<fakenccl::Window *> windows;
  // The windows' flat range (2.28.9 devr->lsaFlatBase): reserved at the first window, kept when
  // the windows go, unmapped whole and freed at the communicator's end (ncclDevrFinalize).
  CUdeviceptr flat_base = 0;
  size_t flat_size = 0;
  bool finalized = false;
  bool revoked = false;
  bool suspended = false;
};

namespace fakenccl {

// The communicator behind a pointer the program passed, or nullptr when it is not a live one (a
// destroyed communicator: NCCL's CommCheck finds its magic gone, "corrupted comm object").
ncclComm *as_comm(ncclComm_t c);
// ncclInvalidUsage while a nonblocking init runs, then the init's result.
ncclResult_t comm_ready(ncclComm *c);
// What happens to a communicator's registrations, windows and peer memory at its end
// (nccl_mem.cpp). `abort`: ncclCommAbort, which in 2.28.9 leaves the NET proxy's peer imports
// mapped (NVIDIA/nccl#1968).
ncclResult_t release_holdings(ncclComm *c, bool abort);
// The suspendable and peer buffers a new communicator gets (nccl_mem.cpp), on the proxy thread.
ncclResult_t setup_dynamic(ncclComm *c);
// ncclCommDestroy of a suspended communicator fails as 2.29.7's does (nccl_mem.cpp).
ncclResult_t check_teardown(ncclComm *c);

}  // namespace fakenccl
