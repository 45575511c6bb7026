// SPDX-License-Identifier: Apache-2.0
// Tests of the fake NCCL: exported symbols, communicator lifecycle with NCCL's cuMem pattern,
// collectives, nonblocking init, ncclMemAlloc/ncclMemFree, and collectives holding the device.
#include <catch2/catch.hpp>
#include <cuda.h>
#include <dlfcn.h>
#include <elf.h>
#include <nccl.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "selftest_state.h"
#include "selftest_util.h"

namespace {

using selftest::require_nothing_live;
using selftest::state;

constexpr size_t G = size_t{2} << 20;

ncclComm_t init_one(int nranks = 1, int rank = 0) {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess);
  REQUIRE(comm != nullptr);
  return comm;
}

struct DynSym {
  unsigned char bind;
  unsigned long long value;
};

// The dynamic symbol table of an ELF64 shared object, by name.
std::map<std::string, DynSym> dynamic_symbols(const char *path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> f((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, DynSym> out;
  REQUIRE(f.size() > sizeof(Elf64_Ehdr));
  auto *eh = reinterpret_cast<const Elf64_Ehdr *>(f.data());
  auto *sh = reinterpret_cast<const Elf64_Shdr *>(f.data() + eh->e_shoff);
  for (int i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_DYNSYM) continue;
    const char *strtab = f.data() + sh[sh[i].sh_link].sh_offset;
    auto *syms = reinterpret_cast<const Elf64_Sym *>(f.data() + sh[i].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k)
      if (syms[k].st_shndx != SHN_UNDEF)
        out[strtab + syms[k].st_name] = {static_cast<unsigned char>(ELF64_ST_BIND(syms[k].st_info)),
                                         syms[k].st_value};
  }
  return out;
}

}  // namespace

TEST_CASE("every ncclX is a weak alias of a strong pncclX, as in NCCL 2.28.9", "[nccl-symbols]") {
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void *>(&pncclGetVersion), &info) != 0);
  std::map<std::string, DynSym> syms = dynamic_symbols(info.dli_fname);
  const char *apis[] = {"ncclGetVersion", "ncclGetUniqueId", "ncclCommInitRank",
                        "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommInitRankScalable",
                        "ncclCommSplit", "ncclCommShrink", "ncclCommFinalize", "ncclCommDestroy",
                        "ncclCommAbort", "ncclCommCount", "ncclCommCuDevice", "ncclCommUserRank",
                        "ncclCommGetAsyncError", "ncclGetErrorString", "ncclGetLastError",
                        "ncclGroupStart", "ncclGroupEnd", "ncclAllReduce", "ncclBroadcast",
                        "ncclSend", "ncclRecv", "ncclMemAlloc", "ncclMemFree"};
  for (const char *api : apis) {
    INFO(api);
    REQUIRE(syms.count(api));
    REQUIRE(syms.count(std::string("p") + api));
    CHECK(syms[api].bind == STB_WEAK);
    CHECK(syms[std::string("p") + api].bind == STB_GLOBAL);
    CHECK(syms[api].value == syms[std::string("p") + api].value);
  }
  CHECK(dlsym(RTLD_DEFAULT, "pncclCommInitRank") == dlsym(RTLD_DEFAULT, "ncclCommInitRank"));
  int v = 0;
  REQUIRE(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == 22809);
}

TEST_CASE("communicator init makes NCCL's cuMem buffers, destroy frees them all", "[nccl]") {
  ncclComm_t comm = init_one();
  fakecuda_state s = state();
  // Device buffers (2 MiB on this thread, 4 MiB on the helper) and two 2 MiB host buffers, each
  // released right after mapping (bug-patterns.md P10): no handle is live, the mappings hold them.
  CHECK(s.phys_allocs == 4);
  CHECK(s.mappings == 4);
  CHECK(s.reservations == 4);
  CHECK(s.handle_refs == 0);
  CHECK(s.phys_bytes == 10 * (size_t{1} << 20));
  CHECK(s.device_used[0] == 6 * (size_t{1} << 20));  // the host buffers are not device memory
  int n = 0, dev = -1, rank = -1;
  REQUIRE(ncclCommCount(comm, &n) == ncclSuccess);
  REQUIRE(ncclCommCuDevice(comm, &dev) == ncclSuccess);
  REQUIRE(ncclCommUserRank(comm, &rank) == ncclSuccess);
  CHECK(n == 1);
  CHECK(dev == 0);
  CHECK(rank == 0);

  SECTION("all-reduce, broadcast and self send/recv copy through the driver") {
    void *a = nullptr, *b = nullptr;
    REQUIRE(ncclMemAlloc(&a, 1 << 20) == ncclSuccess);
    REQUIRE(ncclMemAlloc(&b, 1 << 20) == ncclSuccess);
    std::vector<float> x(1024, 2.5f), y(1024, 0.f);
    REQUIRE(cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(a), x.data(), 4096) == CUDA_SUCCESS);
    REQUIRE(ncclAllReduce(a, b, 1024, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
    REQUIRE(cuMemcpyDtoH(y.data(), reinterpret_cast<CUdeviceptr>(b), 4096) == CUDA_SUCCESS);
    CHECK(y == x);
    REQUIRE(cuMemsetD8(reinterpret_cast<CUdeviceptr>(b), 0, 4096) == CUDA_SUCCESS);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    REQUIRE(ncclSend(a, 1024, ncclFloat, 0, comm, nullptr) == ncclSuccess);
    REQUIRE(ncclRecv(b, 1024, ncclFloat, 0, comm, nullptr) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    REQUIRE(cuMemcpyDtoH(y.data(), reinterpret_cast<CUdeviceptr>(b), 4096) == CUDA_SUCCESS);
    CHECK(y == x);
    CHECK(ncclBroadcast(a, b, 1024, ncclFloat, 1, comm, nullptr) == ncclInvalidArgument);
    REQUIRE(ncclBroadcast(a, b, 1024, ncclFloat, 0, comm, nullptr) == ncclSuccess);
    CHECK(ncclGroupEnd() == ncclInvalidUsage);
    REQUIRE(ncclMemFree(a) == ncclSuccess);
    REQUIRE(ncclMemFree(b) == ncclSuccess);
  }
  SECTION("split and shrink make communicators of their own") {
    ncclComm_t none = reinterpret_cast<ncclComm_t>(1), part = nullptr;
    REQUIRE(ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclSuccess);
    CHECK(none == nullptr);
    REQUIRE(ncclCommSplit(comm, 3, 0, &part, nullptr) == ncclSuccess);
    REQUIRE(part != nullptr);
    CHECK(state().phys_allocs == 8);
    REQUIRE(ncclCommFinalize(part) == ncclSuccess);
    REQUIRE(ncclCommDestroy(part) == ncclSuccess);
    ncclComm_t four = init_one(4, 2), shrunk = nullptr;
    int excluded[] = {0};
    REQUIRE(ncclCommShrink(four, excluded, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT) == ncclSuccess);
    int n3 = 0, r = -1;
    REQUIRE(ncclCommCount(shrunk, &n3) == ncclSuccess);
    REQUIRE(ncclCommUserRank(shrunk, &r) == ncclSuccess);
    CHECK(n3 == 3);
    CHECK(r == 1);
    REQUIRE(ncclCommAbort(shrunk) == ncclSuccess);
    REQUIRE(ncclCommDestroy(four) == ncclSuccess);
  }
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(ncclCommDestroy(nullptr) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("nonblocking init returns ncclInProgress and finishes on its own thread", "[nccl]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInProgress);
  REQUIRE(comm != nullptr);
  ncclResult_t async = ncclSuccess;
  REQUIRE(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  CHECK(async == ncclInProgress);
  CHECK(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr) == ncclInvalidUsage);
  auto t0 = std::chrono::steady_clock::now();
  while (async == ncclInProgress && selftest::seconds_of(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    REQUIRE(ncclCommGetAsyncError(comm, &async) == ncclSuccess);
  }
  CHECK(async == ncclSuccess);
  CHECK(state().phys_allocs == 4);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);

  ncclConfig_t junk{};
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &junk) == ncclInvalidArgument);
  require_nothing_live();
}

TEST_CASE("ncclMemAlloc/ncclMemFree follow NCCL's cuMem pattern and leave nothing", "[nccl]") {
  void *p = nullptr;
  const unsigned long long retains = fakecuda_calls("cuMemRetainAllocationHandle");
  const unsigned long long releases = fakecuda_calls("cuMemRelease");
  REQUIRE(ncclMemAlloc(&p, 3 << 20) == ncclSuccess);
  fakecuda_state s = state();
  CHECK(s.phys_allocs == 1);
  CHECK(s.phys_bytes == 2 * G);  // rounded to the recommended granularity
  CHECK(s.handle_refs == 1);     // ncclMemAlloc keeps its handle
  REQUIRE(ncclMemFree(p) == ncclSuccess);
  CHECK(fakecuda_calls("cuMemRetainAllocationHandle") == retains + 1);
  CHECK(fakecuda_calls("cuMemRelease") == releases + 2);
  CHECK(ncclMemFree(p) == ncclInvalidArgument);
  require_nothing_live();
}

TEST_CASE("communicators on two devices", "[env-nccl-two-devices]") {
  ncclComm_t comms[2] = {};
  REQUIRE(ncclCommInitAll(comms, 2, nullptr) == ncclSuccess);
  int d0 = -1, d1 = -1;
  REQUIRE(ncclCommCuDevice(comms[0], &d0) == ncclSuccess);
  REQUIRE(ncclCommCuDevice(comms[1], &d1) == ncclSuccess);
  CHECK(d0 == 0);
  CHECK(d1 == 1);
  fakecuda_state s = state();
  // Each is a rank of two: its proxy has a 2 MiB buffer for the peer besides the 6 MiB of a rank.
  CHECK(s.device_used[0] == 8 * (size_t{1} << 20));
  CHECK(s.device_used[1] == 8 * (size_t{1} << 20));
  REQUIRE(ncclCommDestroy(comms[0]) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comms[1]) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("FAKENCCL_COLL_NS: a collective holds the device, frees wait for it", "[env-nccl-busy]") {
  ncclComm_t comm = init_one();  // FAKENCCL_COLL_NS=300000000
  void *a = nullptr;
  REQUIRE(ncclMemAlloc(&a, 4096) == ncclSuccess);
  CUdeviceptr linear = 0;
  REQUIRE(cuMemAlloc(&linear, 4096) == CUDA_SUCCESS);
  REQUIRE(ncclAllReduce(a, a, 1024, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(selftest::timed([&] { REQUIRE(ncclMemFree(a) == ncclSuccess); }) < 0.1);  // VMM: no wait
  CHECK(selftest::timed([&] { REQUIRE(cuMemFree(linear) == CUDA_SUCCESS); }) >= 0.2);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}

TEST_CASE("with a new handle value per retain, NCCL's frees still balance", "[env-nccl-retain-new]") {
  ncclComm_t comm = init_one();  // FAKECUDA_RETAIN_SAME=0
  void *p = nullptr;
  REQUIRE(ncclMemAlloc(&p, G) == ncclSuccess);
  REQUIRE(ncclMemFree(p) == ncclSuccess);
  REQUIRE(ncclCommDestroy(comm) == ncclSuccess);
  require_nothing_live();
}
