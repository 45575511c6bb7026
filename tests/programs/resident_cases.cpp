// SPDX-License-Identifier: Apache-2.0
// What is still resident, and why: programs for the snapshot boundaries and their findings
// (tests/integration/check_resident.py runs each one without and with the shim and reads the log).
//
//   graph-pool        a sleep-mode allocator puts its pool to sleep while two CUDA-graph pool
//                     segments made by the caching allocator (cuMemAlloc) stay resident
//   graph-pool-fixed  the graph pool's segments come from the sleep-mode pool: all of it sleeps
//   wake-fail         a wake-up whose third cuMemCreate fails leaves the first two blocks created
//                     and mapped; the allocator still counts them asleep, so the next sleep leaves
//                     them mapped and its teardown frees their reservations while mapped
//   wake-fail-fixed   the same wake-up rolls back what it made before it reports the error
//   busy-device       device 0 has work queued; a thread whose current device is 1 unmaps
//                     device-0 memory (a free callback on another device's thread)
//   busy-device-fixed the thread synchronizes device 0 first
//   stray-device      a rank working on device 1 (RANK set) has a teardown thread that never
//                     selects its device: the runtime gives it device 0, a context and memory
//   stray-device-fixed the thread selects device 1 first
//   stray-comm        no rank in the environment: device 0 memory from a thread, then an NCCL
//                     communicator on device 1 makes this process a rank of device 1
//   snapshot-api      two snapshots through the C API around an allocation
//   snapshot-signal   a snapshot asked for with the signal CUMEMGUARD_SNAPSHOT_SIGNAL names
//   graph-owned       a snapshot while a plain allocation, a graph's private-pool block (cudaMalloc
//                     in relaxed mode inside the capture) and a graph allocation a launch made
//                     (a captured cudaMallocAsync) are live
//   snapshot-fork     a forked child asks for a snapshot with the signal: its own log has it, the
//                     parent's log only the parent's
//   fork-at-start     forks at once after each first CUDA call, 32 generations deep: at each
//                     fork the shim's threads of the forking process are past their set-up (a
//                     thread still starting would leave its allocator lock held in the child)
//   nccl-destroy      a communicator destroyed and one aborted, each a boundary
//   nccl-suspend      a rank suspends its communicator's memory (NCCL_SUSPEND_MEM) while its own
//                     weights stay mapped, then resumes it
//   nccl-suspend-fixed the rank puts its weights to sleep first and wakes them after the resume
// Output: one "name value" line per observation, compared without and with the shim.
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.h"
#include "nccl_late.h"

namespace {

size_t G = 0;  // granularity

void out(const char *what, long long v) {
  std::printf("%s %lld\n", what, v);
}
void out_res(const char *what, CUresult r) {
  std::printf("%s %s\n", what, cu_name(r));
}

CUmemAllocationProp prop_on(int dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

CUresult set_access(CUdeviceptr v, size_t size, int dev) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return cuMemSetAccess(v, size, &a, 1);
}

// ---- a sleep-mode allocator (vLLM's CuMemAllocator, cumem_allocator.cpp)
// -------------------------

struct Block {
  CUdeviceptr v = 0;
  size_t size = 0;
  CUmemGenericAllocationHandle h = 0;
  bool asleep = false;
};

// The allocator's one create-and-map site, as cumem_allocator.cpp has: the site the shim tells the
// allocator's mappings apart by. Not inlined, so every caller reaches the driver from here.
__attribute__((noinline)) CUresult create_and_map(Block &b) {
  CUmemAllocationProp p = prop_on(0);
  CUresult r = cuMemCreate(&b.h, b.size, &p, 0);
  if (r != CUDA_SUCCESS) return r;
  r = cuMemMap(b.v, b.size, 0, b.h, 0);
  if (r != CUDA_SUCCESS) return r;
  return set_access(b.v, b.size, 0);
}

__attribute__((noinline)) void unmap_and_release(Block &b) {
  CHECK_CU(cuMemUnmap(b.v, b.size));
  CHECK_CU(cuMemRelease(b.h));
}

struct SleepPool {
  std::vector<Block> blocks;

  Block &malloc(size_t size) {
    Block b;
    b.size = size;
    CHECK_CU(cuMemAddressReserve(&b.v, size, 0, 0, 0));
    CHECK_CU(create_and_map(b));
    blocks.push_back(b);
    return blocks.back();
  }
  void sleep() {
    for (Block &b : blocks)
      if (!b.asleep) {
        unmap_and_release(b);
        b.asleep = true;
      }
  }
  // The wake-up of the failing variant: on an error it returns at once, and every block keeps
  // its state (still asleep), so what it created and mapped before the error is forgotten.
  CUresult wake_up(bool roll_back) {
    std::vector<Block *> made;
    for (Block &b : blocks) {
      if (!b.asleep) continue;
      CUresult r = create_and_map(b);
      if (r != CUDA_SUCCESS) {
        if (roll_back) {
          // The fix: what this wake-up made goes back before the error is reported.
          for (Block *m : made) unmap_and_release(*m);
        }
        return r;
      }
      made.push_back(&b);
    }
    for (Block *b : made) b->asleep = false;
    return CUDA_SUCCESS;
  }
  // The allocator's free: a block it counts as asleep has nothing mapped (the sleep allocator's fix), so
  // only its reservation is freed.
  void free_all() {
    for (Block &b : blocks) {
      if (!b.asleep) unmap_and_release(b);
      out_res("teardown.addrfree", cuMemAddressFree(b.v, b.size));
    }
    blocks.clear();
  }
};

// ---- a caching allocator's CUDA-graph pool: linear segments of its own -------------------------

__attribute__((noinline)) CUdeviceptr graph_pool_segment(size_t size) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, size));
  return p;
}

int graph_pool(bool fixed) {
  SleepPool pool;
  for (int i = 0; i < 4; ++i) pool.malloc(2 * G);  // weights and KV cache
  std::vector<CUdeviceptr> graph_segments;
  if (fixed) {
    // The graphs are captured inside the sleep-mode pool: their segments sleep with it.
    for (int i = 0; i < 2; ++i) pool.malloc(2 * G);
  } else {
    // One call site for both: a count the compiler cannot see keeps the loop from being unrolled
    // into two call sites (two stacks of one site).
    volatile int segments = 2;
    for (int i = 0; i < segments; ++i) graph_segments.push_back(graph_pool_segment(2 * G));
  }
  pool.sleep();
  out_res("wake_up", pool.wake_up(false));
  for (CUdeviceptr p : graph_segments) CHECK_CU(cuMemFree(p));
  pool.free_all();
  return 0;
}

int wake_fail(bool fixed) {
  if (!on_fake_driver()) return 77;  // the failure is injected
  SleepPool pool;
  for (int i = 0; i < 4; ++i) pool.malloc(2 * G);
  pool.sleep();
  // The third cuMemCreate from here fails with out-of-memory.
  fake_inject("cuMemCreate", 3, CUDA_ERROR_OUT_OF_MEMORY);
  out_res("wake_up", pool.wake_up(fixed));
  // The program goes on: a new block, then the next sleep.
  pool.malloc(2 * G);
  pool.sleep();
  // Waking up for good this time (what the failed wake-up forgot stays as it is).
  if (fixed) out_res("wake_up_again", pool.wake_up(true));
  pool.free_all();
  return 0;
}

// ---- the busy check on the device that owns the range ------------------------------------------

using set_busy_fn = void (*)(int, unsigned long long);

CUcontext primary(int dev) {
  CUcontext c;
  CHECK_CU(cuDevicePrimaryCtxRetain(&c, dev));
  return c;
}

int busy_device(bool fixed) {
  auto set_busy = reinterpret_cast<set_busy_fn>(dlsym(RTLD_DEFAULT, "fakecuda_set_busy"));
  if (!set_busy) return 77;
  int n = 0;
  CHECK_CU(cuDeviceGetCount(&n));
  if (n < 2) return 77;
  CUcontext c0 = primary(0), c1 = primary(1);
  CHECK_CU(cuCtxSetCurrent(c0));
  Block b;
  b.size = 2 * G;
  CHECK_CU(cuMemAddressReserve(&b.v, b.size, 0, 0, 0));
  CHECK_CU(create_and_map(b));
  // Device 0 has 2 s of work queued that uses the block; device 1 has 30 s of its own.
  set_busy(0, 2'000'000'000ull);
  set_busy(1, 30'000'000'000ull);
  std::thread t([&] {
    // A free callback on a thread that works on device 1.
    CHECK_CU(cuCtxSetCurrent(c1));
    if (fixed) {
      // The fix: wait for the device that owns the memory before unmapping it.
      CHECK_CU(cuCtxPushCurrent(c0));
      CHECK_CU(cuCtxSynchronize());
      CUcontext popped;
      CHECK_CU(cuCtxPopCurrent(&popped));
    }
    out_res("unmap", cuMemUnmap(b.v, b.size));
    // Device 1 is still busy: the check did not wait for the calling thread's device.
    out_res("device1_after_unmap", cuStreamQuery(nullptr));
    CUdevice cur = -1;
    CHECK_CU(cuCtxGetDevice(&cur));
    out("current_device_after_unmap", cur);
    out_res("release", cuMemRelease(b.h));
  });
  t.join();
  out_res("addrfree", cuMemAddressFree(b.v, b.size));
  return 0;
}

// ---- devices a rank does not use
// -----------------------------------------------------------------

int stray_device(bool fixed) {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n < 2) return 77;
  CHECK_CUDA(cudaSetDevice(1));  // this rank works on device 1
  void *weights = nullptr;
  CHECK_CUDA(cudaMalloc(&weights, 1 << 20));
  std::thread teardown([&] {
    // A teardown (or logging, or watchdog) thread: a new thread's runtime device is 0.
    if (fixed) CHECK_CUDA(cudaSetDevice(1));
    void *scratch = nullptr;
    CHECK_CUDA(cudaMalloc(&scratch, 4096));
    int dev = -1;
    CHECK_CUDA(cudaGetDevice(&dev));
    out("teardown_device", dev);
    CHECK_CUDA(cudaFree(scratch));
  });
  teardown.join();
  CHECK_CUDA(cudaFree(weights));
  return 0;
}

int stray_comm() {
  int n = 0;
  CHECK_CUDA(cudaGetDeviceCount(&n));
  if (n < 2) return 77;
  CHECK_CUDA(cudaSetDevice(1));
  void *weights = nullptr;
  CHECK_CUDA(cudaMalloc(&weights, 1 << 20));
  void *scratch = nullptr;
  std::thread early([&] { CHECK_CUDA(cudaMalloc(&scratch, 4096)); });  // device 0
  early.join();
  ncclUniqueId id;
  ncclComm_t comm;
  out("nccl_id", ncclGetUniqueId(&id));
  out("nccl_init", ncclCommInitRank(&comm, 1, id, 0));  // on device 1, this thread's
  out("nccl_destroy", ncclCommDestroy(comm));
  CHECK_CUDA(cudaFree(weights));
  std::thread late([&] { CHECK_CUDA(cudaFree(scratch)); });
  late.join();
  return 0;
}

// ---- snapshots asked for ---------------------------------------------------------------------

using snapshot_fn = size_t (*)(const char *);

__attribute__((noinline)) CUdeviceptr cache_block(size_t size) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, size));
  return p;
}

__attribute__((noinline)) CUdeviceptr activation(size_t size) {
  CUdeviceptr p = 0;
  CHECK_CU(cuMemAlloc(&p, size));
  return p;
}

int snapshot_api() {
  auto snap = reinterpret_cast<snapshot_fn>(dlsym(RTLD_DEFAULT, "cumemguard_snapshot"));
  std::vector<CUdeviceptr> keep;
  for (int i = 0; i < 3; ++i) keep.push_back(cache_block(1 << 20));
  keep.push_back(activation(1 << 20));
  out("snapshot_before", snap ? static_cast<long long>(snap("before")) : -1);
  keep.push_back(cache_block(1 << 20));                             // the cache grew by one block
  for (int i = 0; i < 2; ++i) keep.push_back(activation(2 << 20));  // new, bigger activations
  out("snapshot_after", snap ? static_cast<long long>(snap("after")) : -1);
  for (CUdeviceptr p : keep) CHECK_CU(cuMemFree(p));
  return 0;
}

bool log_has_snapshot(const char *path) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.find("\"k\":\"snapshot\"") != std::string::npos &&
        line.find("\"end\":true") != std::string::npos)
      return true;
  return false;
}

int snapshot_signal(const char *log) {
  struct sigaction sa {};
  sigaction(SIGUSR2, nullptr, &sa);
  const bool handled = sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
  out("usr2_handled", handled);
  std::vector<CUdeviceptr> keep;
  for (int i = 0; i < 2; ++i) keep.push_back(cache_block(1 << 20));
  if (handled && log && *log) {
    kill(getpid(), SIGUSR2);
    // The program goes on; the snapshot thread writes the record meanwhile. Bounded wait for it.
    bool seen = false;
    for (int i = 0; i < 2000 && !seen; ++i) {
      seen = log_has_snapshot(log);
      if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    out("snapshot_seen", seen);
  }
  keep.push_back(cache_block(1 << 20));
  out("went_on", 1);
  for (CUdeviceptr p : keep) CHECK_CU(cuMemFree(p));
  return 0;
}

// ---- graph-owned memory -------------------------------------------------------------------------

__attribute__((noinline)) void *plain_block(size_t size) {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, size));
  return p;
}

// PyTorch's allocator making a segment of a graph's private pool while the capture is open.
__attribute__((noinline)) void *private_pool_block(size_t size) {
  cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, size));
  CHECK_CUDA(cudaThreadExchangeStreamCaptureMode(&m));
  return p;
}

__attribute__((noinline)) void *graph_node(size_t size, cudaStream_t s) {
  void *p = nullptr;
  CHECK_CUDA(cudaMallocAsync(&p, size, s));
  return p;
}

int graph_owned() {
  auto snap = reinterpret_cast<snapshot_fn>(dlsym(RTLD_DEFAULT, "cumemguard_snapshot"));
  cudaStream_t s = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void *plain = plain_block(1 << 20);
  CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  void *pool = private_pool_block(2 << 20);
  void *node = graph_node(4 << 20, s);
  cudaGraph_t g = nullptr;
  CHECK_CUDA(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t x = nullptr;
  CHECK_CUDA(cudaGraphInstantiate(&x, g, 0));
  CHECK_CUDA(cudaGraphLaunch(x, s));  // allocates the node's 4 MiB
  CHECK_CUDA(cudaStreamSynchronize(s));
  out("snapshot", snap ? static_cast<long long>(snap("graphs")) : -1);
  CHECK_CUDA(cudaFree(node));
  CHECK_CUDA(cudaFree(pool));
  CHECK_CUDA(cudaFree(plain));
  CHECK_CUDA(cudaGraphExecDestroy(x));
  CHECK_CUDA(cudaGraphDestroy(g));
  CHECK_CUDA(cudaStreamDestroy(s));
  return 0;
}

// Sends SIGUSR2 to this process and waits (bounded) for a complete snapshot in `log`.
bool signal_and_wait(const std::string &log) {
  kill(getpid(), SIGUSR2);
  for (int i = 0; i < 2000; ++i) {
    if (log_has_snapshot(log.c_str())) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The parent holds 1 MiB and forks (a data-loader worker). The child asks for a snapshot with the
// signal before any CUDA call of its own: it goes to the child's own log, LOG.<pid> (the parent's
// name is taken). Its CUDA call after fails as a forked child's does (CUDA is not fork-safe:
// NOT_INITIALIZED). Then the parent asks for one.
int snapshot_fork(const char *log) {
  struct sigaction sa {};
  sigaction(SIGUSR2, nullptr, &sa);
  const bool handled = sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN;
  out("usr2_handled", handled);
  CUdeviceptr parent = cache_block(1 << 20);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    if (handled && log && *log)
      out("child_snapshot_seen",
          signal_and_wait(std::string(log) + "." + std::to_string(getpid())));
    CUdeviceptr own = 0;
    out_res("child_alloc", cuMemAlloc(&own, 3 << 20));
    out("child_went_on", 1);
    std::fflush(stdout);
    _exit(0);
  }
  int st = 0;
  waitpid(pid, &st, 0);
  out("child_status", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  if (handled && log && *log) out("parent_snapshot_seen", signal_and_wait(log));
  CHECK_CU(cuMemFree(parent));
  return 0;
}

// The names of this process's threads the shim started ("cmg-..."), sorted, comma-separated; "-"
// for none.
std::string shim_threads() {
  std::vector<std::string> names;
  if (DIR *d = opendir("/proc/self/task")) {
    while (const dirent *e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string n;
      if (std::getline(f, n) && n.rfind("cmg-", 0) == 0) names.push_back(n);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string all;
  for (const auto &n : names) all += (all.empty() ? "" : ",") + n;
  return all.empty() ? "-" : all;
}

// Pinned to one CPU at real-time FIFO priority (where the process may: CAP_SYS_NICE), a thread
// the shim creates does not run until its creator blocks: without the wait at fork it is still in
// its set-up at every fork, with it the fork sleeps until the thread is past it.
int fork_at_start() {
  constexpr int kLevels = 32;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu(), &one);
  const sched_param prio{1};
  out("fifo", sched_setaffinity(0, sizeof one, &one) == 0 &&
                  sched_setscheduler(0, SCHED_FIFO, &prio) == 0);
  for (int level = 0; level < kLevels; ++level) {
    CUdeviceptr p = 0;
    const CUresult r = cuMemAlloc(&p, 1 << 20);  // a forked child's fails: NOT_INITIALIZED
    std::fflush(stdout);
    const pid_t pid = level + 1 < kLevels ? fork() : -1;
    if (pid == 0) continue;  // the child is the next generation
    const std::string names = shim_threads();  // read at once: what fork waited for is there
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    const std::string l = "level" + std::to_string(level);
    out((l + "_alloc_ok").c_str(), r == CUDA_SUCCESS);
    if (pid > 0) {
      std::printf("%s_threads %s\n", l.c_str(), names.c_str());
      out((l + "_child_status").c_str(), WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
    }
    if (r == CUDA_SUCCESS) CHECK_CU(cuMemFree(p));
    std::fflush(stdout);
    if (level == 0) return pid < 0 ? 2 : 0;
    _exit(0);
  }
  return 0;
}

int nccl_destroy() {
  ncclUniqueId id;
  ncclComm_t a, b;
  out("nccl_id", ncclGetUniqueId(&id));
  out("init_a", ncclCommInitRank(&a, 1, id, 0));
  CUdeviceptr keep = cache_block(1 << 20);
  out("destroy_a", ncclCommDestroy(a));
  out("nccl_id2", ncclGetUniqueId(&id));
  out("init_b", ncclCommInitRank(&b, 1, id, 0));
  out("abort_b", ncclCommAbort(b));
  CHECK_CU(cuMemFree(keep));
  return 0;
}

// ---- an NCCL suspend ---------------------------------------------------------------------------

template <class F>
F nccl_late(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

__attribute__((noinline)) void weights(Block &b) {
  b.size = 2 * G;
  CHECK_CU(cuMemAddressReserve(&b.v, b.size, 0, 0, 0));
  CHECK_CU(create_and_map(b));
}

// A rank of two (its proxy holds a buffer for the peer, which the suspend releases and the resume
// maps again at the same address).
int nccl_suspend(bool fixed) {
  auto suspend = nccl_late<decltype(&ncclCommSuspend)>("ncclCommSuspend");
  auto resume = nccl_late<decltype(&ncclCommResume)>("ncclCommResume");
  if (!suspend || !resume) {
    std::fprintf(stderr, "this libnccl has no ncclCommSuspend (NCCL 2.29.7 added it)\n");
    return 77;
  }
  ncclUniqueId id;
  ncclComm_t comm;
  out("nccl_id", ncclGetUniqueId(&id));
  out("init", ncclCommInitRank(&comm, 2, id, 0));
  Block w;
  weights(w);
  if (fixed) unmap_and_release(w);  // the weights go to sleep with the communicator
  out("suspend", suspend(comm, NCCL_SUSPEND_MEM));
  out("resume", resume(comm));
  if (fixed) CHECK_CU(create_and_map(w));
  out("destroy", ncclCommDestroy(comm));
  unmap_and_release(w);
  CHECK_CU(cuMemAddressFree(w.v, w.size));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: resident_cases CASE [LOG]\n");
    return 64;
  }
  const std::string c = argv[1];
  if (c == "stray-device") return stray_device(false);
  if (c == "stray-device-fixed") return stray_device(true);
  if (c == "stray-comm") return stray_comm();
  CHECK_CU(cuInit(0));
  CUcontext ctx = nullptr;
  CHECK_CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CHECK_CU(cuCtxSetCurrent(ctx));
  CUmemAllocationProp p = prop_on(0);
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (c == "graph-pool") return graph_pool(false);
  if (c == "graph-pool-fixed") return graph_pool(true);
  if (c == "wake-fail") return wake_fail(false);
  if (c == "wake-fail-fixed") return wake_fail(true);
  if (c == "busy-device") return busy_device(false);
  if (c == "busy-device-fixed") return busy_device(true);
  if (c == "snapshot-api") return snapshot_api();
  if (c == "snapshot-signal") return snapshot_signal(argc > 2 ? argv[2] : nullptr);
  if (c == "graph-owned") return graph_owned();
  if (c == "snapshot-fork") return snapshot_fork(argc > 2 ? argv[2] : nullptr);
  if (c == "fork-at-start") return fork_at_start();
  if (c == "nccl-destroy") return nccl_destroy();
  if (c == "nccl-suspend") return nccl_suspend(false);
  if (c == "nccl-suspend-fixed") return nccl_suspend(true);
  std::fprintf(stderr, "unknown case %s\n", c.c_str());
  return 64;
}
