// SPDX-License-Identifier: Apache-2.0
// Tests of the fake NCCL's registration, windows, revoke, suspend/resume/statistics and the NET
// proxy's peer memory (nccl_mem.cpp says which NCCL release and source each rule is from).
#include <catch2/catch.hpp>
#include <cuda.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstring>
#include <vector>

#include "fakecuda.h"
#include "nccl_late.h"
#include "selftest_state.h"

namespace {

using selftest::require_nothing_live;
using selftest::state;

constexpr size_t G = size_t{2} << 20;

ncclComm_t init(int nranks = 1, int rank = 0) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess);
  return comm;
}

uint64_t stat(ncclComm_t comm, ncclCommMemStat_t s) {
  uint64_t v = ~0ULL;
  REQUIRE(ncclCommMemStats(comm, s, &v) == ncclSuccess);
  return v;
}

}  // namespace

TEST_CASE("registration: page-aligned slots, references, unknown handles", "[nccl-mem]") {
  ncclComm_t comm = init();
  void *buf = nullptr;
  REQUIRE(ncclMemAlloc(&buf, G) == ncclSuccess);
  void *h1 = nullptr, *h2 = nullptr, *h3 = nullptr;
  REQUIRE(ncclCommRegister(comm, buf, G, &h1) == ncclSuccess);
  REQUIRE(h1 != nullptr);
  // A range inside a registered slot takes a reference on it (register.cc).
  REQUIRE(ncclCommRegister(comm, static_cast<char *>(buf) + 4096, 8192, &h2) == ncclSuccess);
  CHECK(h2 == h1);
  REQUIRE(ncclCommDeregister(comm, h1) == ncclSuccess);
  REQUIRE(ncclCommDeregister(comm, h2) == ncclSuccess);
  CHECK(ncclCommDeregister(comm, h1) == ncclInvalidUsage);  // "Could not find handle"
  CHECK(ncclCommDeregister(comm, nullptr) == ncclSuccess);
  // Registrations end with the communicator (ncclRegCleanup).
  REQUIRE(ncclCommRegister(comm, buf, G, &h3) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  REQUIRE(ncclMemFree(buf) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("NCCL_LOCAL_REGISTER=0: a NULL handle and success", "[env-nccl-noreg]") {
  ncclComm_t comm = init();
  int x = 0;
  void *h = &x;
  REQUIRE(ncclCommRegister(comm, &x, sizeof x, &h) == ncclSuccess);
  CHECK(h == nullptr);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("windows map the user's allocation a second time and register it", "[nccl-mem]") {
  ncclComm_t comm = init();
  void *buf = nullptr;
  REQUIRE(ncclMemAlloc(&buf, G) == ncclSuccess);
  const unsigned long long regs = fakecuda_calls("cuMemRetainAllocationHandle");
  ncclWindow_t win = nullptr;
  REQUIRE(ncclCommWindowRegister(comm, buf, G, &win, NCCL_WIN_DEFAULT) == ncclSuccess);
  REQUIRE(win != nullptr);
  CHECK(fakecuda_calls("cuMemRetainAllocationHandle") == regs + 1);
  fakecuda_state s = state();
  CHECK(s.phys_allocs == 5);  // the communicator's four and the user's buffer, mapped twice
  CHECK(s.mappings == 6);
  CHECK(s.handle_refs == 2);  // ncclMemAlloc's handle and the window's retained reference
  // Not 4096-aligned within its allocation: ncclInvalidArgument, nothing left registered.
  ncclWindow_t bad = nullptr;
  CHECK(ncclCommWindowRegister(comm, static_cast<char *>(buf) + 256, 4096, &bad, 0) ==
        ncclInvalidArgument);
  CHECK(bad == nullptr);
  // Not VMM memory: the retain fails.
  CUdeviceptr linear = 0;
  REQUIRE(cuMemAlloc(&linear, G) == CUDA_SUCCESS);
  CHECK(ncclCommWindowRegister(comm, reinterpret_cast<void *>(linear), G, &bad, 0) ==
        ncclUnhandledCudaError);
  REQUIRE(cuMemFree(linear) == CUDA_SUCCESS);
  ncclWindow_t untouched = reinterpret_cast<ncclWindow_t>(&s);
  CHECK(ncclCommWindowRegister(comm, nullptr, G, &untouched, 0) == ncclSuccess);
  CHECK(untouched == reinterpret_cast<ncclWindow_t>(&s));
  REQUIRE(ncclCommWindowDeregister(comm, win) == ncclSuccess);
  CHECK(ncclCommWindowDeregister(comm, win) == ncclInvalidArgument);
  CHECK(state().mappings == 5);
  REQUIRE(ncclMemFree(buf) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("windows share one flat range, kept until the communicator's end unmaps it whole",
          "[nccl-mem]") {
  // 2.28.9 src/dev_runtime.cc: symMemoryMapLsaTeam reserves it at the first window,
  // symMemoryDropRef unmaps a window's part, ncclDevrFinalize unmaps all of it and frees it.
  ncclComm_t comm = init();
  void *a = nullptr, *b = nullptr;
  REQUIRE(ncclMemAlloc(&a, G) == ncclSuccess);
  REQUIRE(ncclMemAlloc(&b, 2 * G) == ncclSuccess);
  const fakecuda_state before = state();
  const unsigned long long reserves = fakecuda_calls("cuMemAddressReserve");
  const unsigned long long frees = fakecuda_calls("cuMemAddressFree");
  const unsigned long long unmaps = fakecuda_calls("cuMemUnmap");
  ncclWindow_t wa = nullptr, wb = nullptr;
  REQUIRE(ncclCommWindowRegister(comm, a, G, &wa, NCCL_WIN_DEFAULT) == ncclSuccess);
  REQUIRE(ncclCommWindowRegister(comm, b, 2 * G, &wb, NCCL_WIN_DEFAULT) == ncclSuccess);
  CHECK(fakecuda_calls("cuMemAddressReserve") == reserves + 1);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  const size_t big = (total + (size_t{1} << 32) - 1) / (size_t{1} << 32) * (size_t{1} << 32);
  CHECK(state().reservations == before.reservations + 1);
  CHECK(state().reserved_bytes == before.reserved_bytes + big);
  CHECK(state().mappings == before.mappings + 2);
  REQUIRE(ncclCommWindowDeregister(comm, wa) == ncclSuccess);
  REQUIRE(ncclCommWindowDeregister(comm, wb) == ncclSuccess);
  // The windows' parts unmapped; the range stays with the communicator.
  CHECK(fakecuda_calls("cuMemUnmap") == unmaps + 2);
  CHECK(fakecuda_calls("cuMemAddressFree") == frees);
  CHECK(state().reservations == before.reservations + 1);
  CHECK(state().mappings == before.mappings);
  REQUIRE(ncclMemFree(a) == ncclSuccess);
  REQUIRE(ncclMemFree(b) == ncclSuccess);
  const unsigned long long frees_before_end = fakecuda_calls("cuMemAddressFree");
  const unsigned long long unmaps_before_end = fakecuda_calls("cuMemUnmap");
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  // The communicator's four buffers and the flat range, unmapped whole with nothing mapped.
  CHECK(fakecuda_calls("cuMemUnmap") == unmaps_before_end + 5);
  CHECK(fakecuda_calls("cuMemAddressFree") == frees_before_end + 5);
  require_nothing_live();
}

TEST_CASE("suspend releases the suspendable buffer, keeps its range; resume maps it back",
          "[nccl-mem]") {
  ncclComm_t comm = init(2, 0);
  CHECK(stat(comm, ncclStatGpuMemSuspend) == G);
  CHECK(stat(comm, ncclStatGpuMemPersist) == 6 * (size_t{1} << 20));
  CHECK(stat(comm, ncclStatGpuMemTotal) == 8 * (size_t{1} << 20));
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0);
  uint64_t v = 0;
  CHECK(ncclCommMemStats(comm, static_cast<ncclCommMemStat_t>(9), &v) == ncclInvalidArgument);
  CHECK(ncclCommMemStats(comm, ncclStatGpuMemTotal, nullptr) == ncclInvalidArgument);
  const fakecuda_state before = state();
  CHECK(ncclCommResume(comm) == ncclInvalidUsage);   // "Not in suspended state"
  REQUIRE(ncclCommSuspend(comm, 0) == ncclSuccess);  // no NCCL_SUSPEND_MEM: nothing happens
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0);
  REQUIRE(ncclCommSuspend(comm, NCCL_SUSPEND_MEM) == ncclSuccess);
  fakecuda_state s = state();
  CHECK(s.phys_allocs == before.phys_allocs - 1);
  CHECK(s.reservations == before.reservations);  // the address range is kept
  CHECK(s.device_used[0] == before.device_used[0] - G);
  CHECK(s.host_allocs == 1);  // the offload buffer's bytes
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 1);
  CHECK(stat(comm, ncclStatGpuMemSuspend) == G);
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM) == ncclInvalidUsage);  // "Already suspended"
  CHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidUsage);
  // The teardown frees with ncclCuMemFree: its retain fails on the unmapped range, and the
  // communicator stays (suspended) for a resume.
  CHECK(ncclCommDestroy(comm) == ncclUnhandledCudaError);
  CHECK(ncclCommAbort(comm) == ncclUnhandledCudaError);
  REQUIRE(ncclCommResume(comm) == ncclSuccess);  // and its bytes came back (checked inside)
  s = state();
  CHECK(s.phys_allocs == before.phys_allocs);
  CHECK(s.host_allocs == 0);
  CHECK(stat(comm, ncclStatGpuMemSuspended) == 0);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclInvalidArgument);  // destroyed: "corrupted comm object"
  require_nothing_live();
}

TEST_CASE("revoke stops the communicator; it still has to be destroyed", "[nccl-mem]") {
  ncclComm_t comm = init();
  CHECK(ncclCommRevoke(comm, 1) == ncclInvalidArgument);
  REQUIRE(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclSuccess);
  CHECK(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument);
  CHECK(ncclCommFinalize(comm) == ncclInvalidUsage);
  CHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidUsage);
  CHECK(ncclCommRevoke(nullptr, 0) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("grow makes a larger communicator", "[nccl-mem]") {
  ncclComm_t comm = init(2, 1), grown = nullptr;
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  REQUIRE(ncclCommGrow(comm, 3, nullptr, -1, &grown, nullptr) == ncclSuccess);
  int n = 0, r = -1;
  REQUIRE(ncclCommCount(grown, &n) == ncclSuccess);
  REQUIRE(ncclCommUserRank(grown, &r) == ncclSuccess);
  CHECK(n == 3);
  CHECK(r == 1);
  ncclComm_t fresh = nullptr;
  REQUIRE(ncclCommGrow(nullptr, 3, &id, 2, &fresh, nullptr) == ncclSuccess);
  REQUIRE(ncclCommDestroy(fresh) == ncclSuccess);
  REQUIRE(ncclCommDestroy(grown) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("the NET proxy's peer memory: destroy unmaps it, abort leaves it mapped",
          "[env-nccl-net]") {
  // FAKENCCL_NET_SHARED=4194304
  ncclComm_t a = init();
  fakecuda_state s = state();
  CHECK(s.phys_allocs == 5);
  CHECK(s.handle_refs == 1);  // the import keeps its handle
  REQUIRE(ncclCommDestroy(a) == ncclSuccess);
  require_nothing_live();
  for (int i = 0; i < 3; ++i) {
    ncclComm_t b = init();
    REQUIRE(ncclCommAbort(b) == ncclSuccess);
  }
  s = state();
  CHECK(s.phys_allocs == 3);
  CHECK(s.mappings == 3);
  CHECK(s.mapped_bytes == 12 * (size_t{1} << 20));  // NVIDIA/nccl#1968
  CHECK(s.device_used[0] == 0);                     // imported: the peer's device memory
}
