// SPDX-License-Identifier: Apache-2.0
// Linear-memory cases through the CUDA runtime (dynamic or static cudart, and the driver API for
// comparison): double free (P29), address reuse (P30), invalid frees, host and stream-ordered
// memory, many threads, fork. Prints one "step STATUS" line per call whose result matters.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "fork_gate.h"

namespace {

void out(const char *step, cudaError_t r) { std::printf("%s %s\n", step, cudaGetErrorName(r)); }

int basic() {
  void *p = nullptr, *h = nullptr;
  out("malloc", cudaMalloc(&p, 1 << 20));
  out("memset", cudaMemset(p, 0x11, 1 << 20));
  out("malloc_host", cudaMallocHost(&h, 4096));
  out("free", cudaFree(p));
  out("free_host", cudaFreeHost(h));
  out("free_null", cudaFree(nullptr));
  return 0;
}

int p29() {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  out("first_free", cudaFree(p));
  out("second_free", cudaFree(p));
  out("last_error", cudaGetLastError());  // a skipped call leaves nothing sticky behind
  return 0;
}

int p30() {
  void *p = nullptr, *q = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaMalloc(&q, 1 << 20));
  std::printf("reused %d\n", p == q ? 1 : 0);
  out("stale_free", cudaFree(p));  // stale code frees the old pointer
  out("owner_free", cudaFree(q));
  return 0;
}

int invalid() {
  char *p = nullptr;
  void *h = nullptr;
  CHECK_CUDA(cudaMalloc(reinterpret_cast<void **>(&p), 1 << 20));
  CHECK_CUDA(cudaMallocHost(&h, 4096));
  out("interior", cudaFree(p + 256));
  out("host_to_cudaFree", cudaFree(h));
  out("device_to_cudaFreeHost", cudaFreeHost(p));
  out("never_allocated", cudaFree(reinterpret_cast<void *>(0x12345000)));
  CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaFreeHost(h));
  return 0;
}

int host_double() {
  void *h = nullptr;
  CHECK_CUDA(cudaHostAlloc(&h, 8192, 0));
  out("first_free", cudaFreeHost(h));
  out("second_free", cudaFreeHost(h));
  return 0;
}

int async_double() {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  void *p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, 1 << 16, s));
  out("first_free", cudaFreeAsync(p, s));
  out("second_free", cudaFreeAsync(p, s));
  CHECK_CUDA(cudaStreamSynchronize(s));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

int driver_double() {
  init_primary();
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, 1 << 20));
  std::printf("first_free %s\n", cu_name(cuMemFree(p)));
  std::printf("second_free %s\n", cu_name(cuMemFree(p)));
  return 0;
}

// An allocation that fails for lack of memory while the quarantine holds freed memory: the shim
// releases it and retries once; the caller sees success and no leftover error.
int oom_retry() {
  void *p = nullptr, *q = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  CHECK_CUDA(cudaFree(p));
  if (!fake_inject("cuMemAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY)) return 77;
  out("malloc_after_oom", cudaMalloc(&q, 1 << 20));
  out("last_error", cudaGetLastError());
  if (q) CHECK_CUDA(cudaFree(q));
  return 0;
}

int leak() {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 3 << 20));  // never freed: reported at exit
  out("leaked", cudaSuccess);
  return 0;
}

// A double free with another allocation live: strict mode stops at the second free, and what is
// live then is written as leaks as it aborts.
int leak_double() {
  void *keep = nullptr, *p = nullptr;
  CHECK_CUDA(cudaMalloc(&keep, 2 << 20));
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  out("first_free", cudaFree(p));
  out("second_free", cudaFree(p));
  return 0;
}

int threads() {
  constexpr int kThreads = 8, kIters = 500;
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  CHECK_CUDA(cudaFree(nullptr));  // initialise the context once
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::vector<void *> mine;
      for (int i = 0; i < kIters; ++i) {
        void *p = nullptr;
        if (cudaMalloc(&p, static_cast<size_t>(4096 * (1 + (i + t) % 7))) != cudaSuccess) ++failures;
        mine.push_back(p);
        if (mine.size() > 16) {
          if (cudaFree(mine.front()) != cudaSuccess) ++failures;
          mine.erase(mine.begin());
        }
      }
      for (void *p : mine)
        if (cudaFree(p) != cudaSuccess) ++failures;
    });
  for (auto &t : ts) t.join();
  std::printf("failures %d\n", failures.load());
  std::printf("calls %d\n", kThreads * kIters * 2);
  return failures.load() ? 1 : 0;
}

// Forks n children one after the other; returns how many exited with status 0.
int fork_children(int n, ForkGate *gate = nullptr) {
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    pid_t pid = gate ? gate->fork() : fork();
    if (pid == 0) {
      // The child's CUDA calls are recorded in a log of its own; whatever the driver answers
      // (the real one refuses a context inherited across fork), the child exits cleanly.
      void *q = nullptr;
      (void)cudaMalloc(&q, 4096);
      std::exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++ok;
  }
  return ok;
}

int forked() {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  // Another thread holds the shim busy while this one forks: the child must not deadlock.
  std::atomic<bool> stop{false};
  ForkGate gate(1);
  std::thread busy([&] {
    for (bool first = true; !stop; first = false) {
      GateRound round(gate, first);
      void *q = nullptr;
      if (cudaMalloc(&q, 4096) == cudaSuccess) cudaFree(q);
    }
  });
  const int children_ok = fork_children(20, &gate);
  stop = true;
  busy.join();
  std::printf("children_ok %d\n", children_ok);
  out("free", cudaFree(p));
  return 0;
}

// fork while other threads that made CUDA calls (with stacks on: each has a stack-walk cache) sit
// idle: the child exits through the leak check of a sanitized build, which must find nothing of
// the parent's threads or model left unreferenced (the shim's fork handlers).
int forked_quiet() {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 1 << 20));
  void *f = nullptr;
  CHECK_CUDA(cudaMalloc(&f, 4096));
  CHECK_CUDA(cudaFree(f));  // a freed record in the model too
  std::mutex m;
  std::condition_variable cv;
  bool go = false;
  std::atomic<int> ready{0};
  std::vector<std::thread> idle;
  for (int i = 0; i < 4; ++i) {
    idle.emplace_back([&] {
      void *q = nullptr;
      if (cudaMalloc(&q, 4096) == cudaSuccess) cudaFree(q);
      std::unique_lock lk(m);
      ++ready;
      cv.wait(lk, [&] { return go; });
    });
  }
  while (ready.load() < 4) std::this_thread::yield();
  int children_ok = 0;
  {
    std::lock_guard lk(m);  // every idle thread is inside cv.wait now
    children_ok = fork_children(5);
    go = true;
  }
  cv.notify_all();
  for (auto &t : idle) t.join();
  std::printf("children_ok %d\n", children_ok);
  out("free", cudaFree(p));
  return 0;
}

}  // namespace

// The runtime started first (cudart looks the driver up through cuGetProcAddress), then the
// driver called directly by every way a program has: the PLT, dlsym in the global scope, and
// dlsym with libcuda's own handle. Another interposer preloaded after the shim must see exactly
// the calls it sees without the shim (tests/reliability hostile-interposer-routes).
int routes() {
  void *p = nullptr;
  out("malloc", cudaMalloc(&p, 1 << 20));
  using Alloc = CUresult (*)(CUdeviceptr *, size_t);
  using Free = CUresult (*)(CUdeviceptr);
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  const Alloc global = reinterpret_cast<Alloc>(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
  const Alloc own = lib ? reinterpret_cast<Alloc>(dlsym(lib, "cuMemAlloc_v2")) : nullptr;
  const Free own_free = lib ? reinterpret_cast<Free>(dlsym(lib, "cuMemFree_v2")) : nullptr;
  if (!global || !own || !own_free) return 2;
  CUdeviceptr a = 0, b = 0, c = 0;
  std::printf("plt_alloc %s\n", cu_name(cuMemAlloc(&a, 1 << 20)));
  std::printf("global_alloc %s\n", cu_name(global(&b, 1 << 20)));
  std::printf("handle_alloc %s\n", cu_name(own(&c, 1 << 20)));
  std::printf("frees %s %s %s\n", cu_name(cuMemFree(a)), cu_name(cuMemFree(b)),
              cu_name(own_free(c)));
  out("free", cudaFree(p));
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: runtime_cases CASE\n");
    return 64;
  }
  std::string c = argv[1];
  if (c == "basic") return basic();
  if (c == "P29") return p29();
  if (c == "P30") return p30();
  if (c == "invalid") return invalid();
  if (c == "host_double") return host_double();
  if (c == "async_double") return async_double();
  if (c == "driver_double") return driver_double();
  if (c == "leak") return leak();
  if (c == "leak_double") return leak_double();
  if (c == "oom_retry") return oom_retry();
  if (c == "threads") return threads();
  if (c == "fork") return forked();
  if (c == "fork-quiet") return forked_quiet();
  if (c == "routes") return routes();
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
