// SPDX-License-Identifier: Apache-2.0
// Tests of the fake driver itself: cuGetProcAddress routing, VMM rows, reuse, contexts, faults,
// the busy model and the two ways of sharing memory between processes.
//
// Cases tagged with an environment ([env-...], [fork-...], [small-memory], ...) need a process of
// their own: meson.build runs each of them alone, with its environment.
#include <catch2/catch.hpp>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
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

void *driver_handle() {
  static void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  return h;
}

void *sym(const char *name) { return dlsym(driver_handle(), name); }

// cuInit, and the primary context of device 0 current on this thread.
void init_ctx() {
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  CUcontext c = nullptr;
  REQUIRE(cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(c) == CUDA_SUCCESS);
}

CUmemAllocationProp prop(CUmemLocationType where = CU_MEM_LOCATION_TYPE_DEVICE,
                         unsigned types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = where;
  p.location.id = 0;
  p.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(types);
  return p;
}

CUresult set_rw(CUdeviceptr v, size_t size) {
  CUmemAccessDesc d{};
  d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  d.location.id = 0;
  d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(v, size, &d, 1);
}

struct Vmm {
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  size_t size = 0;
};

Vmm make_mapped(size_t size, CUmemLocationType where = CU_MEM_LOCATION_TYPE_DEVICE) {
  Vmm m;
  m.size = size;
  CUmemAllocationProp p = prop(where);
  REQUIRE(cuMemCreate(&m.h, size, &p, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressReserve(&m.va, size, 0, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(m.va, size, 0, m.h, 0) == CUDA_SUCCESS);
  REQUIRE(set_rw(m.va, size) == CUDA_SUCCESS);
  return m;
}

void destroy(const Vmm &m) {
  REQUIRE(cuMemUnmap(m.va, m.size) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(m.h) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(m.va, m.size) == CUDA_SUCCESS);
}

// Redirects stderr to a file while alive; lines() reads what was written.
struct CaptureStderr {
  char path[64] = "/tmp/fakecuda-stderr-XXXXXX";
  int saved = -1;
  CaptureStderr() {
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    fflush(stderr);
    saved = dup(2);
    dup2(fd, 2);
    close(fd);
  }
  std::vector<std::string> lines() {
    fflush(stderr);
    dup2(saved, 2);
    std::vector<std::string> l = selftest::read_lines(path);
    unlink(path);
    return l;
  }
};

}  // namespace

// ---- cuGetProcAddress -------------------------------------------------------------------------------

TEST_CASE("cuGetProcAddress answers every listed variant with its own export", "[gpa]") {
  REQUIRE(driver_handle() != nullptr);
  // Before cuInit, as cudart asks (interposers.md 10.3).
  struct Entry {
    const char *name, *base;
    int version;
    unsigned long long flags;
  };
  const Entry table[] = {
#define FC_FN(e, b, v) {#e, #b, v, 0},
#define FC_FN_PTSZ(e, b, v) {#e, #b, v, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
#define FC_FN_PTDS(e, b, v) {#e, #b, v, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM},
#include "driver_exports.def"
#undef FC_FN
#undef FC_FN_PTSZ
#undef FC_FN_PTDS
  };
  for (const Entry &e : table) {
    INFO(e.name << " as (" << e.base << ", " << e.version << ", " << e.flags << ")");
    void *want = sym(e.name);
    REQUIRE(want != nullptr);
    void *got = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    REQUIRE(cuGetProcAddress(e.base, &got, e.version, e.flags, &st) == CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(got == want);
  }
}

TEST_CASE("cuGetProcAddress routes by name, version and per-thread flag", "[gpa]") {
  auto gpa = [](const char *s, int v, unsigned long long f = 0) {
    void *p = reinterpret_cast<void *>(1);
    CUdriverProcAddressQueryResult st;
    REQUIRE(cuGetProcAddress(s, &p, v, f, &st) == CUDA_SUCCESS);
    return p;
  };
  // bug-patterns.md P24: one base name, several ABI variants.
  CHECK(gpa("cuCtxSynchronize", 2000) == sym("cuCtxSynchronize"));
  CHECK(gpa("cuCtxSynchronize", 13000) == sym("cuCtxSynchronize_v2"));
  CHECK(gpa("cuCtxSynchronize", 2000) != gpa("cuCtxSynchronize", 13000));
  CHECK(gpa("cuCtxGetDevice", 12090) == sym("cuCtxGetDevice"));
  CHECK(gpa("cuCtxGetDevice", 13000) == sym("cuCtxGetDevice_v2"));
  CHECK(gpa("cuMemAllocAsync", 11020, 0) == sym("cuMemAllocAsync"));
  CHECK(gpa("cuMemAllocAsync", 11020, 2) == sym("cuMemAllocAsync_ptsz"));
  CHECK(gpa("cuMemFreeAsync", 12000, 2) == sym("cuMemFreeAsync_ptsz"));
  CHECK(gpa("cuMemAllocFromPoolAsync", 12000, 1) == sym("cuMemAllocFromPoolAsync"));
  CHECK(gpa("cuMemAlloc", 2000) == sym("cuMemAlloc"));
  CHECK(gpa("cuMemAlloc", 3020) == sym("cuMemAlloc_v2"));
  CHECK(gpa("cuMemAlloc", 13000) == sym("cuMemAlloc_v2"));
  CHECK(gpa("cuCtxCreate", 2000) == sym("cuCtxCreate"));
  CHECK(gpa("cuCtxCreate", 3020) == sym("cuCtxCreate_v2"));
  CHECK(gpa("cuCtxCreate", 11040) == sym("cuCtxCreate_v3"));
  CHECK(gpa("cuCtxCreate", 12050) == sym("cuCtxCreate_v4"));
  CHECK(gpa("cuCtxCreate", 13000) == sym("cuCtxCreate_v4"));
  CHECK(gpa("cuIpcOpenMemHandle", 4010) == sym("cuIpcOpenMemHandle"));
  CHECK(gpa("cuIpcOpenMemHandle", 11000) == sym("cuIpcOpenMemHandle_v2"));
  CHECK(gpa("cuGetProcAddress", 11030) == sym("cuGetProcAddress"));
  CHECK(gpa("cuGetProcAddress", 12000) == sym("cuGetProcAddress_v2"));
  // A per-thread variant exists only from its own version on; before it, the legacy one.
  CHECK(gpa("cuMemcpyHtoD", 3020, 2) == sym("cuMemcpyHtoD_v2"));
  CHECK(gpa("cuMemcpyHtoD", 7000, 2) == sym("cuMemcpyHtoD_v2_ptds"));
  CHECK(gpa("cuMemCreate", 12000, 2) == sym("cuMemCreate"));

  void *p = reinterpret_cast<void *>(1);
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
  SECTION("unknown names, the empty name included, are SUCCESS with NULL") {
    for (const char *name : {"", "cuNoSuchFunction", "cudaMalloc"}) {
      p = reinterpret_cast<void *>(1);
      REQUIRE(cuGetProcAddress(name, &p, 12000, 0, &st) == CUDA_SUCCESS);
      CHECK(p == nullptr);
      CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
  }
  SECTION("a version older than the first variant is VERSION_NOT_SUFFICIENT") {
    REQUIRE(cuGetProcAddress("cuMemCreate", &p, 10010, 0, &st) == CUDA_SUCCESS);
    CHECK(p == nullptr);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    REQUIRE(cuGetProcAddress("cuGetProcAddress", &p, 11020, 0, &st) == CUDA_SUCCESS);
    CHECK(p == nullptr);
  }
  SECTION("a version newer than the driver and unknown flags are INVALID_VALUE") {
    CHECK(cuGetProcAddress("cuMemAlloc", &p, 13010, 0, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGetProcAddress("cuMemAlloc", &p, 12000, 4, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGetProcAddress("cuMemAlloc", &p, 12000, 3, &st) == CUDA_SUCCESS);
  }
  SECTION("the 11.3 four-argument entry point answers the same") {
    auto gpa4 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(sym("cuGetProcAddress"));
    REQUIRE(gpa4 != nullptr);
    REQUIRE(gpa4("cuMemAlloc", &p, 3020, 0) == CUDA_SUCCESS);
    CHECK(p == sym("cuMemAlloc_v2"));
    REQUIRE(gpa4("nothing", &p, 3020, 0) == CUDA_SUCCESS);
    CHECK(p == nullptr);
  }
}

// ---- contexts -------------------------------------------------------------------------------------------

TEST_CASE("contexts: what needs one and what does not", "[ctx]") {
  init_ctx();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 4096) == CUDA_SUCCESS);
  std::thread([&] {
    // bug-patterns.md P27: no current context on this thread.
    CUdevice d = -1;
    CHECK(cuCtxGetDevice(&d) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxGetDevice_v2(&d, nullptr) == CUDA_ERROR_INVALID_CONTEXT);
    CUdeviceptr q = 0;
    CHECK(cuMemAlloc(&q, 4096) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_INVALID_CONTEXT);
    // VMM needs none, host location included.
    Vmm m = make_mapped(G, CU_MEM_LOCATION_TYPE_HOST_NUMA);
    destroy(m);
    // Freeing needs none either (measured on the H200).
    CHECK(cuMemFree(p) == CUDA_SUCCESS);
  }).join();
  CUcontext c = nullptr, popped = nullptr;
  REQUIRE(cuCtxGetCurrent(&c) == CUDA_SUCCESS);
  REQUIRE(cuCtxPopCurrent(&popped) == CUDA_SUCCESS);
  CHECK(popped == c);
  CUcontext none = reinterpret_cast<CUcontext>(1);
  REQUIRE(cuCtxGetCurrent(&none) == CUDA_SUCCESS);
  CHECK(none == nullptr);
  REQUIRE(cuCtxPushCurrent(c) == CUDA_SUCCESS);
  CUdevice d = -1;
  REQUIRE(cuCtxGetDevice_v2(&d, c) == CUDA_SUCCESS);
  CHECK(d == 0);
  CHECK(cuMemFree(0) == CUDA_SUCCESS);
  // The 32-bit ABI (cudaVersion < 3020) answered INVALID_CONTEXT on the H200. Its PFN typedefs
  // exist only for driver builds, hence the spelled-out types.
  auto alloc_v1 = reinterpret_cast<CUresult (*)(unsigned *, unsigned)>(sym("cuMemAlloc"));
  auto free_v1 = reinterpret_cast<CUresult (*)(unsigned)>(sym("cuMemFree"));
  unsigned small = 0;
  CHECK(alloc_v1(&small, 4096) == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(free_v1(0) == CUDA_ERROR_INVALID_CONTEXT);
  // real-driver.md section 5: cuCtxCreate pushes, cuCtxSetCurrent(NULL) pops (after a create and
  // a set of the new context, the primary context was current again on the H200, not none).
  CUcontext made = nullptr, now = nullptr;
  REQUIRE(cuCtxCreate(&made, nullptr, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&now) == CUDA_SUCCESS);
  CHECK((now == made && made != c));
  REQUIRE(cuCtxSetCurrent(made) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&now) == CUDA_SUCCESS);
  CHECK(now == c);
  // Destroying a context that is not current leaves the stack as it is.
  REQUIRE(cuCtxDestroy(made) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&now) == CUDA_SUCCESS);
  CHECK(now == c);
  // A current created context is popped by its destroy.
  REQUIRE(cuCtxCreate(&made, nullptr, 0, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxDestroy(made) == CUDA_SUCCESS);
  REQUIRE(cuCtxGetCurrent(&now) == CUDA_SUCCESS);
  CHECK(now == c);
  require_nothing_live();
}

// ---- VMM -----------------------------------------------------------------------------------------------

TEST_CASE("VMM objects, reuse and the rows a shim depends on", "[vmm]") {
  init_ctx();
  CUmemAllocationProp p = prop();

  SECTION("handle values: 0x55... and the last released is issued first (D18)") {
    CUmemGenericAllocationHandle a = 0, b = 0, c = 0, d = 0;
    REQUIRE(cuMemCreate(&a, G, &p, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemCreate(&b, G, &p, 0) == CUDA_SUCCESS);
    CHECK(a >> 40 == 0x55);
    CHECK(a != b);
    REQUIRE(cuMemRelease(a) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(b) == CUDA_SUCCESS);
    CHECK(fakecuda_handle_live(a) == 0);
    REQUIRE(cuMemCreate(&c, G, &p, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemCreate(&d, G, &p, 0) == CUDA_SUCCESS);
    CHECK(c == b);
    CHECK(d == a);
    CHECK(fakecuda_handle_allocation(c) != fakecuda_handle_allocation(d));
    REQUIRE(cuMemRelease(c) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(d) == CUDA_SUCCESS);
  }
  SECTION("address ranges and cuMemAlloc pointers come back the same way (D18, P30)") {
    CUdeviceptr v = 0, w = 0;
    REQUIRE(cuMemAddressReserve(&v, 4 * G, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(v % G == 0);
    REQUIRE(cuMemAddressFree(v, 4 * G) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressReserve(&w, 4 * G, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(w == v);
    REQUIRE(cuMemAddressFree(w, 4 * G) == CUDA_SUCCESS);
    CUdeviceptr x = 0, y = 0;
    REQUIRE(cuMemAlloc(&x, 1000) == CUDA_SUCCESS);
    CHECK(x % 512 == 0);
    REQUIRE(cuMemFree(x) == CUDA_SUCCESS);
    REQUIRE(cuMemAlloc(&y, 1000) == CUDA_SUCCESS);
    CHECK(y == x);
    REQUIRE(cuMemFree(y) == CUDA_SUCCESS);
  }
  SECTION("release while mapped keeps the memory until the unmap (D13)") {
    Vmm m = make_mapped(2 * G);
    const unsigned long long id = fakecuda_handle_allocation(m.h);
    REQUIRE(id != 0);
    CHECK(fakecuda_mapping_handle(m.va + G + 5) == id);
    REQUIRE(cuMemRelease(m.h) == CUDA_SUCCESS);
    CHECK(state().phys_allocs == 1);
    CHECK(state().handle_refs == 0);
    REQUIRE(cuMemsetD8(m.va, 0x11, 2 * G) == CUDA_SUCCESS);
    unsigned char c = 0;
    REQUIRE(cuMemcpyDtoH(&c, m.va + 2 * G - 1, 1) == CUDA_SUCCESS);
    CHECK(c == 0x11);
    REQUIRE(cuMemUnmap(m.va, 2 * G) == CUDA_SUCCESS);
    CHECK(state().phys_allocs == 0);
    CHECK(fakecuda_mapping_handle(m.va) == 0);
    REQUIRE(cuMemAddressFree(m.va, 2 * G) == CUDA_SUCCESS);
  }
  SECTION("retain while a handle is live gives that value, counted (measured on the H200)") {
    Vmm m = make_mapped(G);
    CUmemGenericAllocationHandle r = 0;
    REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void *>(m.va + 4096)) == CUDA_SUCCESS);
    CHECK(r == m.h);
    CHECK(state().handle_refs == 2);
    REQUIRE(cuMemRelease(r) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(m.h) == CUDA_SUCCESS);
    CHECK(cuMemRelease(m.h) == CUDA_ERROR_INVALID_VALUE);
    // With no live handle, retain issues one: the NCCL pattern (release at once, retain later).
    REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void *>(m.va)) == CUDA_SUCCESS);
    CHECK(fakecuda_handle_live(r) == 1);
    REQUIRE(cuMemUnmap(m.va, G) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(r) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(m.va, G) == CUDA_SUCCESS);
    CHECK(cuMemRetainAllocationHandle(&r, reinterpret_cast<void *>(m.va)) == CUDA_ERROR_INVALID_VALUE);
  }
  SECTION("a stale release after value reuse hits the newer allocation (D18, bug-patterns P02)") {
    Vmm a = make_mapped(G);
    REQUIRE(cuMemUnmap(a.va, G) == CUDA_SUCCESS);  // sleep
    REQUIRE(cuMemRelease(a.h) == CUDA_SUCCESS);
    Vmm b = make_mapped(G);  // another allocation gets the released value
    CHECK(b.h == a.h);
    CHECK(cuMemUnmap(a.va, G) == CUDA_SUCCESS);   // free while asleep: D3
    CHECK(cuMemRelease(a.h) == CUDA_SUCCESS);     // stale, but the value is live again: b's handle
    CHECK(fakecuda_handle_live(b.h) == 0);
    CHECK(fakecuda_mapping_handle(b.va) != 0);    // b's memory lives on through its mapping
    CHECK(cuMemRelease(b.h) == CUDA_ERROR_INVALID_VALUE);  // its owner's release now fails
    REQUIRE(cuMemAddressFree(a.va, G) == CUDA_SUCCESS);
    REQUIRE(cuMemUnmap(b.va, G) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(b.va, G) == CUDA_SUCCESS);
  }
  SECTION("partial and cut unmaps, set access, map over mapped (P06, D9, D12)") {
    CUmemGenericAllocationHandle h0 = 0, h1 = 0;
    CUdeviceptr v = 0;
    REQUIRE(cuMemCreate(&h0, G, &p, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemCreate(&h1, 2 * G, &p, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressReserve(&v, 3 * G, 0, 0, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemMap(v, G, 0, h0, 0) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(v, 3 * G) == CUDA_ERROR_INVALID_VALUE);      // only part of it is mapped
    CHECK(cuMemSetAccess(v, 3 * G, nullptr, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(set_rw(v, 3 * G) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemMap(v, 2 * G, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE);  // overlaps the first
    CHECK(cuMemMap(v + G, 2 * G, G, h1, 0) == CUDA_ERROR_NOT_SUPPORTED);  // offset must be 0
    REQUIRE(cuMemMap(v + G, 2 * G, 0, h1, 0) == CUDA_SUCCESS);
    CHECK(set_rw(v + G, G) == CUDA_ERROR_INVALID_VALUE);          // part of a mapping
    CHECK(cuMemUnmap(v + G, G) == CUDA_ERROR_INVALID_VALUE);      // cuts a mapping
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange(&base, &size, v + 2 * G) == CUDA_ERROR_NOT_FOUND);  // no access yet
    REQUIRE(set_rw(v, 3 * G) == CUDA_SUCCESS);                    // whole mappings, back to back
    REQUIRE(cuMemGetAddressRange(&base, &size, v + 2 * G) == CUDA_SUCCESS);
    CHECK(base == v + G);  // the mapping (measured), while RANGE_START gives the reservation (D20)
    CHECK(size == 2 * G);
    CUdeviceptr start = 0;
    REQUIRE(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, v + 2 * G) == CUDA_SUCCESS);
    CHECK(start == v);
    int cap = -1;
    REQUIRE(cuPointerGetAttribute(&cap, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, v) == CUDA_SUCCESS);
    CHECK(cap == 0);
    CUipcMemHandle ih;
    CHECK(cuIpcGetMemHandle(&ih, v + G) == CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemUnmap(v, 3 * G) == CUDA_SUCCESS);                // two whole mappings at once
    REQUIRE(cuMemRelease(h0) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(h1) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(v, 3 * G) == CUDA_SUCCESS);
  }
  SECTION("create refuses FABRIC, Windows types and unaligned sizes") {
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp f = prop(CU_MEM_LOCATION_TYPE_DEVICE,
                                 CU_MEM_HANDLE_TYPE_FABRIC | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK(cuMemCreate(&h, G, &f, 0) == CUDA_ERROR_NOT_PERMITTED);  // real-driver.md section 6
    CUmemAllocationProp w = prop(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_WIN32);
    CHECK(cuMemCreate(&h, G, &w, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemCreate(&h, G + 4096, &p, 0) == CUDA_ERROR_INVALID_VALUE);
    CUmemAllocationProp bad = prop();
    bad.location.id = 7;
    CHECK(cuMemCreate(&h, G, &bad, 0) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(state().phys_allocs == 0);
  }
  SECTION("host-located memory is not charged to the device") {
    Vmm m = make_mapped(G, CU_MEM_LOCATION_TYPE_HOST_NUMA);
    CHECK(state().device_used[0] == 0);
    unsigned type = 0;
    REQUIRE(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m.va) == CUDA_SUCCESS);
    CHECK(type == CU_MEMORYTYPE_HOST);
    destroy(m);
  }
  require_nothing_live();
}

TEST_CASE("FAKECUDA_FABRIC=accept: create succeeds, the FABRIC export fails (P15)", "[env-fabric]") {
  init_ctx();
  CUmemAllocationProp f = prop(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_FABRIC);
  CUmemGenericAllocationHandle h = 0;
  REQUIRE(cuMemCreate(&h, G, &f, 0) == CUDA_SUCCESS);
  CUmemFabricHandle fh;
  CHECK(cuMemExportToShareableHandle(&fh, h, CU_MEM_HANDLE_TYPE_FABRIC, 0) == CUDA_ERROR_INVALID_VALUE);
  int fd = -1;
  CHECK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
        CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  require_nothing_live();
}

TEST_CASE("FAKECUDA_HANDLE_REUSE=0 never re-issues a value", "[env-noreuse]") {
  init_ctx();
  CUmemAllocationProp p = prop();
  std::set<CUmemGenericAllocationHandle> seen;
  for (int i = 0; i < 20; ++i) {
    CUmemGenericAllocationHandle h = 0;
    REQUIRE(cuMemCreate(&h, G, &p, 0) == CUDA_SUCCESS);
    CHECK(seen.insert(h).second);
    REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  }
}

TEST_CASE("FAKECUDA_RETAIN_SAME=0 issues a new value per retain", "[env-retain-new]") {
  init_ctx();
  Vmm m = make_mapped(G);
  CUmemGenericAllocationHandle r = 0;
  REQUIRE(cuMemRetainAllocationHandle(&r, reinterpret_cast<void *>(m.va)) == CUDA_SUCCESS);
  CHECK(r != m.h);
  CHECK(fakecuda_handle_allocation(r) == fakecuda_handle_allocation(m.h));
  REQUIRE(cuMemRelease(r) == CUDA_SUCCESS);
  CHECK(cuMemRelease(r) == CUDA_ERROR_INVALID_VALUE);
  destroy(m);
  require_nothing_live();
}

TEST_CASE("device memory is accounted across linear and VMM memory", "[env-small-memory]") {
  init_ctx();  // FAKECUDA_DEVICE_MEMORY=64M
  size_t free_b = 0, total = 0;
  REQUIRE(cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS);
  CHECK(total == (size_t{64} << 20));
  CHECK(free_b == total);
  CUdeviceptr a = 0, b = 0;
  REQUIRE(cuMemAlloc(&a, size_t{48} << 20) == CUDA_SUCCESS);
  CHECK(cuMemAlloc(&b, size_t{32} << 20) == CUDA_ERROR_OUT_OF_MEMORY);
  CUmemAllocationProp p = prop();
  CUmemGenericAllocationHandle h = 0, h2 = 0, hh = 0;
  REQUIRE(cuMemCreate(&h, size_t{16} << 20, &p, 0) == CUDA_SUCCESS);
  CHECK(cuMemCreate(&h2, G, &p, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  CUmemAllocationProp hp = prop(CU_MEM_LOCATION_TYPE_HOST_NUMA);
  REQUIRE(cuMemCreate(&hh, size_t{16} << 20, &hp, 0) == CUDA_SUCCESS);  // host memory
  REQUIRE(cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS);
  CHECK(free_b == 0);
  REQUIRE(cuMemFree(a) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(hh) == CUDA_SUCCESS);
  REQUIRE(cuMemGetInfo(&free_b, &total) == CUDA_SUCCESS);
  CHECK(free_b == total);
  require_nothing_live();
}

// ---- fault injection ---------------------------------------------------------------------------------

TEST_CASE("fakecuda_inject fails the nth call without effect", "[inject]") {
  init_ctx();
  CUmemAllocationProp p = prop();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  REQUIRE(cuMemCreate(&h, G, &p, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressReserve(&v, G, 0, 0, 0) == CUDA_SUCCESS);
  const unsigned long long maps = fakecuda_calls("cuMemMap");
  REQUIRE(fakecuda_inject("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE) == 0);
  CHECK(cuMemMap(v, G, 0, h, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(state().mappings == 0);
  CHECK(fakecuda_calls("cuMemMap") == maps + 1);
  REQUIRE(cuMemMap(v, G, 0, h, 0) == CUDA_SUCCESS);

  // A base name covers every variant; an exact name only its export.
  CUdeviceptr a = 0;
  REQUIRE(fakecuda_inject("cuMemAlloc", 2, CUDA_ERROR_OUT_OF_MEMORY) == 0);
  REQUIRE(cuMemAlloc(&a, 4096) == CUDA_SUCCESS);
  CUdeviceptr b = 0;
  CHECK(cuMemAlloc(&b, 4096) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(b == 0);
  REQUIRE(fakecuda_inject("cuMemFree", 1, CUDA_ERROR_NOT_PERMITTED) == 0);
  CHECK(cuMemFree(a) == CUDA_ERROR_NOT_PERMITTED);  // cuMemFree is cuMemFree_v2 in cuda.h
  CHECK(state().linear_allocs == 1);
  REQUIRE(fakecuda_inject("cuMemFree", 1, CUDA_ERROR_NOT_PERMITTED) == 0);
  REQUIRE(fakecuda_inject("cuMemFree", 1, CUDA_ERROR_NOT_SUPPORTED) == 0);
  fakecuda_clear_faults();
  CHECK(cuMemFree(a) == CUDA_SUCCESS);

  CHECK(fakecuda_inject("cuNoSuchCall", 1, 2) == -1);
  CHECK(fakecuda_inject("cuMemMap", 0, 2) == -1);
  CHECK(fakecuda_inject("cuMemMap", 1, 0) == -1);
  CHECK(fakecuda_calls("cuNoSuchCall") == 0);
  CHECK(fakecuda_calls("cuMemAlloc_v2") >= 2);
  CHECK(fakecuda_calls("cuMemAlloc") == 0);  // the 32-bit export was never called

  REQUIRE(cuMemUnmap(v, G) == CUDA_SUCCESS);
  REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(v, G) == CUDA_SUCCESS);
  require_nothing_live();
}

TEST_CASE("FAKECUDA_FAIL: the nth call, N+, errors by name and number; bad entries warn", "[env-fail]") {
  // FAKECUDA_FAIL=cuMemCreate:3:OOM,cuMemMap:2+:INVALID_VALUE,cuMemAddressReserve:1:801,
  //               bogus:1:OOM,cuMemRelease:zero:OOM
  CaptureStderr err;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);  // the first driver call reads the environment
  std::vector<std::string> lines = err.lines();
  REQUIRE(lines.size() == 2);
  CHECK(lines[0] == "fakecuda: ignoring FAKECUDA_FAIL=bogus:1:OOM: expected api:N[+]:ERROR with an "
                    "exported api and N >= 1");
  CHECK(lines[1].rfind("fakecuda: ignoring FAKECUDA_FAIL=cuMemRelease:zero:OOM:", 0) == 0);

  CUmemAllocationProp p = prop();
  CUdeviceptr v = 0;
  CHECK(cuMemAddressReserve(&v, 4 * G, 0, 0, 0) == CUDA_ERROR_NOT_SUPPORTED);
  REQUIRE(cuMemAddressReserve(&v, 4 * G, 0, 0, 0) == CUDA_SUCCESS);
  CUmemGenericAllocationHandle h[4] = {};
  REQUIRE(cuMemCreate(&h[0], G, &p, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemCreate(&h[1], G, &p, 0) == CUDA_SUCCESS);
  CHECK(cuMemCreate(&h[2], G, &p, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  CHECK(h[2] == 0);
  REQUIRE(cuMemCreate(&h[2], G, &p, 0) == CUDA_SUCCESS);
  REQUIRE(cuMemMap(v, G, 0, h[0], 0) == CUDA_SUCCESS);
  CHECK(cuMemMap(v + G, G, 0, h[1], 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemMap(v + G, G, 0, h[1], 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(state().mappings == 1);
  REQUIRE(cuMemUnmap(v, G) == CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) REQUIRE(cuMemRelease(h[i]) == CUDA_SUCCESS);
  REQUIRE(cuMemAddressFree(v, 4 * G) == CUDA_SUCCESS);
}

TEST_CASE("random faults follow the seed and the call order", "[env-random]") {
  // FAKECUDA_FAIL_SEED=42 FAKECUDA_FAIL_RATE=0.5
  // FAKECUDA_FAIL_APIS=cuMemCreate,cuMemAddressReserve:INVALID_VALUE
  auto run = [] {  // also runs in the forked peer: no Catch2 assertions in here
    std::string pattern;
    if (cuInit(0) != CUDA_SUCCESS) return std::string("no-init");
    CUmemAllocationProp p = prop();
    for (int i = 0; i < 64; ++i) {
      CUmemGenericAllocationHandle h = 0;
      CUresult r = cuMemCreate(&h, G, &p, 0);
      pattern += r == CUDA_SUCCESS ? '.' : r == CUDA_ERROR_OUT_OF_MEMORY ? 'O' : '?';
      if (r == CUDA_SUCCESS) cuMemRelease(h);
      CUdeviceptr v = 0;
      r = cuMemAddressReserve(&v, G, 0, 0, 0);
      pattern += r == CUDA_SUCCESS ? '.' : r == CUDA_ERROR_INVALID_VALUE ? 'V' : '?';
      if (r == CUDA_SUCCESS) cuMemAddressFree(v, G);
    }
    return pattern;
  };
  selftest::Peer peer([&](int s) {
    std::string mine = run();
    return write(s, mine.data(), mine.size()) == static_cast<ssize_t>(mine.size()) ? 0 : 1;
  });
  char buf[129] = {};
  size_t got = 0;
  while (got < 128) {
    ssize_t k = read(peer.sock, buf + got, 128 - got);
    if (k <= 0) break;
    got += static_cast<size_t>(k);
  }
  std::string theirs(buf, got);
  std::string mine = run();
  CHECK(peer.wait() == 0);
  CHECK(mine == theirs);
  CHECK(mine.find('?') == std::string::npos);
  const auto fails = std::count_if(mine.begin(), mine.end(), [](char c) { return c != '.'; });
  CHECK(fails > 24);
  CHECK(fails < 104);
  require_nothing_live();
}

TEST_CASE("bad settings print one line each and keep the defaults", "[env-bad]") {
  // FAKECUDA_DEVICES=99 FAKECUDA_DEVICE_MEMORY=lots FAKECUDA_HANDLE_REUSE=maybe
  // FAKECUDA_FAIL_SEED=x FAKECUDA_FAIL_RATE=0.1 FAKECUDA_FAIL_APIS=cuMemCreate
  CaptureStderr err;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  std::vector<std::string> lines = err.lines();
  CHECK(lines.size() == 4);
  for (const std::string &l : lines) CHECK(l.rfind("fakecuda: ignoring FAKECUDA_", 0) == 0);
  int n = 0;
  REQUIRE(cuDeviceGetCount(&n) == CUDA_SUCCESS);
  CHECK(n == 1);
  size_t total = 0;
  REQUIRE(cuDeviceTotalMem(&total, 0) == CUDA_SUCCESS);
  CHECK(total == (size_t{16} << 30));
  init_ctx();
  CUmemAllocationProp p = prop();
  for (int i = 0; i < 32; ++i) {  // random faults stay off without a valid seed
    CUmemGenericAllocationHandle h = 0;
    REQUIRE(cuMemCreate(&h, G, &p, 0) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
  }
}

// ---- the busy model (real-driver.md section 3) ------------------------------------------------------

TEST_CASE("frees and synchronisations wait for the device, VMM calls do not", "[sync]") {
  init_ctx();
  CUdeviceptr a = 0;
  REQUIRE(cuMemAlloc(&a, 1 << 20) == CUDA_SUCCESS);
  fakecuda_set_busy(0, 300'000'000);
  CHECK(selftest::timed([&] { REQUIRE(cuMemFree(a) == CUDA_SUCCESS); }) >= 0.25);

  Vmm m = make_mapped(G);
  CUmemoryPool pool = nullptr;
  REQUIRE(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
  CUdeviceptr b = 0;
  fakecuda_set_busy(0, 300'000'000);
  const double quick = selftest::timed([&] {
    REQUIRE(cuMemUnmap(m.va, G) == CUDA_SUCCESS);
    REQUIRE(cuMemRelease(m.h) == CUDA_SUCCESS);
    REQUIRE(cuMemAddressFree(m.va, G) == CUDA_SUCCESS);
    m = make_mapped(G);
    REQUIRE(cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
    REQUIRE(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
    CUdeviceptr c = 0;
    REQUIRE(cuMemAllocAsync(&c, 4096, nullptr) == CUDA_SUCCESS);
    REQUIRE(cuMemFreeAsync(c, nullptr) == CUDA_SUCCESS);
  });
  CHECK(quick < 0.1);
  CHECK(selftest::timed([] { REQUIRE(cuCtxSynchronize() == CUDA_SUCCESS); }) >= 0.15);

  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  fakecuda_set_busy(0, 200'000'000);
  CHECK(selftest::timed([&] { REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS); }) >= 0.15);
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  void *host = nullptr;
  REQUIRE(cuMemHostAlloc(&host, 4096, 0) == CUDA_SUCCESS);
  fakecuda_set_busy(0, 200'000'000);
  CHECK(selftest::timed([&] { REQUIRE(cuMemFreeHost(host) == CUDA_SUCCESS); }) >= 0.15);
  CHECK(selftest::timed([&] { REQUIRE(cuMemFree(b) == CUDA_SUCCESS); }) < 0.05);  // idle again
  destroy(m);
  require_nothing_live();
}

// ---- sharing between processes ---------------------------------------------------------------------

TEST_CASE("legacy IPC: real sharing, same pointer twice, errors never crash", "[fork-ipc]") {
  // The importer and a short-lived exporter are forked before this process touches the driver.
  selftest::Peer importer([](int s) {
    CUipcMemHandle ih;
    if (selftest::recv_msg(s, &ih, sizeof ih) == -2) return 10;
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 11;
    CUdeviceptr a = 0, b = 0;
    if (cuIpcOpenMemHandle(&a, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)) return 12;
    if (cuIpcOpenMemHandle(&b, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) || a != b) return 13;
    unsigned char buf[4096];
    if (cuMemcpyDtoH(buf, a, sizeof buf)) return 14;
    for (unsigned char x : buf)
      if (x != 0x5a) return 15;
    if (cuMemsetD8(a, 0xa5, 64)) return 16;
    fakecuda_state st{};
    fakecuda_get_state(&st);
    if (st.ipc_imports != 1 || st.ipc_import_refs != 2) return 17;
    if (cuIpcCloseMemHandle(a) || cuIpcCloseMemHandle(b)) return 18;
    if (cuIpcCloseMemHandle(a) != CUDA_ERROR_INVALID_VALUE) return 19;
    char done = 1;
    return write(s, &done, 1) == 1 ? 0 : 20;
  });
  selftest::Peer exporter([](int s) {
    CUcontext c;
    CUdeviceptr p = 0;
    CUipcMemHandle ih;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c) || cuMemAlloc(&p, 4096) ||
        cuIpcGetMemHandle(&ih, p))
      return 1;
    return selftest::send_msg(s, -1, &ih, sizeof ih) ? 0 : 2;  // and exits: the exporter is gone
  });
  init_ctx();
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
  REQUIRE(cuMemsetD8(p, 0x5a, 1 << 20) == CUDA_SUCCESS);
  CUipcMemHandle ih, again;
  REQUIRE(cuIpcGetMemHandle(&ih, p) == CUDA_SUCCESS);
  REQUIRE(cuIpcGetMemHandle(&again, p + 100) == CUDA_SUCCESS);
  CHECK(std::memcmp(&ih, &again, sizeof ih) == 0);  // deterministic bytes (bug-patterns P14)
  CUdeviceptr self = 0;
  CHECK(cuIpcOpenMemHandle(&self, ih, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_CONTEXT);
  REQUIRE(selftest::send_msg(importer.sock, -1, &ih, sizeof ih));
  char done = 0;
  REQUIRE(read(importer.sock, &done, 1) == 1);
  CHECK(importer.wait() == 0);
  unsigned char back[64];
  REQUIRE(cuMemcpyDtoH(back, p, sizeof back) == CUDA_SUCCESS);
  for (unsigned char x : back) CHECK(x == 0xa5);  // the importer's write is visible here

  CUipcMemHandle gone;
  REQUIRE(selftest::recv_msg(exporter.sock, &gone, sizeof gone) != -2);
  CHECK(exporter.wait() == 0);
  CUdeviceptr q = 0;
  CHECK(cuIpcOpenMemHandle(&q, gone, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_MAP_FAILED);
  CUipcMemHandle junk;
  std::memset(&junk, 0x7e, sizeof junk);
  CHECK(cuIpcOpenMemHandle(&q, junk, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_ERROR_INVALID_VALUE);
  REQUIRE(cuMemFree(p) == CUDA_SUCCESS);
  require_nothing_live();
}

TEST_CASE("VMM POSIX-fd export: the bytes are shared with another process", "[fork-vmm-share]") {
  constexpr size_t kSize = 2 * G;
  selftest::Peer importer([](int s) {
    size_t size = 0;
    int fd = selftest::recv_msg(s, &size, sizeof size);
    if (fd < 0) return 10;
    CUcontext c;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&c, 0) || cuCtxSetCurrent(c)) return 11;
    CUmemGenericAllocationHandle h = 0;
    if (cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(static_cast<intptr_t>(fd)),
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
      return 12;
    close(fd);
    CUmemAllocationProp got{};
    if (cuMemGetAllocationPropertiesFromHandle(&got, h) || got.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
      return 13;
    CUdeviceptr v = 0;
    if (cuMemAddressReserve(&v, size, 0, 0, 0) || cuMemMap(v, size, 0, h, 0) || set_rw(v, size)) return 14;
    std::vector<unsigned> words(size / 4);
    if (cuMemcpyDtoH(words.data(), v, size)) return 15;
    for (unsigned w : words)
      if (w != 7u) return 16;
    if (cuMemsetD32(v + size / 2, 9u, size / 8)) return 17;
    if (cuMemUnmap(v, size) || cuMemRelease(h) || cuMemAddressFree(v, size)) return 18;
    fakecuda_state st{};
    fakecuda_get_state(&st);
    if (st.phys_allocs || st.mappings || st.reservations) return 19;
    char done = 1;
    return write(s, &done, 1) == 1 ? 0 : 20;
  });
  init_ctx();
  Vmm m = make_mapped(kSize);
  REQUIRE(cuMemsetD32(m.va, 7u, kSize / 4) == CUDA_SUCCESS);
  int fd = -1;
  REQUIRE(cuMemExportToShareableHandle(&fd, m.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) == CUDA_SUCCESS);
  size_t size = kSize;
  REQUIRE(selftest::send_msg(importer.sock, fd, &size, sizeof size));
  close(fd);
  char done = 0;
  REQUIRE(read(importer.sock, &done, 1) == 1);
  CHECK(importer.wait() == 0);
  std::vector<unsigned> words(kSize / 4);
  REQUIRE(cuMemcpyDtoH(words.data(), m.va, kSize) == CUDA_SUCCESS);
  CHECK(words.front() == 7u);
  CHECK(words[kSize / 8 - 1] == 7u);
  CHECK(words[kSize / 8] == 9u);  // written by the importer
  CHECK(words.back() == 9u);

  {  // refusals
    CUmemAllocationProp none = prop(CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h = 0;
    REQUIRE(cuMemCreate(&h, G, &none, 0) == CUDA_SUCCESS);
    int f = -1;
    CHECK(cuMemExportToShareableHandle(&f, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) ==
          CUDA_ERROR_INVALID_VALUE);
    REQUIRE(cuMemRelease(h) == CUDA_SUCCESS);
    int devnull = open("/dev/null", O_RDONLY);
    CHECK(cuMemImportFromShareableHandle(&h, reinterpret_cast<void *>(static_cast<intptr_t>(devnull)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_ERROR_INVALID_VALUE);
    close(devnull);
  }
  destroy(m);
  require_nothing_live();
}
