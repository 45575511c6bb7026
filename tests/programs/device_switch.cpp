// SPDX-License-Identifier: Apache-2.0
// Allocations on two devices while the thread's current context changes every way the driver and
// the runtime change it: cudaSetDevice, cuCtxSetCurrent, push and pop, cuCtxCreate (which pushes)
// and cuCtxSetCurrent(NULL) (which pops it: real-driver.md section 5), new threads. After each
// allocation it prints "alloc PTR DEV" with the driver's own answer (cuCtxGetDevice, which the
// shim does not wrap), so a checker can compare the device the shim recorded for PTR.
// Exit status 77: fewer than two devices.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

std::vector<void *> g_runtime;
std::vector<CUdeviceptr> g_driver;

int driver_device() {
  CUdevice d = -1;
  return cuCtxGetDevice(&d) == CUDA_SUCCESS ? d : -1;
}

void must(bool ok, const char *what) {
  if (ok) return;
  std::fprintf(stderr, "device_switch: %s failed\n", what);
  std::exit(1);
}
#define MUST(x) must((x), #x)

void runtime_alloc(const char *step) {
  void *p = nullptr;
  MUST(cudaMalloc(&p, 1 << 20) == cudaSuccess);
  std::printf("alloc %p %d %s\n", p, driver_device(), step);
  g_runtime.push_back(p);
}

void driver_alloc(const char *step) {
  CUdeviceptr p = 0;
  MUST(cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS);
  std::printf("alloc %p %d %s\n", reinterpret_cast<void *>(p), driver_device(), step);
  g_driver.push_back(p);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
    std::fprintf(stderr, "device_switch: needs two devices (%d)\n", n);
    return 77;
  }
  MUST(cudaSetDevice(0) == cudaSuccess);
  runtime_alloc("set-device-0");
  MUST(cudaSetDevice(1) == cudaSuccess);
  runtime_alloc("set-device-1");
  driver_alloc("set-device-1-driver");

  CUcontext p0 = nullptr, p1 = nullptr, other = nullptr, popped = nullptr;
  MUST(cuDevicePrimaryCtxRetain(&p0, 0) == CUDA_SUCCESS);
  MUST(cuDevicePrimaryCtxRetain(&p1, 1) == CUDA_SUCCESS);
  MUST(cuCtxSetCurrent(p0) == CUDA_SUCCESS);
  driver_alloc("ctx-set-current-0");
  runtime_alloc("ctx-set-current-0-runtime");  // the runtime adopts the driver's context
  MUST(cuCtxPushCurrent(p1) == CUDA_SUCCESS);
  driver_alloc("ctx-push-1");
  MUST(cuCtxPopCurrent(&popped) == CUDA_SUCCESS && popped == p1);
  driver_alloc("ctx-pop-back-to-0");
  MUST(cuCtxCreate(&other, nullptr, 0, 1) == CUDA_SUCCESS);
  driver_alloc("ctx-create-1");
  MUST(cuCtxSetCurrent(nullptr) == CUDA_SUCCESS);  // pops the created context: p0 is current
  driver_alloc("set-null-pops-to-0");
  MUST(cuCtxPushCurrent(other) == CUDA_SUCCESS);
  driver_alloc("ctx-push-created-1");
  MUST(cuCtxDestroy(other) == CUDA_SUCCESS);  // current, so popped: p0 again
  driver_alloc("destroy-pops-to-0");

  std::thread([] {
    runtime_alloc("new-thread");
    MUST(cudaSetDevice(1) == cudaSuccess);
    runtime_alloc("new-thread-set-device-1");
  }).join();
  std::thread([p1] {
    MUST(cuCtxSetCurrent(p1) == CUDA_SUCCESS);
    driver_alloc("other-thread-ctx-set-current-1");
  }).join();
  driver_alloc("main-thread-still-0");
  MUST(cudaSetDevice(1) == cudaSuccess);
  runtime_alloc("set-device-1-again");
  MUST(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
  MUST(cuDevicePrimaryCtxRelease(1) == CUDA_SUCCESS);
  for (void *p : g_runtime) MUST(cudaFree(p) == cudaSuccess);
  for (CUdeviceptr p : g_driver) MUST(cuMemFree(p) == CUDA_SUCCESS);
  return 0;
}
