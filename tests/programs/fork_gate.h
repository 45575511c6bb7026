// SPDX-License-Identifier: Apache-2.0
// ForkGate: lets the test programs that fork while other threads make CUDA calls run under a
// memory allocator that is not fork-safe. The AddressSanitizer runtimes of gcc 12 and clang 14
// install no fork handler for their own allocator: a child forked while another thread held one
// of its size-class locks waits on that lock forever at its next malloc (a hung child's stack ends
// in SizeClassAllocator64::GetFromAllocator). Even a child that only execs allocates first, in
// the shim's fork handler. The lock is the runtime's own, which no fork handler of the shim can
// take, so the AddressSanitizer runs set CMG_TEST_FORK_GATE (tests/meson.build) and the threads
// that make calls park between calls while fork() runs; without it (normal and ThreadSanitizer
// builds, whose allocators are fork-safe) fork() lands wherever they are, inside the shim's locks
// included.
#pragma once

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

inline bool fork_gate_on() { return std::getenv("CMG_TEST_FORK_GATE") != nullptr; }

class ForkGate {
 public:
  // workers: how many threads will make calls. A thread's start-up allocates too (its C++ and
  // sanitizer thread state), so fork() first waits until each has entered once.
  explicit ForkGate(int workers) : workers_(workers) {}

  // A thread that makes calls brackets each round with enter()/leave(), first=true the first time.
  void enter(bool first) {
    if (!on_) return;
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return !closed_; });
    ++inside_;
    if (first) ++arrived_;
  }
  void leave() {
    if (!on_) return;
    std::lock_guard lk(m_);
    --inside_;
    cv_.notify_all();
  }
  // fork(), after every thread between enter() and leave() has left, when the gate is on.
  pid_t fork() {
    if (!on_) return ::fork();
    std::unique_lock lk(m_);
    cv_.wait(lk, [&] { return arrived_ == workers_; });
    closed_ = true;
    cv_.wait(lk, [&] { return inside_ == 0; });
    const pid_t pid = ::fork();
    closed_ = false;
    lk.unlock();
    if (pid != 0) cv_.notify_all();  // the child has no waiters: the threads stayed in the parent
    return pid;
  }

 private:
  const bool on_ = fork_gate_on();
  const int workers_;
  std::mutex m_;
  std::condition_variable cv_;
  bool closed_ = false;
  int inside_ = 0;
  int arrived_ = 0;
};

// Brackets one round of a calling thread; `first` for the thread's first round.
class GateRound {
 public:
  GateRound(ForkGate &g, bool first = false) : g_(g) { g_.enter(first); }
  ~GateRound() { g_.leave(); }
  GateRound(const GateRound &) = delete;
  GateRound &operator=(const GateRound &) = delete;

 private:
  ForkGate &g_;
};

// fork() once the thread named `comm` (one the program does not control, like the shim's IPC
// broker, which allocates as it starts and serves) is blocked in poll, when the gate is on; at
// most 5 s of waiting. A process without such a thread forks at once.
inline pid_t fork_when_blocked(const char *comm) {
  if (!fork_gate_on()) return ::fork();
  for (int tries = 0; tries < 5000; ++tries) {
    bool found = false, blocked = false;
    if (DIR *d = opendir("/proc/self/task")) {
      while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        const std::string task = std::string("/proc/self/task/") + e->d_name;
        char name[32] = {}, sys[32] = {};
        if (FILE *f = std::fopen((task + "/comm").c_str(), "r")) {
          if (!std::fgets(name, sizeof name, f)) name[0] = 0;
          std::fclose(f);
        }
        name[std::strcspn(name, "\n")] = 0;
        if (std::strcmp(name, comm) != 0) continue;
        found = true;
        if (FILE *f = std::fopen((task + "/syscall").c_str(), "r")) {
          if (!std::fgets(sys, sizeof sys, f)) sys[0] = 0;
          std::fclose(f);
        }
        const long nr = std::strtol(sys, nullptr, 10);  // the system call it is blocked in
        blocked = nr == SYS_poll || nr == SYS_ppoll;
      }
      closedir(d);
    }
    if (!found || blocked) break;
    usleep(1000);
  }
  return ::fork();
}
