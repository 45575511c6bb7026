// SPDX-License-Identifier: Apache-2.0
// The CUDA operations the benchmarks time, shared by the Google Benchmark program (fake stack) and
// the plain loop program (fake stack, callgrind, and the real driver on the GPU machine).
//
// Driver functions are reached as cudart and PyTorch reach them (real-driver.md section 5):
// dlopen("libcuda.so.1"), one dlsym of "cuGetProcAddress_v2", then everything through the pointer
// it answers, at version 12000. Under the shim that is the path its dlsym hook and its
// cuGetProcAddress routing serve; without it, the same code calls the driver directly. The runtime
// is linked (PLT calls to cudaMalloc/cudaFree, as libtorch_cuda.so makes them).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace cmgbench {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Driver {
  void *lib = nullptr;
  PFN_cuGetProcAddress_v12000 gpa = nullptr;
  PFN_cuInit_v2000 init = nullptr;
  PFN_cuDevicePrimaryCtxRetain_v7000 primaryRetain = nullptr;
  PFN_cuCtxSetCurrent_v4000 setCurrent = nullptr;
  PFN_cuCtxSynchronize_v2000 ctxSynchronize = nullptr;
  PFN_cuMemAlloc_v3020 memAlloc = nullptr;
  PFN_cuMemFree_v3020 memFree = nullptr;
  PFN_cuMemCreate_v10020 create = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemAddressReserve_v10020 reserve = nullptr;
  PFN_cuMemAddressFree_v10020 addressFree = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 setAccess = nullptr;
  CUcontext ctx = nullptr;
};

[[noreturn]] inline void die(const char *what, int code) {
  std::fprintf(stderr, "benchmark: %s failed (%d)\n", what, code);
  std::exit(1);
}

#define CMGB_CHECK(call)                       \
  do {                                         \
    int r_ = static_cast<int>(call);           \
    if (r_ != 0) ::cmgbench::die(#call, r_);   \
  } while (0)

// The driver, a primary context on device 0, current on the calling thread.
inline Driver &driver() {
  static Driver *d = [] {
    auto *p = new Driver;
    p->lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!p->lib) die("dlopen(libcuda.so.1)", 0);
    p->gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(p->lib, "cuGetProcAddress_v2"));
    if (!p->gpa) die("dlsym(cuGetProcAddress_v2)", 0);
    auto get = [&](const char *name, auto &slot) {
      CUdriverProcAddressQueryResult st;
      void *fn = nullptr;
      if (p->gpa(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS || !fn)
        die(name, 0);
      slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(fn);
    };
    get("cuInit", p->init);
    get("cuDevicePrimaryCtxRetain", p->primaryRetain);
    get("cuCtxSetCurrent", p->setCurrent);
    get("cuCtxSynchronize", p->ctxSynchronize);
    get("cuMemAlloc", p->memAlloc);
    get("cuMemFree", p->memFree);
    get("cuMemCreate", p->create);
    get("cuMemRelease", p->release);
    get("cuMemAddressReserve", p->reserve);
    get("cuMemAddressFree", p->addressFree);
    get("cuMemMap", p->map);
    get("cuMemUnmap", p->unmap);
    get("cuMemSetAccess", p->setAccess);
    CMGB_CHECK(p->init(0));
    CMGB_CHECK(p->primaryRetain(&p->ctx, 0));
    return p;
  }();
  return *d;
}

// Every thread that calls the driver needs the context current (cheap after the first time).
inline Driver &ready() {
  Driver &d = driver();
  thread_local bool current = false;
  if (!current) {
    CMGB_CHECK(d.setCurrent(d.ctx));
    CMGB_CHECK(cudaFree(nullptr));  // the runtime's own per-thread setup, outside the timing
    current = true;
  }
  return d;
}

// ---- the operations ----------------------------------------------------------------------------

inline void alloc_free(Driver &d, std::size_t size) {
  CUdeviceptr p = 0;
  CMGB_CHECK(d.memAlloc(&p, size));
  CMGB_CHECK(d.memFree(p));
}

inline void runtime_alloc_free(std::size_t size) {
  void *p = nullptr;
  CMGB_CHECK(cudaMalloc(&p, size));
  CMGB_CHECK(cudaFree(p));
}

// create, reserve, map, set access, unmap, release, address free (real-driver.md section 4).
inline void vmm_cycle(Driver &d, std::size_t size) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr va = 0;
  CMGB_CHECK(d.create(&h, size, &prop, 0));
  CMGB_CHECK(d.reserve(&va, size, 0, 0, 0));
  CMGB_CHECK(d.map(va, size, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CMGB_CHECK(d.setAccess(va, size, &acc, 1));
  CMGB_CHECK(d.unmap(va, size));
  CMGB_CHECK(d.release(h));
  CMGB_CHECK(d.addressFree(va, size));
}

// PyTorch's expandable segments: one large reservation holding thousands of mapped pages, each
// its own physical allocation; growing and shrinking maps and unmaps one page at its end.
struct BigReservation {
  CUdeviceptr base = 0;
  std::size_t page = 2 * kMiB, pages = 0;
  std::vector<CUmemGenericAllocationHandle> handles;
};

inline BigReservation big_reservation(Driver &d, std::size_t mapped_pages) {
  BigReservation b;
  b.pages = mapped_pages + 1;
  CMGB_CHECK(d.reserve(&b.base, b.page * b.pages, 0, 0, 0));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (std::size_t i = 0; i < mapped_pages; ++i) {
    CUmemGenericAllocationHandle h = 0;
    CMGB_CHECK(d.create(&h, b.page, &prop, 0));
    CMGB_CHECK(d.map(b.base + i * b.page, b.page, 0, h, 0));
    CMGB_CHECK(d.setAccess(b.base + i * b.page, b.page, &acc, 1));
    b.handles.push_back(h);
  }
  return b;
}

// One page more at the end, then gone again: create, map, set access, unmap, release.
inline void grow_shrink(Driver &d, const BigReservation &b) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemAccessDesc acc{};
  acc.location = prop.location;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUdeviceptr at = b.base + (b.pages - 1) * b.page;
  CUmemGenericAllocationHandle h = 0;
  CMGB_CHECK(d.create(&h, b.page, &prop, 0));
  CMGB_CHECK(d.map(at, b.page, 0, h, 0));
  CMGB_CHECK(d.setAccess(at, b.page, &acc, 1));
  CMGB_CHECK(d.unmap(at, b.page));
  CMGB_CHECK(d.release(h));
}

// A lookup the shim answers with its wrapper (cuMemAlloc) or with the driver's pointer.
inline void *lookup(Driver &d, const char *name) {
  void *fn = nullptr;
  CUdriverProcAddressQueryResult st;
  CMGB_CHECK(d.gpa(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
  return fn;
}

// The suspected path of a free and of a release (README, "Findings"): a pointer freed
// once and a handle value released once, freed and released again each time. Under the shim the
// model holds them as freed, asks the driver (which does not hold them) and answers itself;
// without it the driver refuses each call.
inline void double_free(Driver &d) {
  static const CUdeviceptr p = [&] {
    CUdeviceptr q = 0;
    CMGB_CHECK(d.memAlloc(&q, 2 * kMiB));
    CMGB_CHECK(d.memFree(q));
    return q;
  }();
  (void)d.memFree(p);
}

inline void double_release(Driver &d) {
  static const CUmemGenericAllocationHandle h = [&] {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle v = 0;
    CMGB_CHECK(d.create(&v, 2 * kMiB, &prop, 0));
    CMGB_CHECK(d.release(v));
    return v;
  }();
  (void)d.release(h);
}

// A call the driver refuses at once (real-driver.md section 4: about 0.1 us): unmap of a 2 MiB-
// aligned host address (this program's own data, which no CUDA reservation can cover: D10).
inline void failing_unmap(Driver &d) {
  static const CUdeviceptr host = reinterpret_cast<std::uintptr_t>(&host) & ~(2 * kMiB - 1);
  if (d.unmap(host, 2 * kMiB) == CUDA_SUCCESS) die("cuMemUnmap(host address) succeeded", 0);
}

}  // namespace cmgbench
