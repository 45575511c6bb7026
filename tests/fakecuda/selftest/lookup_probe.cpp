// SPDX-License-Identifier: Apache-2.0
// How the fake runtime (shared or static) and the fake NCCL reach the driver, checked against the
// sequence measured for the real ones (interposers.md 9.1/9.2, real-driver.md section 5).
//
// Runs under LD_PRELOAD=libgpa_logger.so with GPA_LOG and FAKECUDA_TRACE set; exercises the
// library, then reads both logs. Usage: lookup_probe shared|static|nccl
#include <cuda.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "selftest_util.h"

#ifdef PROBE_CUDART
#include <cuda_runtime_api.h>
#endif
#ifdef PROBE_NCCL
#include <nccl.h>

#include "fakecuda.h"
#endif

namespace {

int failures = 0;

void check(bool ok, const char *what, const std::string &detail = "") {
  if (ok) return;
  ++failures;
  std::fprintf(stderr, "FAILED: %s%s%s\n", what, detail.empty() ? "" : ": ", detail.c_str());
}
#define CHECK(cond, ...) check((cond), #cond, ##__VA_ARGS__)

std::vector<std::string> with_prefix(const std::vector<std::string> &lines, const std::string &p) {
  std::vector<std::string> out;
  for (const auto &l : lines)
    if (l.rfind(p, 0) == 0) out.push_back(l);
  return out;
}

std::string joined(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += "\n  " + x;
  return s;
}

// The part every CUDA 13 runtime shares: one dlsym of cuGetProcAddress_v2 by `caller`, four
// lookups through it, everything else through the pointer handed out for 12000.
void check_bootstrap(const std::vector<std::string> &log, const std::string &caller) {
  std::vector<std::string> dl = with_prefix(log, "dlsym ");
  CHECK(dl.size() == 1 && dl[0] == "dlsym " + caller + " cuGetProcAddress_v2", joined(dl));
  std::vector<std::string> d = with_prefix(log, "D ");
  const std::vector<std::string> want = {"D \"\" 0 0", "D cuInit 2000 0", "D cuGetProcAddress 11030 0",
                                         "D cuGetProcAddress 12000 0"};
  CHECK(d == want, joined(d));
  CHECK(with_prefix(log, "G4 ").empty());
  CHECK(with_prefix(log, "G ").size() > 20);
}

void check_trace_start(const std::vector<std::string> &trace) {
  const std::vector<std::string> want = {
      "gpa cuGetProcAddress_v2 \"\" 0 0 NULL",
      "gpa cuGetProcAddress_v2 cuInit 2000 0 cuInit",
      "call cuInit CUDA_SUCCESS",
      "gpa cuGetProcAddress_v2 cuGetProcAddress 11030 0 cuGetProcAddress",
      "gpa cuGetProcAddress_v2 cuGetProcAddress 12000 0 cuGetProcAddress_v2"};
  CHECK(trace.size() > want.size() &&
            std::vector<std::string>(trace.begin(), trace.begin() + 5) == want,
        joined(std::vector<std::string>(trace.begin(), trace.begin() + std::min<size_t>(5, trace.size()))));
}

#ifdef PROBE_CUDART
void exercise_and_check(bool static_runtime) {
  void *p = nullptr;
  CHECK(cudaMalloc(&p, 1 << 20) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  CHECK(cudaFree(nullptr) == cudaSuccess);
  // Errors map from the driver and cudaGetLastError returns them once.
  CHECK(cudaFree(reinterpret_cast<void *>(0x1000)) == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaErrorInvalidValue);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(cudaMalloc(&p, size_t{1} << 40) == cudaErrorMemoryAllocation);
  CHECK(cudaPeekAtLastError() == cudaErrorMemoryAllocation);
  CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
  CHECK(std::strcmp(cudaGetErrorName(cudaErrorMemoryAllocation), "cudaErrorMemoryAllocation") == 0);
  CHECK(std::strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") == 0);
  int v = 0;
  CHECK(cudaRuntimeGetVersion(&v) == cudaSuccess && v == 13000);
  CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == 13000);
  // Each thread gets the primary context at its first runtime call.
  std::thread([] {
    void *q = nullptr;
    CHECK(cudaMalloc(&q, 4096) == cudaSuccess);
    int dev = -1;
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0);
    CHECK(cudaFree(q) == cudaSuccess);
  }).join();
  void *a = nullptr;
  CHECK(cudaMallocAsync(&a, 4096, nullptr) == cudaSuccess);
  CHECK(cudaFreeAsync(a, nullptr) == cudaSuccess);
  void *h = nullptr;
  CHECK(cudaMallocHost(&h, 4096) == cudaSuccess);
  cudaPointerAttributes attr{};
  CHECK(cudaPointerGetAttributes(&attr, h) == cudaSuccess && attr.type == cudaMemoryTypeHost);
  CHECK(cudaFreeHost(h) == cudaSuccess);
  // PyTorch's way to the VMM API: through the stored 12000 pointer (real-driver.md section 5).
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
  CHECK(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, cudaEnableDefault, &st) == cudaSuccess);
  CHECK(fn != nullptr && st == cudaDriverEntryPointSuccess);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemGenericAllocationHandle handle = 0;
  if (fn) CHECK(reinterpret_cast<decltype(&cuMemCreate)>(fn)(&handle, 2 << 20, &prop, 0) == CUDA_SUCCESS);
  void *rel = nullptr;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"  // deprecated in 13.0, still used by NCCL
  CHECK(cudaGetDriverEntryPoint("cuMemRelease", &rel, cudaEnableDefault, &st) == cudaSuccess && rel);
#pragma GCC diagnostic pop
  if (rel) CHECK(reinterpret_cast<decltype(&cuMemRelease)>(rel)(handle) == CUDA_SUCCESS);
  CHECK(cudaGetDriverEntryPointByVersion("cuNoSuchThing", &fn, 12000, cudaEnableDefault, &st) == cudaSuccess);
  CHECK(fn == nullptr && st == cudaDriverEntryPointSymbolNotFound);

  const std::vector<std::string> log = selftest::read_lines(std::getenv("GPA_LOG"));
  // The dynamic runtime asks from libcudart.so.13; the static one from this program.
  std::string caller = "libcudart.so.13";
  if (static_runtime) {
    Dl_info self{};
    dladdr(reinterpret_cast<void *>(&exercise_and_check), &self);
    const char *slash = self.dli_fname ? std::strrchr(self.dli_fname, '/') : nullptr;
    caller = slash ? slash + 1 : (self.dli_fname && *self.dli_fname ? self.dli_fname : "?");
    CHECK(dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD) == nullptr);
  }
  check_bootstrap(log, caller);
  for (const char *l : {"G cuMemAlloc 3020 0", "G cuMemFree 3020 0", "G cuMemHostAlloc 2020 0",
                        "G cuMemFreeHost 2000 0", "G cuMemAllocAsync 11020 0", "G cuMemAllocAsync 11020 2",
                        "G cuMemFreeAsync 11020 0", "G cuMemFreeAsync 11020 2", "G cuIpcGetMemHandle 4010 0",
                        "G cuIpcCloseMemHandle 4010 0", "G cuIpcOpenMemHandle 11000 0",
                        "G cuCtxGetDevice 2000 0", "G cuCtxGetDevice 13000 0", "G cuCtxSynchronize 2000 0",
                        "G cuCtxSynchronize 13000 0", "G cuMemCreate 12000 0", "G cuMemRelease 13000 0",
                        "G cuNoSuchThing 12000 0"})
    CHECK(selftest::has_line(log, l), l);

  const std::vector<std::string> trace = selftest::read_lines(std::getenv("FAKECUDA_TRACE"));
  check_trace_start(trace);
  for (const char *l : {"gpa cuGetProcAddress_v2 cuMemAlloc 3020 0 cuMemAlloc_v2",
                        "gpa cuGetProcAddress_v2 cuMemAllocAsync 11020 2 cuMemAllocAsync_ptsz",
                        "gpa cuGetProcAddress_v2 cuCtxSynchronize 13000 0 cuCtxSynchronize_v2",
                        "gpa cuGetProcAddress_v2 cuNoSuchThing 12000 0 NULL",
                        "call cuMemAlloc_v2 CUDA_SUCCESS", "call cuMemAlloc_v2 CUDA_ERROR_OUT_OF_MEMORY",
                        "call cuMemFree_v2 CUDA_ERROR_INVALID_VALUE", "call cuMemCreate CUDA_SUCCESS",
                        "call cuMemAllocAsync CUDA_SUCCESS"})
    CHECK(selftest::has_line(trace, l), l);
}
#endif

#ifdef PROBE_NCCL
void exercise_and_check() {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  CHECK(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  void *buf = nullptr;
  CHECK(ncclMemAlloc(&buf, 1 << 20) == ncclSuccess);
  CHECK(ncclAllReduce(buf, buf, 256, ncclFloat, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclMemFree(buf) == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  fakecuda_state s{};
  fakecuda_get_state(&s);
  CHECK(s.phys_allocs == 0 && s.mappings == 0 && s.reservations == 0 && s.handle_refs == 0);

  const std::vector<std::string> log = selftest::read_lines(std::getenv("GPA_LOG"));
  check_bootstrap(log, "libnccl.so.2");
  for (const char *l : {"G cuMemCreate 10020 0", "G cuMemAddressReserve 10020 0", "G cuMemAddressFree 10020 0",
                        "G cuMemMap 10020 0", "G cuMemUnmap 10020 0", "G cuMemRelease 10020 0",
                        "G cuMemSetAccess 10020 0", "G cuMemExportToShareableHandle 10020 0",
                        "G cuMemImportFromShareableHandle 10020 0", "G cuMemGetAllocationGranularity 10020 0",
                        "G cuMemGetAllocationPropertiesFromHandle 10020 0",
                        "G cuMemRetainAllocationHandle 11000 0", "G cuCtxCreate 3020 0", "G cuCtxCreate 11040 0",
                        "G cuIpcGetMemHandle 4010 0", "G cuIpcOpenMemHandle 4010 0",
                        "G cuIpcOpenMemHandle 11000 0", "G cuIpcCloseMemHandle 4010 0", "G cuMemAlloc 3020 0",
                        "G cuMemFree 3020 0"})
    CHECK(selftest::has_line(log, l), l);

  // The helper thread has no context (bug-patterns.md P27) and creates memory all the same, on
  // the host too; cuCtxCreate is looked up, never called.
  const std::vector<std::string> trace = selftest::read_lines(std::getenv("FAKECUDA_TRACE"));
  check_trace_start(trace);
  CHECK(selftest::has_line(trace, "call cuCtxGetDevice_v2 CUDA_ERROR_INVALID_CONTEXT"));
  CHECK(selftest::has_line(trace, "gpa cuGetProcAddress_v2 cuCtxCreate 11040 0 cuCtxCreate_v3"));
  CHECK(fakecuda_calls("cuCtxCreate_v2") == 0 && fakecuda_calls("cuCtxCreate_v3") == 0);
  CHECK(fakecuda_calls("cuMemCreate") == 5);
  // Four communicator buffers: released once at init and once more (the retained handle) at
  // destroy; the ncclMemAlloc buffer twice at ncclMemFree.
  CHECK(fakecuda_calls("cuMemRelease") == 10);
  CHECK(fakecuda_calls("cuMemRetainAllocationHandle") == 5);
  size_t errors = 0;
  for (const auto &l : with_prefix(trace, "call cuMem"))
    if (l.find(" CUDA_SUCCESS") == std::string::npos) ++errors;
  CHECK(errors == 0, joined(with_prefix(trace, "call cuMem")));
}
#endif

}  // namespace

int main(int argc, char **argv) {
  for (const char *var : {"GPA_LOG", "FAKECUDA_TRACE"}) {
    const char *path = std::getenv(var);
    if (!path || !*path) {
      std::fprintf(stderr, "lookup_probe: %s is not set\n", var);
      return 2;
    }
    unlink(path);  // the logs are appended to; start from nothing
  }
  const std::string mode = argc > 1 ? argv[1] : "";
#ifdef PROBE_CUDART
  if (mode != "shared" && mode != "static") return 2;
  exercise_and_check(mode == "static");
#endif
#ifdef PROBE_NCCL
  if (mode != "nccl") return 2;
  exercise_and_check();
#endif
  if (failures) std::fprintf(stderr, "lookup_probe %s: %d failed checks\n", mode.c_str(), failures);
  return failures ? 1 : 0;
}
