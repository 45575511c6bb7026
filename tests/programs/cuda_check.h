// SPDX-License-Identifier: Apache-2.0
// Helpers for the test programs: print a driver/runtime status by name, check calls the program
// relies on (file, line, call, error name, nvbench-style), and reach the fake driver's control
// calls when they exist (they do not on the real driver).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

inline const char *cu_name(CUresult r) {
  const char *s = nullptr;
  if (cuGetErrorName(r, &s) != CUDA_SUCCESS || !s) return "CUDA_ERROR_UNKNOWN_CODE";
  return s;
}

#define CHECK_CU(call)                                                                   \
  do {                                                                                   \
    CUresult r_ = (call);                                                                \
    if (r_ != CUDA_SUCCESS) {                                                            \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cu_name(r_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

// The same for runtime calls (declarations only: programs that never call cudart link no cudart).
#define CHECK_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t r_ = (call);                                                               \
    if (r_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,           \
                   cudaGetErrorName(r_));                                                  \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

// The fake driver's fault injection: fail the nth next call of `api` with `err`. Returns false on
// the real driver (the test then skips with 77).
inline bool fake_inject(const char *api, int nth, CUresult err) {
  using fn = void (*)(const char *, int, int);
  auto f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "fakecuda_inject"));
  if (!f) return false;
  f(api, nth, static_cast<int>(err));
  return true;
}

inline bool on_fake_driver() { return dlsym(RTLD_DEFAULT, "fakecuda_inject") != nullptr; }

// Context on device 0, made current on this thread.
inline CUcontext init_primary() {
  CHECK_CU(cuInit(0));
  CUdevice d;
  CHECK_CU(cuDeviceGet(&d, 0));
  CUcontext c;
  CHECK_CU(cuDevicePrimaryCtxRetain(&c, d));
  CHECK_CU(cuCtxSetCurrent(c));
  return c;
}

// A pinned device allocation on device 0 that can be exported to a file descriptor: the properties
// every VMM test program creates its allocations with.
inline CUmemAllocationProp device_prop(CUmemLocationType loc = CU_MEM_LOCATION_TYPE_DEVICE) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = loc;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}
