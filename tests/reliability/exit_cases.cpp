// SPDX-License-Identifier: Apache-2.0
// Exit paths of a hostile host (run_edges.py), under the test allocator of exit_alloc.h: a thread
// that calls exit() first arms it, so any allocation or free on that thread from then on (the
// shim's exit path, a library's destructor) aborts with its stack instead of hanging one run in
// twenty on a lock the interrupted thread holds.
//   sigterm-exit     a SIGTERM handler calls exit() on a thread interrupted while it writes a
//                    finding each round (inside the log's lock much of the time)
//   sigterm-churn    the same while four threads churn heap blocks of 1 to 64 KiB (past glibc's
//                    per-thread cache: every one takes the arena's lock), linear memory (a double
//                    free every few rounds) and VMM cycles, after announcing a transport through
//                    the shim's C API when it is there
//   exit-two [armed] two threads call exit() at the same moment while two others make calls
//                    (armed: with the test allocator armed on both)
//   ... park         (after sigterm-churn or exit-two) the program stops its other threads in an
//                    atexit handler before the libraries' destructors run, as a correct program on
//                    the real driver must: there, exit() while threads still call CUDA crashes in
//                    libcudart without the shim too (SIGSEGV in 8 of 10 sigterm-churn runs,
//                    docs/gpu/run-7.txt); the gpu suite's exit_paths part runs these
//   armed-calls      the check itself: the main thread arms the test allocator (no exit) and makes
//                    CUDA calls; under the shim its model allocates (abort, "exit-alloc:" naming
//                    the shim), without it the fake's own allocations pass and are counted
//   closed-stdio before|after
//                    closes 0, 1 and 2 (before or after its first CUDA call) and opens its own
//                    files, which get those numbers; then a finding and a warning; its own line
//                    goes to its file at 2
// Each case prints "step value" lines (to its own file at 1 in closed-stdio).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../programs/cuda_check.h"
#include "exit_alloc.h"

namespace {

void out(const char *step, long long v) {
  std::printf("%s %lld\n", step, v);
}

void on_term(int) {
  exit_alloc_arm();
  std::exit(0);
}

void install_term_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

// Threads that never end (exit() ends the process under them); the vector is leaked on purpose.
std::vector<std::thread> &threads() {
  static auto *ts = new std::vector<std::thread>;
  return *ts;
}

// The signal goes to one of the workers once each has run its first rounds (so that every path
// the case means to interrupt has run: findings written, frees held) and a little longer; the pid
// picks which worker.
[[noreturn]] void signal_a_worker(int workers, std::atomic<int> &started) {
  while (started.load() < workers) usleep(1000);
  usleep(20000);
  std::fflush(stdout);
  pthread_kill(threads()[static_cast<std::size_t>(getpid()) % threads().size()].native_handle(),
               SIGTERM);
  for (;;) pause();
}

int sigterm_exit() {
  install_term_handler();
  cudaFree(nullptr);
  static std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i)
    threads().emplace_back([] {
      cudaFree(nullptr);
      for (int round = 0;; ++round) {
        if (round == 8) ++started;
        void *p = nullptr;
        if (cudaMalloc(&p, 4096) != cudaSuccess) continue;
        cudaFree(p);
        cudaFree(p);  // a double free: a finding record
      }
    });
  signal_a_worker(4, started);
}

// "park": an atexit handler, registered after the runtime's first call (so it runs before the
// runtime's own exit handlers and before any library's destructor), asks the other threads to
// stop calling and waits, bounded, until `g_park_want` of them have: a thread blocked on a lock
// the exiting thread holds never does, and the exit goes on after 5 s as it would without it.
// Atomics and nanosleep only: the exiting thread is armed (exit_alloc.h).
std::atomic<bool> g_park{false}, g_stop{false};
std::atomic<int> g_parked{0};
int g_park_want = 0;
void stop_others() {
  g_stop.store(true);
  for (int i = 0; i < 5000 && g_parked.load() < g_park_want; ++i) {
    timespec t{0, 1'000'000};
    nanosleep(&t, nullptr);
  }
}
void park_at_exit(int others) {
  if (!g_park.load()) return;
  g_park_want = others;
  std::atexit(stop_others);
}
// At the top of each round of a thread that does not exit.
void park_if_stopped() {
  if (!g_stop.load(std::memory_order_relaxed)) return;
  ++g_parked;
  for (;;) pause();
}

// A small xorshift per thread: sizes and choices differ between rounds and threads.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

void vmm_cycle() {
  CUmemAllocationProp pr = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  if (cuMemCreate(&h, 2 << 20, &pr, 0) != CUDA_SUCCESS) return;
  if (cuMemAddressReserve(&v, 2 << 20, 0, 0, 0) == CUDA_SUCCESS) {
    if (cuMemMap(v, 2 << 20, 0, h, 0) == CUDA_SUCCESS) cuMemUnmap(v, 2 << 20);
    cuMemAddressFree(v, 2 << 20);
  }
  cuMemRelease(h);
}

int sigterm_churn() {
  install_term_handler();
  cudaFree(nullptr);
  park_at_exit(3);  // the signalled worker exits; the other three stop
  // Under the shim, a transport announced through its C API: the summary's transport lines are
  // written at exit too.
  using SuppressFn = void (*)();
  if (auto f = reinterpret_cast<SuppressFn>(
          dlsym(RTLD_DEFAULT, "cumemguard_suppress_opportunistic_cleanup")))
    f();
  static std::atomic<int> started{0};
  for (int i = 0; i < 4; ++i)
    threads().emplace_back([i] {
      cudaFree(nullptr);
      Rng rng{0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i + 1) ^
              static_cast<std::uint64_t>(getpid())};
      void *blocks[8] = {};
      for (std::uint64_t round = 0;; ++round) {
        park_if_stopped();
        if (round == 17) ++started;  // two double frees and two VMM cycles done
        // Heap blocks of 1 KiB to 64 KiB, eight alive at a time, replaced in turn.
        for (int k = 0; k < 4; ++k) {
          const std::size_t slot = rng.next() % 8;
          std::free(blocks[slot]);
          const std::size_t n = 1100 + rng.next() % (63 * 1024);
          blocks[slot] = std::malloc(n);
          if (blocks[slot]) std::memset(blocks[slot], static_cast<int>(round), 64);
        }
        void *p = nullptr;
        if (cudaMalloc(&p, 4096 << (rng.next() % 6)) == cudaSuccess) {
          cudaFree(p);
          if (round % 8 == 0) cudaFree(p);  // a double free: a finding
        }
        CUdeviceptr d = 0;
        if (cuMemAlloc(&d, 65536) == CUDA_SUCCESS) cuMemFree(d);
        if (i == 3 || round % 16 == 0) vmm_cycle();
      }
    });
  signal_a_worker(4, started);
}

// Two threads call exit() at once (undefined behaviour in C, yet the program runs fine without the
// shim), while two others keep calling: one summary and `end` must still be written.
int exit_two(bool armed) {
  cudaFree(nullptr);
  park_at_exit(2);  // the two that call and do not exit stop
  static std::atomic<int> ready{0};
  static std::atomic<bool> go{false};
  for (int i = 0; i < 2; ++i)
    threads().emplace_back([] {
      cudaFree(nullptr);
      ++ready;
      for (;;) {
        park_if_stopped();
        void *p = nullptr;
        if (cudaMalloc(&p, 8192) == cudaSuccess) cudaFree(p);
      }
    });
  static bool arm = armed;
  for (int i = 0; i < 2; ++i)
    threads().emplace_back([] {
      cudaFree(nullptr);
      ++ready;
      while (!go.load()) {
      }
      if (arm) exit_alloc_arm();
      std::exit(0);
    });
  while (ready.load() < 4) usleep(1000);
  usleep(20000);
  std::fflush(stdout);
  go.store(true);
  for (;;) pause();
}

// The test allocator's own check, without an exit: an armed thread's calls through the shim
// allocate in its model (a map node for each new allocation), and the first one aborts.
int armed_calls() {
  cudaFree(nullptr);
  std::vector<void *> ps(256, nullptr);
  exit_alloc_arm();
  int ok = 0;
  for (void *&p : ps) ok += cudaMalloc(&p, 4096) == cudaSuccess;
  for (void *p : ps) ok += cudaFree(p) == cudaSuccess;
  exit_alloc_disarm();
  out("calls_ok", ok);
  out("others", exit_alloc::g_foreign.load() > 0);
  std::fflush(stdout);
  return 0;
}

// The host's own descriptors at 0, 1 and 2: files it opened after closing the standard ones.
bool reopen_stdio(const char *dir) {
  close(0);
  close(1);
  close(2);
  const char *names[] = {"host-in", "host-out", "host-err"};
  for (int fd = 0; fd < 3; ++fd) {
    const std::string path = std::string(dir) + "/" + names[fd];
    if (open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600) != fd) return false;
  }
  return true;
}

int closed_stdio(const char *when, const char *dir) {
  const bool before = std::strcmp(when, "before") == 0;
  if (before && !reopen_stdio(dir)) return 3;
  void *p = nullptr;
  const cudaError_t a = cudaMalloc(&p, 4096);
  if (!before && !reopen_stdio(dir)) return 3;
  // stdout is its own file now (a new FILE state is not needed: fd 1 is a file again).
  out("malloc", a);
  out("free", cudaFree(p));
  out("double_free", cudaFree(p));  // a finding (printed)
  void *q = nullptr;
  cudaMalloc(&q, 4096);
  cudaFree(q);
  out("double_free2", cudaFree(q));  // past CUMEMGUARD_WARN_LIMIT=1: the warning line
  static const char mine[] = "the host's own line\n";
  ssize_t w = write(2, mine, sizeof mine - 1);
  out("own_line", w == static_cast<ssize_t>(sizeof mine - 1));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  exit_alloc::warm_up();
  if (argc < 2) return 64;
  const std::string c = argv[1];
  g_park = std::strcmp(argv[argc - 1], "park") == 0;
  if (c == "sigterm-exit") return sigterm_exit();
  if (c == "sigterm-churn") return sigterm_churn();
  if (c == "exit-two") return exit_two(argc > 2 && std::strcmp(argv[2], "armed") == 0);
  if (c == "armed-calls") return armed_calls();
  if (c == "closed-stdio" && argc == 4) return closed_stdio(argv[2], argv[3]);
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
