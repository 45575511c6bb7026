// SPDX-License-Identifier: Apache-2.0
// Probe (program half): changes the current context with the driver API, then lets the runtime
// (cudaMalloc, cudaSetDevice, a new thread) pick one, printing the current context and the routed
// context calls counted by libctx_routes.so after each step. Build and run:
//   nvcc -O2 -o ctx_routes ctx_routes.cu -lcuda -lpthread
//   LD_PRELOAD=./libctx_routes.so ./ctx_routes
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <atomic>
#include <cstdio>
#include <thread>

static int count(const char *n) {
  auto *p = static_cast<std::atomic<int> *>(dlsym(RTLD_DEFAULT, n));
  return p ? p->load() : -1;
}
static CUcontext cur() {
  CUcontext c = nullptr;
  cuCtxGetCurrent(&c);
  return c;
}
static void step(const char *what, CUcontext primary, CUcontext other) {
  CUcontext c = cur();
  std::printf("%-44s current=%s routed set=%d push=%d pop=%d retain=%d\n", what,
              c == primary ? "primary" : c == other ? "other" : c ? "?" : "none", count("cr_set"),
              count("cr_push"), count("cr_pop"), count("cr_retain"));
}
static const char *owner(void *p, CUcontext primary, CUcontext other) {
  CUcontext c = nullptr;
  cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, reinterpret_cast<CUdeviceptr>(p));
  return c == primary ? "primary" : c == other ? "other" : "?";
}

int main() {
  std::printf("cudaFree(0): %d\n", cudaFree(nullptr));
  CUcontext primary = cur(), other = nullptr;
  step("after cudaFree(0)", primary, other);
  CUdevice dev = 0;
  cuDeviceGet(&dev, 0);
  std::printf("cuCtxCreate: %d\n", cuCtxCreate(&other, nullptr, 0, dev));
  step("after cuCtxCreate (driver API)", primary, other);
  void *a = nullptr;
  std::printf("cudaMalloc: %d\n", cudaMalloc(&a, 1 << 20));
  step("after cudaMalloc with other current", primary, other);
  std::printf("  its memory belongs to %s\n", owner(a, primary, other));
  std::printf("cudaSetDevice(0): %d\n", cudaSetDevice(0));
  step("after cudaSetDevice(0)", primary, other);
  void *b = nullptr;
  cudaMalloc(&b, 1 << 20);
  step("after cudaMalloc", primary, other);
  std::printf("  its memory belongs to %s\n", owner(b, primary, other));
  cuCtxSetCurrent(other);
  step("after cuCtxSetCurrent(other) (driver API)", primary, other);
  cudaFree(a);
  step("after cudaFree of other's memory", primary, other);
  cuCtxSetCurrent(nullptr);
  step("after cuCtxSetCurrent(NULL) (driver API)", primary, other);
  void *d = nullptr;
  cudaMalloc(&d, 1 << 20);
  step("after cudaMalloc with none current", primary, other);
  std::thread([&] {
    step("new thread, before any call", primary, other);
    void *e = nullptr;
    cudaMalloc(&e, 1 << 20);
    step("new thread, after cudaMalloc", primary, other);
    std::printf("  its memory belongs to %s\n", owner(e, primary, other));
    cudaFree(e);
  }).join();
  std::thread([&] {
    cudaSetDevice(0);
    step("another thread, after cudaSetDevice(0)", primary, other);
  }).join();
  cudaFree(b);
  cudaFree(d);
  cuCtxDestroy(other);
  return 0;
}
