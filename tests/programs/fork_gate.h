// SPDX-License-Identifier: Apache-2.0
// ForkGate: lets the test programs that fork while other threads make CUDA calls run under a
// memory allocator that is not fork-safe. gcc 12's AddressSanitizer runtime takes no lock of its
// own allocator around fork() (later LLVM runtimes do): a child forked while another thread held
// one of its size-class locks waits on that lock forever at its next malloc (seen as
// SizeClassAllocator64::GetFromAllocator in the hung child). The shim and glibc's malloc are not
// involved, so the sanitized runs set CMG_TEST_FORK_GATE and the threads that make calls park
// between calls while fork() runs; without it (normal and ThreadSanitizer builds) fork() lands
// wherever they are, inside the shim's locks included.
#pragma once

#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <mutex>

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
  const bool on_ = std::getenv("CMG_TEST_FORK_GATE") != nullptr;
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
