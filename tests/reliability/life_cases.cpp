// SPDX-License-Identifier: Apache-2.0
// Process-life cases for the shim (run_life.py): fork from a thread while other threads hold the
// shim's locks, fork+exec, vfork, posix_spawn, exit() from a thread, frees from static destructors
// after main() returns, a long-running writer and an idle process to be killed, crashes, and a
// forked child's finding (the launcher's status channel), children ending with _exit() and _Exit().
// Each
// case prints one "step value" line per result the harness checks; the same binary runs with and
// without the shim.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include "../programs/cuda_check.h"
#include "../programs/fork_gate.h"

extern char **environ;

namespace {

const char *g_self = nullptr;

void out(const char *step, long long v) { std::printf("%s %lld\n", step, v); }

// One round of the traffic every hook sees: linear memory through the runtime and the driver, and
// a full VMM cycle. Returns the number of calls that failed.
int traffic_round() {
  int bad = 0;
  void *p = nullptr;
  if (cudaMalloc(&p, 4096) != cudaSuccess) ++bad;
  else if (cudaFree(p) != cudaSuccess) ++bad;
  CUdeviceptr d = 0;
  if (cuMemAlloc(&d, 8192) != CUDA_SUCCESS) ++bad;
  else if (cuMemFree(d) != CUDA_SUCCESS) ++bad;
  CUmemAllocationProp pr = device_prop();
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  if (cuMemCreate(&h, 2 << 20, &pr, 0) != CUDA_SUCCESS) return bad + 1;
  if (cuMemAddressReserve(&v, 2 << 20, 0, 0, 0) != CUDA_SUCCESS) return bad + 1;
  if (cuMemMap(v, 2 << 20, 0, h, 0) != CUDA_SUCCESS) ++bad;
  if (cuMemUnmap(v, 2 << 20) != CUDA_SUCCESS) ++bad;
  if (cuMemRelease(h) != CUDA_SUCCESS) ++bad;
  if (cuMemAddressFree(v, 2 << 20) != CUDA_SUCCESS) ++bad;
  return bad;
}

// Threads that keep calling into the shim (its model, log and stack-table locks) until stopped.
struct Busy {
  ForkGate gate;
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> ts;
  explicit Busy(int n) : gate(n) {
    for (int i = 0; i < n; ++i)
      ts.emplace_back([this] {
        {
          GateRound round(gate, true);
          cudaFree(nullptr);  // the runtime makes the primary context current on this thread
        }
        while (!stop.load(std::memory_order_relaxed)) {
          GateRound round(gate);
          failures += traffic_round();
        }
      });
  }
  void join() {
    stop = true;
    for (auto &t : ts) t.join();
  }
};

// waitpid with a deadline: a child that does not exit in time is a hang (killed, reported).
int wait_child(pid_t pid, int seconds, bool *hung) {
  *hung = false;
  for (int i = 0; i < seconds * 100; ++i) {
    int st = 0;
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    usleep(10000);
  }
  *hung = true;
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  return st;
}

// The child's side of fork/exec cases: some calls, then a normal exit (its log must be complete).
int child_work() {
  if (cudaFree(nullptr) != cudaSuccess) return 3;
  return traffic_round() == 0 ? 0 : 4;
}

int fork_locks() {
  // Forks from a thread that is not main, while 6 others are inside the shim (between calls under
  // the fork gate): the child must find every shim lock free (pthread_atfork), make calls and
  // exit. On the fake driver, as on the real one, a forked child cannot use the parent's context;
  // it still writes its own log.
  cudaFree(nullptr);
  Busy busy(6);
  int ok = 0, hung = 0;
  std::thread forker([&] {
    for (int i = 0; i < 30; ++i) {
      pid_t pid = busy.gate.fork();
      if (pid == 0) {
        void *q = nullptr;
        (void)cudaMalloc(&q, 4096);
        (void)cuMemFree(0);
        std::exit(0);
      }
      bool h = false;
      const int st = wait_child(pid, 20, &h);
      if (h) ++hung;
      else if (WIFEXITED(st) && WEXITSTATUS(st) == 0) ++ok;
    }
  });
  forker.join();
  busy.join();
  out("children_ok", ok);
  out("children_hung", hung);
  out("parent_failures", busy.failures.load());
  return 0;
}

int fork_exec(const char *how) {
  cudaFree(nullptr);
  Busy busy(3);
  const char *argv[] = {g_self, "child-work", nullptr};
  pid_t pid = -1;
  if (std::strcmp(how, "fork") == 0) {
    pid = busy.gate.fork();  // the shim's fork handler allocates in the child before execv
    if (pid == 0) {
      execv(g_self, const_cast<char **>(argv));
      _exit(127);
    }
  } else if (std::strcmp(how, "vfork") == 0) {
    pid = vfork();
    if (pid == 0) {
      execv(g_self, const_cast<char **>(argv));
      _exit(127);
    }
  } else {
    if (posix_spawn(&pid, g_self, nullptr, nullptr, const_cast<char **>(argv), environ) != 0)
      pid = -1;
  }
  bool hung = false;
  const int st = pid > 0 ? wait_child(pid, 30, &hung) : -1;
  busy.join();
  out("child_pid", pid);
  out("child_hung", hung ? 1 : 0);
  out("child_status", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  out("parent_failures", busy.failures.load());
  return 0;
}

// Children that end with _exit() and _Exit() (Python's os._exit ends multiprocessing's workers so):
// no exit handler runs, and each child's log must still be complete, its one call in it. Then a
// vfork child that ends with _exit() at once (an exec that failed): it runs in the parent's memory
// and must write nothing; the parent's log stays its own.
int quick_exit_children() {
  cudaFree(nullptr);
  for (int k = 0; k < 2; ++k) {
    const pid_t pid = fork();
    if (pid == 0) {
      void *q = nullptr;
      (void)cudaMalloc(&q, 4096);  // a forked child's: refused, as on the real driver
      if (k == 0) _exit(5);
      _Exit(6);
    }
    bool hung = false;
    const int st = pid > 0 ? wait_child(pid, 30, &hung) : -1;
    out(k == 0 ? "_exit_status" : "_Exit_status",
        hung ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  const pid_t v = vfork();
  if (v == 0) _exit(7);
  bool hung = false;
  const int st = v > 0 ? wait_child(v, 30, &hung) : -1;
  out("vfork_status", hung ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  void *p = nullptr;
  out("parent_after", cudaMalloc(&p, 8192) == cudaSuccess && cudaFree(p) == cudaSuccess);
  return 0;
}

// _exit() while three threads keep calling (the log's lock taken and given back all the time): the
// buffered records, the counters and `end` must still come last, whole, after every record.
int quick_exit_busy() {
  cudaFree(nullptr);
  Busy busy(3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::fflush(stdout);
  _exit(0);
}

int child_fds() {
  // Descriptors an exec'd child inherited: the parent's event log must not be one of them.
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  while (dirent *e = d ? readdir(d) : nullptr) {
    if (e->d_name[0] == '.') continue;
    char link[300], target[512];
    std::snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(link, target, sizeof target - 1);
    target[k > 0 ? k : 0] = 0;
    std::printf("fd %s %s\n", e->d_name, target);
    ++n;
  }
  if (d) closedir(d);
  return 0;
}

int exec_fds() {
  cudaFree(nullptr);
  traffic_round();  // the log is open now
  const char *argv[] = {g_self, "child-fds", nullptr};
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execv(g_self, const_cast<char **>(argv));
    _exit(127);
  }
  bool hung = false;
  wait_child(pid, 30, &hung);
  return 0;
}

int exit_thread() {
  // exit() from one thread while others are inside the shim: atexit handlers and library
  // destructors (the shim's exit summary among them) run while calls are still arriving.
  cudaFree(nullptr);
  Busy *busy = new Busy(6);  // never joined: exit() ends the process under it
  (void)busy;
  std::thread([] {
    usleep(50000);
    std::fflush(stdout);
    std::exit(0);
  }).detach();
  for (;;) pause();
}

// A global object whose destructor frees CUDA memory after main() returns, as framework
// singletons do (PyTorch's caching allocator, NCCL's communicators).
struct LateFree {
  void *p = nullptr;
  CUmemGenericAllocationHandle h = 0;
  CUdeviceptr v = 0;
  bool armed = false;
  ~LateFree() {
    if (!armed) return;
    const cudaError_t a = cudaFree(p);
    const cudaError_t b = cudaFree(p);  // a double free after main: still understood
    const CUresult c = cuMemUnmap(v, 2 << 20);
    const CUresult d = cuMemRelease(h);
    const CUresult e = cuMemAddressFree(v, 2 << 20);
    std::printf("late.free %d\nlate.double_free %d\nlate.unmap %d\nlate.release %d\nlate.addrfree %d\n",
                a, b, c, d, e);
    std::fflush(stdout);
  }
} g_late;

int static_dtor() {
  if (cudaMalloc(&g_late.p, 1 << 20) != cudaSuccess) return 2;
  CUmemAllocationProp pr = device_prop();
  if (cuMemCreate(&g_late.h, 2 << 20, &pr, 0) != CUDA_SUCCESS) return 2;
  if (cuMemAddressReserve(&g_late.v, 2 << 20, 0, 0, 0) != CUDA_SUCCESS) return 2;
  if (cuMemMap(g_late.v, 2 << 20, 0, g_late.h, 0) != CUDA_SUCCESS) return 2;
  g_late.armed = true;
  out("main_done", 1);
  return 0;
}

int spin() {
  // Writes events as fast as it can until killed (run_life.py sends SIGTERM or SIGKILL).
  cudaFree(nullptr);
  Busy busy(4);
  std::printf("spinning\n");
  std::fflush(stdout);
  for (;;) pause();
}

int idle() {
  // One call, then nothing until killed (run_life.py sends SIGKILL): whatever the shim keeps in
  // memory is lost, and its header must already be on disk.
  cudaFree(nullptr);
  std::printf("idle\n");
  std::fflush(stdout);
  for (;;) pause();
}

// A real fault, not undefined behaviour a sanitizer would report first: a store to a page that
// exists and may not be written. The address and the thread are printed for the harness to find
// in the crash record.
__attribute__((noinline)) void fault() {
  void *page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  std::printf("fault_addr %llu\nfault_tid %ld\n",
              static_cast<unsigned long long>(reinterpret_cast<std::uintptr_t>(page)),
              static_cast<long>(syscall(SYS_gettid)));
  std::fflush(stdout);
  *static_cast<volatile int *>(page) = 1;
}

int crash(const char *how, bool own_handler) {
  cudaFree(nullptr);
  traffic_round();
  void *leak = nullptr;
  cudaMalloc(&leak, 3 << 20);  // live at the crash: the summary counts it
  void *p = nullptr;
  cudaMalloc(&p, 4096);
  cudaFree(p);
  cudaFree(p);  // a finding before the crash
  if (own_handler) {
    // A handler installed after the first CUDA call replaces the shim's: the program's own
    // behaviour wins.
    struct sigaction sa {};
    sa.sa_handler = [](int) {
      static const char m[] = "own handler\n";
      ssize_t w = write(1, m, sizeof m - 1);
      (void)w;
      _exit(3);
    };
    sigaction(std::strcmp(how, "abort") == 0 ? SIGABRT : SIGSEGV, &sa, nullptr);
  }
  std::printf("crashing\n");
  std::fflush(stdout);
  if (std::strcmp(how, "abort") == 0) std::abort();
  if (std::strcmp(how, "thread") == 0) {
    Busy busy(3);
    std::thread(fault).join();
  }
  fault();
  return 0;
}

// A SIGTERM handler that calls exit(), as many servers have, while threads allocate: the signal
// is sent to one of them, so the exit handlers (the shim's exit summary among them) run on a
// thread interrupted wherever it was, inside the shim's locks included.
int sigterm_exit() {
  struct sigaction sa {};
  sa.sa_handler = [](int) { std::exit(0); };
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  cudaFree(nullptr);
  // Each round writes a finding, which the log writes through at once: the threads spend much of
  // their time inside the log's lock, where the signal finds them often.
  std::vector<std::thread> *ts = new std::vector<std::thread>;  // never joined
  for (int i = 0; i < 4; ++i)
    ts->emplace_back([] {
      cudaFree(nullptr);
      for (;;) {
        void *p = nullptr;
        if (cudaMalloc(&p, 4096) != cudaSuccess) continue;
        cudaFree(p);
        cudaFree(p);  // a double free: a finding record
      }
    });
  usleep(100000);
  std::fflush(stdout);
  pthread_kill((*ts)[0].native_handle(), SIGTERM);
  for (;;) pause();
}

// About 2,000 calls, then nothing until killed (run_life.py kills it 2 s later): every call must
// be in the log by then, though no later record came to flush the buffer.
int idle_calls() {
  cudaFree(nullptr);
  int bad = 0;
  for (int i = 0; i < 1000; ++i) {
    void *p = nullptr;
    if (cudaMalloc(&p, 4096) != cudaSuccess || cudaFree(p) != cudaSuccess) ++bad;
  }
  out("calls", 2001);
  out("failures", bad);
  std::printf("idle\n");
  std::fflush(stdout);
  for (;;) pause();
}

// Calls that fail (FAKECUDA_FAIL from run_life.py): out-of-memory twice, an illegal address, and
// an invalid free through the runtime. Each distinct status is a `cuda_error` record, once.
int errors() {
  cudaFree(nullptr);
  CUdeviceptr a = 0, b = 0, c = 0;
  out("alloc1", cuMemAlloc(&a, 4096));
  out("alloc2", cuMemAlloc(&b, 4096));
  out("alloc3", cuMemAlloc(&c, 4096));
  out("free1", cuMemFree(a));
  out("free2", cuMemFree(a));
  out("rt_free", cudaFree(reinterpret_cast<void *>(0x1234)));
  return 0;
}

// Calls CUDA, then runs another program (argv[2..]) in a child that execs it: each writes its own
// log, named after the program it is (CUMEMGUARD_LOG with %e).
int exec_other(char **argv) {
  cudaFree(nullptr);
  traffic_round();
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execv(argv[0], argv);
    _exit(127);
  }
  bool hung = false;
  const int st = wait_child(pid, 30, &hung);
  out("child_pid", pid);
  out("child_status", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  return 0;
}

int handler_first() {
  // A program that installed its own SIGSEGV handler before its first CUDA call keeps it.
  struct sigaction sa {};
  sa.sa_handler = [](int) {
    static const char m[] = "own handler\n";
    ssize_t w = write(1, m, sizeof m - 1);
    (void)w;
    _exit(3);
  };
  sigaction(SIGSEGV, &sa, nullptr);
  cudaFree(nullptr);
  traffic_round();
  struct sigaction now {};
  sigaction(SIGSEGV, nullptr, &now);
  out("handler_kept", now.sa_handler == sa.sa_handler ? 1 : 0);
  std::fflush(stdout);
  fault();
  return 0;
}

// A finding in a forked child, the parent clean (the launcher's status channel): the child frees
// its parent's allocation, which is not the child's to free (CUDA is not fork-safe: the driver
// refuses, and the shim reports an invalid free). The child ends as `how` says: "exit" returns
// normally, "kill" SIGKILLs itself right after the finding (no exit path runs: the count must
// already be where the launcher reads it).
int fork_finding(const char *how) {
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));  // the parent is active and has its log open
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    if (cudaFree(p) == cudaSuccess) _exit(3);
    if (std::strcmp(how, "kill") == 0) raise(SIGKILL);
    std::exit(0);
  }
  bool hung = false;
  const int st = wait_child(pid, 30, &hung);
  out("child_status", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  out("free", cudaFree(p));
  return 0;
}

// Opens the log (one call), says "ready", waits for a byte on stdin, then frees twice: the
// harness starts two of these on one log name and lets them go only when both hold their logs.
int finding_on_cue() {
  cudaFree(nullptr);
  std::printf("ready %ld\n", static_cast<long>(getpid()));
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) < 0 && errno == EINTR) {
  }
  void *p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, 4096));
  (void)cudaFree(p);
  out("second_free", cudaFree(p));
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  g_self = argv[0];
  if (argc < 2) {
    std::fprintf(stderr, "usage: life_cases CASE\n");
    return 64;
  }
  const std::string c = argv[1];
  if (c == "fork-locks") return fork_locks();
  if (c == "fork-exec") return fork_exec("fork");
  if (c == "vfork-exec") return fork_exec("vfork");
  if (c == "posix-spawn") return fork_exec("spawn");
  if (c == "child-work") return child_work();
  if (c == "exec-fds") return exec_fds();
  if (c == "child-fds") return child_fds();
  if (c == "exit-thread") return exit_thread();
  if (c == "quick-exit") return quick_exit_children();
  if (c == "quick-exit-busy") return quick_exit_busy();
  if (c == "static-dtor") return static_dtor();
  if (c == "spin") return spin();
  if (c == "idle") return idle();
  if (c == "crash-segv") return crash("segv", false);
  if (c == "crash-abort") return crash("abort", false);
  if (c == "crash-thread") return crash("thread", false);
  if (c == "crash-own-handler") return crash("segv", true);
  if (c == "handler-first") return handler_first();
  if (c == "sigterm-exit") return sigterm_exit();
  if (c == "idle-calls") return idle_calls();
  if (c == "errors") return errors();
  if (c == "exec-other" && argc > 2) return exec_other(argv + 2);
  if (c == "fork-finding") return fork_finding("exit");
  if (c == "finding-on-cue") return finding_on_cue();
  if (c == "fork-finding-kill") return fork_finding("kill");
  std::fprintf(stderr, "unknown case %s\n", argv[1]);
  return 64;
}
