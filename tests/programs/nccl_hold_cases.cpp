// SPDX-License-Identifier: Apache-2.0
// What NCCL holds, as programs misuse it and as they should use it: memory freed while registered,
// in a window or bound to a multicast object; communicators ended twice, suspended twice,
// resumed while running, torn down while suspended; peer memory left mapped by an abort. Each
// case prints one "step VALUE" line per call whose result matters (ncclResult_t and CUresult as
// numbers and names), read by tests/integration/nccl_cases.py without and with the shim.
//
// The entry points newer than the toolkit's libnccl (suspend, resume, MemStats: 2.29.7) are looked
// up at run time as ctypes users do; everything else is called through the PLT, like PyTorch.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "nccl_late.h"

namespace {

constexpr size_t G = size_t{2} << 20;

void out(const char *step, ncclResult_t r) {
  std::printf("%s %d\n", step, static_cast<int>(r));
}
void cu(const char *step, CUresult r) {
  std::printf("%s %s\n", step, cu_name(r));
}

template <class F>
F late(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

ncclComm_t init(int nranks = 1, int rank = 0) {
  CHECK_CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) std::exit(2);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRank(&comm, nranks, id, rank);
  out("init", r);
  if (r != ncclSuccess) std::exit(2);
  return comm;
}

// Bytes written before and read back after: what the program's memory holds at the end.
bool fill_and_check(void *p, size_t n, unsigned char v) {
  std::vector<unsigned char> host(n, v), back(n, 0);
  if (cudaMemcpy(p, host.data(), n, cudaMemcpyHostToDevice) != cudaSuccess) return false;
  if (cudaMemcpy(back.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  return back == host;
}

// ncclCommRegister of an ncclMemAlloc buffer; `fixed`: deregistered before ncclMemFree.
int register_free(bool fixed) {
  ncclComm_t comm = init();
  void *buf = nullptr;
  out("alloc", ncclMemAlloc(&buf, G));
  std::printf("bytes_ok %d\n", fill_and_check(buf, 4096, 0x3c) ? 1 : 0);
  void *h = nullptr;
  out("register", ncclCommRegister(comm, buf, G, &h));
  if (fixed) out("deregister", ncclCommDeregister(comm, h));
  out("free", ncclMemFree(buf));
  if (!fixed) out("deregister", ncclCommDeregister(comm, h));
  out("destroy", ncclCommDestroy(comm));
  return 0;
}

// An expandable segment (one reservation, a handle per 2 MiB page) registered whole; one page is
// unmapped and released to shrink it. `fixed`: deregistered first, registered again after.
int register_segment(bool fixed) {
  ncclComm_t comm = init();
  const size_t pages = 4, size = pages * G;
  CUdeviceptr base = 0;
  CHECK_CU(cuMemAddressReserve(&base, size, 0, 0, 0));
  CUmemAllocationProp prop = device_prop();
  std::vector<CUmemGenericAllocationHandle> h(pages);
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (size_t i = 0; i < pages; ++i) {
    CHECK_CU(cuMemCreate(&h[i], G, &prop, 0));
    CHECK_CU(cuMemMap(base + i * G, G, 0, h[i], 0));
    CHECK_CU(cuMemSetAccess(base + i * G, G, &acc, 1));
  }
  void *reg = nullptr;
  out("register", ncclCommRegister(comm, reinterpret_cast<void *>(base), size, &reg));
  if (fixed) out("deregister", ncclCommDeregister(comm, reg));
  cu("shrink.unmap", cuMemUnmap(base + 3 * G, G));
  cu("shrink.release", cuMemRelease(h[3]));
  if (fixed) out("reregister", ncclCommRegister(comm, reinterpret_cast<void *>(base), 3 * G, &reg));
  out("deregister_end", ncclCommDeregister(comm, reg));
  for (size_t i = 0; i < 3; ++i) {
    CHECK_CU(cuMemUnmap(base + i * G, G));
    CHECK_CU(cuMemRelease(h[i]));
  }
  CHECK_CU(cuMemAddressFree(base, size));
  out("destroy", ncclCommDestroy(comm));
  return 0;
}

// A cudaMalloc buffer registered (NCCL_LEGACY_CUDA_REGISTER=1 style) and freed while registered.
int register_cudafree(bool fixed) {
  ncclComm_t comm = init();
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  void *h = nullptr;
  out("register", ncclCommRegister(comm, p, 1 << 20, &h));
  if (fixed) out("deregister", ncclCommDeregister(comm, h));
  std::printf("free %s\n", cudaGetErrorName(cudaFree(p)));
  if (!fixed) out("deregister", ncclCommDeregister(comm, h));
  out("destroy", ncclCommDestroy(comm));
  return 0;
}

// A window of an ncclMemAlloc buffer; `fixed`: the window is deregistered before the free.
int window_free(bool fixed) {
  ncclComm_t comm = init();
  void *buf = nullptr;
  out("alloc", ncclMemAlloc(&buf, G));
  ncclWindow_t win = nullptr;
  out("window", ncclCommWindowRegister(comm, buf, G, &win, NCCL_WIN_DEFAULT));
  std::printf("bytes_ok %d\n", fill_and_check(buf, 4096, 0x5a) ? 1 : 0);
  if (fixed) out("window_deregister", ncclCommWindowDeregister(comm, win));
  out("free", ncclMemFree(buf));
  if (!fixed) out("window_deregister", ncclCommWindowDeregister(comm, win));
  out("destroy", ncclCommDestroy(comm));
  return 0;
}

// The program's own VMM buffer in a window, deregistered, then unmapped twice by the program: the
// second unmap is of a whole reservation with nothing mapped, the shape of NCCL's own teardown of
// its window range (ncclDevrFinalize), but made by the program outside any NCCL call.
int window_double_unmap() {
  ncclComm_t comm = init();
  CUdeviceptr base = 0;
  CHECK_CU(cuMemAddressReserve(&base, G, 0, 0, 0));
  CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CHECK_CU(cuMemCreate(&h, G, &prop, 0));
  CHECK_CU(cuMemMap(base, G, 0, h, 0));
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(base, G, &acc, 1));
  void *buf = reinterpret_cast<void *>(base);
  ncclWindow_t win = nullptr;
  out("window", ncclCommWindowRegister(comm, buf, G, &win, NCCL_WIN_DEFAULT));
  std::printf("bytes_ok %d\n", fill_and_check(buf, 4096, 0x6b) ? 1 : 0);
  out("window_deregister", ncclCommWindowDeregister(comm, win));
  cu("unmap", cuMemUnmap(base, G));
  cu("unmap_again", cuMemUnmap(base, G));
  out("destroy", ncclCommDestroy(comm));
  cu("release", cuMemRelease(h));
  cu("addrfree", cuMemAddressFree(base, G));
  return 0;
}

// Memory bound to a multicast object, by handle or by address; `fixed`: unbound first.
int multicast(bool by_addr, bool fixed) {
  init_primary();
  int supported = 0;
  CHECK_CU(cuDeviceGetAttribute(&supported, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, 0));
  std::printf("supported %d\n", supported);
  if (!supported) {
    std::fprintf(stderr, "no multicast on this device\n");
    return 77;
  }
  CUmulticastObjectProp mp{};
  mp.numDevices = 1;
  mp.size = G;
  mp.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t gran = 0;
  CHECK_CU(cuMulticastGetGranularity(&gran, &mp, CU_MULTICAST_GRANULARITY_RECOMMENDED));
  mp.size = (G + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle mc = 0, mem = 0;
  cu("mc.create", cuMulticastCreate(&mc, &mp));
  cu("mc.add_device", cuMulticastAddDevice(mc, 0));
  CUmemAllocationProp prop = device_prop();
  CHECK_CU(cuMemCreate(&mem, mp.size, &prop, 0));
  CUdeviceptr va = 0;
  CHECK_CU(cuMemAddressReserve(&va, mp.size, 0, 0, 0));
  CHECK_CU(cuMemMap(va, mp.size, 0, mem, 0));
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CHECK_CU(cuMemSetAccess(va, mp.size, &acc, 1));
  if (by_addr)
    cu("mc.bind", cuMulticastBindAddr(mc, 0, va, mp.size, 0));
  else
    cu("mc.bind", cuMulticastBindMem(mc, 0, mem, 0, mp.size, 0));
  if (fixed) cu("mc.unbind", cuMulticastUnbind(mc, 0, 0, mp.size));
  cu("free.unmap", cuMemUnmap(va, mp.size));
  cu("free.release", cuMemRelease(mem));
  cu("free.addrfree", cuMemAddressFree(va, mp.size));
  if (!fixed) cu("mc.unbind", cuMulticastUnbind(mc, 0, 0, mp.size));
  cu("mc.release", cuMemRelease(mc));
  return 0;
}

// A communicator destroyed, then destroyed (or aborted) again; `fixed`: once.
int destroy_twice(bool fixed, bool abort) {
  ncclComm_t comm = init();
  std::printf("comm %p\n", static_cast<void *>(comm));
  out("destroy", ncclCommDestroy(comm));
  if (!fixed) out("again", abort ? ncclCommAbort(comm) : ncclCommDestroy(comm));
  return 0;
}

struct Suspend {
  decltype(&ncclCommSuspend) suspend = late<decltype(&ncclCommSuspend)>("ncclCommSuspend");
  decltype(&ncclCommResume) resume = late<decltype(&ncclCommResume)>("ncclCommResume");
  decltype(&ncclCommMemStats) stats = late<decltype(&ncclCommMemStats)>("ncclCommMemStats");
  bool ok() const { return suspend && resume && stats; }
  void stat(ncclComm_t comm, const char *step, ncclCommMemStat_t s) const {
    uint64_t v = 0;
    const ncclResult_t r = stats(comm, s, &v);
    std::printf("%s %d %llu\n", step, static_cast<int>(r), static_cast<unsigned long long>(v));
  }
};

// Suspend and resume misused (`how`: twice, resume-running, destroy-suspended) or used as they
// should be (ok). A rank of two: its proxy holds a buffer for the peer that a suspend releases.
int suspend_case(const std::string &how) {
  Suspend s;
  if (!s.ok()) {
    std::fprintf(stderr, "this libnccl has no ncclCommSuspend (NCCL 2.29.7 added it)\n");
    return 77;
  }
  ncclComm_t comm = init(2, 0);
  void *buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, 4096));
  std::printf("bytes_before %d\n", fill_and_check(buf, 4096, 0x11) ? 1 : 0);
  s.stat(comm, "stats.suspendable", ncclStatGpuMemSuspend);
  if (how == "resume-running") out("resume_running", s.resume(comm));
  out("suspend", s.suspend(comm, NCCL_SUSPEND_MEM));
  s.stat(comm, "stats.suspended", ncclStatGpuMemSuspended);
  if (how == "twice") out("suspend_again", s.suspend(comm, NCCL_SUSPEND_MEM));
  if (how == "destroy-suspended") out("destroy_suspended", ncclCommDestroy(comm));
  out("resume", s.resume(comm));
  s.stat(comm, "stats.resumed", ncclStatGpuMemSuspended);
  std::vector<float> host(256, 1.5f), back(256, 0.f);
  void *x = nullptr;
  CHECK_CUDA(cudaMalloc(&x, 1024));
  CHECK_CUDA(cudaMemcpy(x, host.data(), 1024, cudaMemcpyHostToDevice));
  out("all_reduce", ncclAllReduce(x, x, 256, ncclFloat, ncclSum, comm, nullptr));
  CHECK_CUDA(cudaMemcpy(back.data(), x, 1024, cudaMemcpyDeviceToHost));
  std::printf("result_ok %d\n", host == back ? 1 : 0);
  CHECK_CUDA(cudaFree(x));
  out("destroy", ncclCommDestroy(comm));
  std::printf("bytes_after %d\n", fill_and_check(buf, 4096, 0x22) ? 1 : 0);
  CHECK_CUDA(cudaFree(buf));
  return 0;
}

// Three communicator lifetimes; `abort`: each ends with ncclCommAbort (the NET proxy's peer
// memory stays mapped, NVIDIA/nccl#1968), else with ncclCommDestroy.
int lifetimes(bool abort) {
  for (int i = 0; i < 3; ++i) {
    ncclComm_t comm = init();
    out(abort ? "abort" : "destroy", abort ? ncclCommAbort(comm) : ncclCommDestroy(comm));
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  if (c == "register-free") return register_free(false);
  if (c == "register-ok") return register_free(true);
  if (c == "register-segment") return register_segment(false);
  if (c == "register-segment-ok") return register_segment(true);
  if (c == "register-cudafree") return register_cudafree(false);
  if (c == "register-cudafree-ok") return register_cudafree(true);
  if (c == "window-free") return window_free(false);
  if (c == "window-ok") return window_free(true);
  if (c == "window-double-unmap") return window_double_unmap();
  if (c == "bind-mem") return multicast(false, false);
  if (c == "bind-mem-ok") return multicast(false, true);
  if (c == "bind-addr") return multicast(true, false);
  if (c == "bind-addr-ok") return multicast(true, true);
  if (c == "destroy-twice") return destroy_twice(false, false);
  if (c == "abort-after-destroy") return destroy_twice(false, true);
  if (c == "destroy-once") return destroy_twice(true, false);
  if (c == "suspend-twice" || c == "resume-running" || c == "destroy-suspended" ||
      c == "suspend-ok")
    return suspend_case(c == "suspend-twice" ? "twice" : c == "suspend-ok" ? "ok" : c);
  if (c == "abort-imports") return lifetimes(true);
  if (c == "destroy-imports") return lifetimes(false);
  std::fprintf(stderr, "usage: nccl_hold_cases CASE (see tests/integration/nccl_cases.py)\n");
  return 64;
}
