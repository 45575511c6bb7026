// SPDX-License-Identifier: Apache-2.0
// Cache flushes while NCCL is live (bug-patterns.md P17-P19) with a PyTorch-shaped caching
// allocator (libfakecaching: its flush and OOM-retry functions are local symbols), NCCL set up on
// another thread, collectives that hold the device (FAKENCCL_COLL_NS on the fake stack), and the
// C API of the shim looked up with dlsym. Prints one "step value" line per result that matters;
// times in whole milliseconds.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "cumemguard.h"
#include "fakecuda.h"
#include "nccl_late.h"

extern "C" {
int fakecache_empty_cache(void);
cudaError_t fakecache_malloc(void **p, size_t size, int *released);
void fakecache_free(void *p, size_t size);
size_t fakecache_cached_bytes(void);
int fakecache_release_errors(void);
cudaError_t fakecache_async_empty_cache(void);
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMiB = 1 << 20;

long ms_since(Clock::time_point t0) {
  return static_cast<long>(
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
}

void step(const char *k, long v) {
  std::printf("%s %ld\n", k, v);
}
void step(const char *k, const char *v) {
  std::printf("%s %s\n", k, v);
}

// Blocks that go through the cache: allocated together, then freed into it (cached: still
// allocated in the driver until a flush).
void cached_blocks(int n, size_t size) {
  std::vector<void *> ps(static_cast<size_t>(n));
  for (void *&p : ps) CHECK_CUDA(fakecache_malloc(&p, size, nullptr));
  for (void *p : ps) fakecache_free(p, size);
}
void cached_block(size_t size) {
  cached_blocks(1, size);
}

// The fake driver's control calls (absent on the real driver).
bool set_busy(unsigned long long ns) {
  auto f =
      reinterpret_cast<void (*)(int, unsigned long long)>(dlsym(RTLD_DEFAULT, "fakecuda_set_busy"));
  if (f) f(0, ns);
  return f != nullptr;
}

long long fake_linear_bytes() {
  fakecuda_state st{};
  auto f = reinterpret_cast<fakecuda_get_state_fn>(dlsym(RTLD_DEFAULT, "fakecuda_get_state"));
  if (!f || f(&st) != 0) return -1;
  return static_cast<long long>(st.linear_bytes);
}

template <class F>
F capi(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

ncclComm_t init_comm(ncclResult_t *res) {
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  *res = ncclGetUniqueId(&id);
  if (*res == ncclSuccess) *res = ncclCommInitRank(&comm, 1, id, 0);
  return comm;
}

// A one-shot handshake between the two threads of P17.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  int value = 0;
  void set(int v) {
    std::lock_guard<std::mutex> lk(mu);
    value = v;
    cv.notify_all();
  }
  void wait_for(int v) {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return value >= v; });
  }
};

// P17: thread A sets up NCCL and runs a collective per iteration (it holds the device); thread B
// (main) flushes the cache right after each collective started, then frees a buffer of its own
// (an intentional free). After the communicator is destroyed, one more flush while the device
// is busy: suppression is sticky.
int p17() {
  constexpr int kIters = 3;
  constexpr size_t kBlock = 8 * kMiB;
  CHECK_CUDA(cudaSetDevice(0));
  // Before any communicator: not an opportunistic flush yet.
  cached_block(kBlock);
  step("pre.released", fakecache_empty_cache());

  Gate init_done, go, launched, finished;
  ncclResult_t init_res = ncclSuccess, coll_res = ncclSuccess, destroy_res = ncclSuccess;
  bool result_ok = true;
  std::thread a([&] {
    CHECK_CUDA(cudaSetDevice(0));
    ncclComm_t comm = init_comm(&init_res);
    init_done.set(1);
    if (init_res != ncclSuccess) return;
    const int n = 1024;
    std::vector<float> host(n), back(n);
    for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i) + 0.25f;
    void *send = nullptr, *recv = nullptr;
    CHECK_CUDA(cudaMalloc(&send, n * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&recv, n * sizeof(float)));
    CHECK_CUDA(cudaMemcpy(send, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreate(&s));
    for (int i = 0; i < kIters; ++i) {
      go.wait_for(i + 1);
      if (ncclResult_t r = ncclAllReduce(send, recv, n, ncclFloat, ncclSum, comm, s)) coll_res = r;
      launched.set(i + 1);
    }
    finished.wait_for(1);
    CHECK_CUDA(cudaStreamSynchronize(s));
    CHECK_CUDA(cudaMemcpy(back.data(), recv, n * sizeof(float), cudaMemcpyDeviceToHost));
    result_ok = std::memcmp(host.data(), back.data(), n * sizeof(float)) == 0;
    CHECK_CUDA(cudaFree(send));
    CHECK_CUDA(cudaFree(recv));
    CHECK_CUDA(cudaStreamDestroy(s));
    destroy_res = ncclCommDestroy(comm);
  });

  init_done.wait_for(1);
  long flush_min = 1 << 30, flush_max = 0, int_min = 1 << 30, int_max = 0, released = 0;
  for (int i = 0; i < kIters && init_res == ncclSuccess; ++i) {
    cached_block(kBlock);
    void *mine = nullptr;
    CHECK_CUDA(cudaMalloc(&mine, kMiB));
    go.set(i + 1);
    launched.wait_for(i + 1);
    auto t0 = Clock::now();
    released += fakecache_empty_cache();  // the per-iteration flush
    const long f = ms_since(t0);
    t0 = Clock::now();
    CHECK_CUDA(cudaFree(mine));  // intentional: never held back
    const long m = ms_since(t0);
    flush_min = std::min(flush_min, f), flush_max = std::max(flush_max, f);
    int_min = std::min(int_min, m), int_max = std::max(int_max, m);
  }
  finished.set(1);
  a.join();
  step("init", init_res);
  step("all_reduce", coll_res);
  step("result_ok", result_ok ? 1 : 0);
  step("destroy", destroy_res);
  step("flush.released", released);
  step("flush.min_ms", flush_min);
  step("flush.max_ms", flush_max);
  step("intentional.min_ms", int_min);
  step("intentional.max_ms", int_max);

  // Sticky: no communicator is live, the device is busy again, the program flushes.
  cached_block(kBlock);
  const bool fake = set_busy(300'000'000ull);
  auto t0 = Clock::now();
  step("sticky.released", fakecache_empty_cache());
  if (fake) step("sticky.flush_ms", ms_since(t0));
  step("release_errors", fakecache_release_errors());
  // The flush function is a local symbol: not found through the dynamic symbol table.
  step("flush_symbol_dynamic",
       dlsym(RTLD_DEFAULT,
             "_ZN3c104cuda20CUDACachingAllocator6Native22NativeCachingAllocator10emptyCacheEv")
           ? 1
           : 0);
  return 0;
}

// P18 (defer): held flushes come back when an allocation fails with out-of-memory (then it is
// retried once), on cumemguard_release_deferred(), and at exit. FAKECUDA_DEVICE_MEMORY=96M.
int p18() {
  constexpr size_t kBlock = 24 * kMiB;
  CHECK_CUDA(cudaSetDevice(0));
  ncclResult_t r;
  ncclComm_t comm = init_comm(&r);
  step("init", r);
  if (r != ncclSuccess) return 1;
  cached_blocks(3, kBlock);
  step("flush1.released", fakecache_empty_cache());
  // 72 MiB flushed; with the shim in defer mode they are still allocated in the driver.
  void *big = nullptr;
  step("big_alloc", cudaGetErrorName(cudaMalloc(&big, 48 * kMiB)));
  if (big) CHECK_CUDA(cudaFree(big));
  cached_blocks(2, kBlock);
  step("flush2.released", fakecache_empty_cache());
  step("linear_bytes_before_release", fake_linear_bytes());
  auto release = capi<cumemguard_release_deferred_fn>("cumemguard_release_deferred");
  if (release)
    step("release_deferred", static_cast<long>(release()));
  else
    step("release_deferred", "absent");
  step("linear_bytes_after_release", fake_linear_bytes());
  cached_block(kBlock);
  step("flush3.released", fakecache_empty_cache());  // held until exit
  step("destroy", ncclCommDestroy(comm));
  return 0;
}

// P19 (defer): what is not an opportunistic flush is never held, and memory held back never
// makes another allocator fail: the OOM retry of the caching allocator itself, an intentional
// free, cuMemCreate of another library, and NCCL's buffers for a second communicator.
// FAKECUDA_DEVICE_MEMORY=96M; the first communicator takes 6 MiB of it.
int p19() {
  CHECK_CUDA(cudaSetDevice(0));
  ncclResult_t r;
  ncclComm_t comm = init_comm(&r);
  step("init", r);
  if (r != ncclSuccess) return 1;
  // 1. The OOM path: three cached 24 MiB blocks, then 48 MiB that only fits once they are gone.
  cached_blocks(3, 24 * kMiB);
  void *p = nullptr;
  int released = 0;
  step("oom_path.result", cudaGetErrorName(fakecache_malloc(&p, 48 * kMiB, &released)));
  step("oom_path.released", released);
  step("oom_path.cached_bytes", static_cast<long>(fakecache_cached_bytes()));
  fakecache_free(p, 48 * kMiB);
  step("flush.released", fakecache_empty_cache());  // held back with the shim in defer mode

  // 2. An intentional free goes to the driver at once.
  void *mine = nullptr;
  CHECK_CUDA(cudaMalloc(&mine, 8 * kMiB));
  const long long before = fake_linear_bytes();
  CHECK_CUDA(cudaFree(mine));
  if (before >= 0)
    step("intentional.freed_now", before - fake_linear_bytes() == 8 * (long long)kMiB ? 1 : 0);

  // 3. Another library's cuMemCreate needs the memory the flush gave up.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h = 0;
  const CUresult cr = cuMemCreate(&h, 64 * kMiB, &prop, 0);
  step("vmm.create", cu_name(cr));
  if (cr == CUDA_SUCCESS) step("vmm.release", cu_name(cuMemRelease(h)));

  // 4. NCCL's buffers for a second communicator, with the device full of flushed blocks.
  cached_blocks(2, 45 * kMiB);
  step("flush2.released", fakecache_empty_cache());
  ncclComm_t comm2 = init_comm(&r);
  step("nccl_init2", r);
  if (r == ncclSuccess) step("destroy2", ncclCommDestroy(comm2));
  step("destroy", ncclCommDestroy(comm));
  step("release_errors", fakecache_release_errors());
  return 0;
}

// Suppression after a setup that failed (FAKECUDA_FAIL makes NCCL's first cuMemCreate fail).
int sticky_failed() {
  CHECK_CUDA(cudaSetDevice(0));
  cached_block(8 * kMiB);
  step("pre.released", fakecache_empty_cache());
  ncclResult_t r;
  ncclComm_t comm = init_comm(&r);
  step("init", r);
  if (comm) ncclCommDestroy(comm);
  cached_block(8 * kMiB);
  const bool fake = set_busy(300'000'000ull);
  auto t0 = Clock::now();
  step("flush.released", fakecache_empty_cache());
  if (fake) step("flush_ms_at_least_200", ms_since(t0) >= 200 ? 1 : 0);
  return 0;
}

// A non-blocking init (config.blocking = 0) answers ncclInProgress: the communicator counts as
// live from then on, and a flush made while its setup still runs is an opportunistic one.
int nonblocking() {
  CHECK_CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  step("get_id", ncclGetUniqueId(&id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  step("init", ncclCommInitRankConfig(&comm, 1, id, 0, &cfg));
  cached_block(8 * kMiB);
  step("flush.released", fakecache_empty_cache());
  // Until the setup is done (NCCL says when; a 60 s bound only guards against a hang).
  ncclResult_t async = ncclInProgress;
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (async == ncclInProgress && Clock::now() < until) {
    ncclCommGetAsyncError(comm, &async);
    if (async == ncclInProgress) std::this_thread::yield();
  }
  step("async", async);
  step("destroy", ncclCommDestroy(comm));
  return 0;
}

// The cudaMallocAsync backend's flush: a trim of the default pool under CudaMallocAsyncAllocator.
int trim() {
  CHECK_CUDA(cudaSetDevice(0));
  ncclResult_t r;
  ncclComm_t comm = init_comm(&r);
  step("init", r);
  step("trim", cudaGetErrorName(fakecache_async_empty_cache()));
  if (comm) step("destroy", ncclCommDestroy(comm));
  return 0;
}

// The C API's serialization: a flush runs through cumemguard_maybe_empty_cache on one thread;
// another thread starts a communicator while it runs. The init returns only after the flush has
// finished, the flush's own frees are not findings, and later requests decline. Ordered by events,
// not by time: the flush runs until it sees the init turn suppression on (the init has entered
// the shim), keeps running while it watches for the init to return (it must not), then ends; the
// order of its end and the init's return is read from one counter.
int capi_race() {
  auto maybe = capi<cumemguard_maybe_empty_cache_fn>("cumemguard_maybe_empty_cache");
  auto suppressed = capi<cumemguard_opportunistic_cleanup_suppressed_fn>(
      "cumemguard_opportunistic_cleanup_suppressed");
  if (!maybe || !suppressed) {
    step("capi", "absent");
    return 0;
  }
  step("capi", "present");
  CHECK_CUDA(cudaSetDevice(0));
  step("before.suppressed", suppressed());
  cached_block(8 * kMiB);
  struct Ctx {
    Gate started;
    cumemguard_opportunistic_cleanup_suppressed_fn suppressed;
    std::atomic<bool> init_returned{false};
    std::atomic<unsigned> order{0};
    unsigned end = 0;
    bool saw_init = false, returned_during = false;
    int released = 0;
  } ctx;
  ctx.suppressed = suppressed;
  int ran = -1;
  std::thread a([&] {
    CHECK_CUDA(cudaSetDevice(0));
    ran = maybe(
        [](void *arg) {
          auto *c = static_cast<Ctx *>(arg);
          c->started.set(1);
          while (!c->suppressed()) std::this_thread::yield();
          c->saw_init = true;
          // An init that did not wait would return now: give it every chance to.
          for (int i = 0; i < 20000 && !c->init_returned.load(); ++i) std::this_thread::yield();
          c->returned_during = c->init_returned.load();
          c->released = fakecache_empty_cache();
          c->end = c->order.fetch_add(1) + 1;
        },
        &ctx);
  });
  ctx.started.wait_for(1);
  ncclResult_t r;
  ncclComm_t comm = init_comm(&r);
  const unsigned ret = ctx.order.fetch_add(1) + 1;
  ctx.init_returned.store(true);
  a.join();
  step("init", r);
  step("race.ran", ran);
  step("race.released", ctx.released);
  step("race.saw_init_enter", ctx.saw_init ? 1 : 0);
  step("race.init_returned_during_flush", ctx.returned_during ? 1 : 0);
  step("race.init_after_flush", ret > ctx.end ? 1 : 0);
  int calls = 0;
  step("after.ran", maybe([](void *arg) { ++*static_cast<int *>(arg); }, &calls));
  step("after.callback_calls", calls);
  step("after.suppressed", suppressed());
  if (comm) step("destroy", ncclCommDestroy(comm));
  step("after_destroy.suppressed", suppressed());
  return 0;
}

}  // namespace

// The cleanup contract with NCCL's suspend (vLLM's sleep mode): a rank's communicator is suspended, then the
// program flushes its cache to hand the memory to another process. The suspended communicator is
// quiet (NCCL synchronized the device and passed a barrier before it released its memory), so
// the flush is not an opportunistic one and the C API runs the optional flush; once resumed, a
// flush is one again. ncclCommSuspend is looked up at run time (2.29.7; 77 without it).
int suspend() {
  auto sus = capi<decltype(&ncclCommSuspend)>("ncclCommSuspend");
  auto res = capi<decltype(&ncclCommResume)>("ncclCommResume");
  if (!sus || !res) {
    std::fprintf(stderr, "this libnccl has no ncclCommSuspend (NCCL 2.29.7 added it)\n");
    return 77;
  }
  auto maybe = capi<cumemguard_maybe_empty_cache_fn>("cumemguard_maybe_empty_cache");
  step("capi", maybe ? "present" : "absent");
  CHECK_CUDA(cudaSetDevice(0));
  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  step("init",
       ncclGetUniqueId(&id) == ncclSuccess ? ncclCommInitRank(&comm, 2, id, 0) : ncclSystemError);
  cached_block(8 * kMiB);
  step("live.released", fakecache_empty_cache());
  step("suspend", sus(comm, NCCL_SUSPEND_MEM));
  cached_block(8 * kMiB);
  step("suspended.released", fakecache_empty_cache());
  int calls = 0;
  auto count = [](void *p) { ++*static_cast<int *>(p); };
  if (maybe) step("suspended.ran", maybe(count, &calls));
  step("resume", res(comm));
  cached_block(8 * kMiB);
  step("resumed.released", fakecache_empty_cache());
  if (maybe) step("resumed.ran", maybe(count, &calls));
  step("destroy", ncclCommDestroy(comm));
  return 0;
}

int main(int argc, char **argv) {
  const std::string c = argc > 1 ? argv[1] : "";
  if (c == "suspend") return suspend();
  if (c == "p17") return p17();
  if (c == "p18") return p18();
  if (c == "p19") return p19();
  if (c == "sticky-failed") return sticky_failed();
  if (c == "trim") return trim();
  if (c == "nonblocking") return nonblocking();
  if (c == "capi-race") return capi_race();
  std::fprintf(stderr, "usage: flush_cases p17|p18|p19|sticky-failed|nonblocking|trim|capi-race\n");
  return 64;
}
