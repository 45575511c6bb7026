// SPDX-License-Identifier: Apache-2.0
// Locks for exit and signal paths. A SIGTERM handler that calls exit() (many servers have one) runs
// the exit handlers on the thread it interrupted, possibly inside one of our locks, which that
// thread then never gives back: an exit path that waits for it waits forever. So the locks an exit
// path takes know their holder (MarkedMutex: the exiting thread never waits on a lock it holds
// itself), exit paths try the others for a bounded time, and the first wait that runs out is
// remembered: a thread that did not give one lock back in half a second is not coming back, and
// the later parts of the exit path try each lock once instead of waiting again
// (docs/reliability.md).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <new>

namespace cmg {

// How long an exit path waits for one lock: a thread that is running holds any of ours for
// microseconds, so a lock still taken after this belongs to a thread that will not come back
// (half a second: a holder descheduled on a loaded machine, under ThreadSanitizer, is back by
// then).
inline constexpr std::uint64_t kExitPatienceNs = 500'000'000;

// Which thread this is: the address of a thread-local byte (no call, no system call; usable from
// a signal handler). Initial-exec: the shim is preloaded, and its TLS is in the static block.
inline const void *this_thread_mark() {
  static thread_local __attribute__((tls_model("initial-exec"))) char mark;
  return &mark;
}

// A mutex in one futex word: 0 free, 1 held, 2 held and maybe waited for. Taking and giving
// back a free one is one atomic instruction each; pthread_mutex_lock and unlock cost some 50
// instructions together, and every intercepted call takes a model's lock once or twice. A waiter
// sleeps in the kernel as with pthread's default mutex (no spinning: the machine may have fewer
// cores than threads). The acquire and release orders are what ThreadSanitizer follows.
class FutexLock {
 public:
  void lock() {
    int c = 0;
    if (v_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed))
        [[likely]]
      return;
    lock_contended();
  }
  bool try_lock() {
    int c = 0;
    return v_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() {
    if (v_.exchange(0, std::memory_order_release) == 2) [[unlikely]]
      futex(FUTEX_WAKE_PRIVATE, 1);
  }
  // fork(): the child's copy is free (its holder, if any, is not in the child).
  void reset() { v_.store(0, std::memory_order_relaxed); }

 private:
  // Marks the word as waited for; whoever gives it back then wakes one waiter, which marks it
  // again when it takes it (another waiter may still sleep).
  void lock_contended() {
    while (v_.exchange(2, std::memory_order_acquire) != 0) futex(FUTEX_WAIT_PRIVATE, 2);
  }
  void futex(int op, int val) {
    static_assert(sizeof(std::atomic<int>) == sizeof(int));
    syscall(SYS_futex, reinterpret_cast<int *>(&v_), op, val, nullptr, nullptr, 0);
  }
  std::atomic<int> v_{0};
};

// A mutex that knows which thread holds it (two relaxed stores per lock and unlock, on the cache
// line the lock itself writes).
class MarkedMutex {
 public:
  void lock() {
    mu_.lock();
    owner_.store(this_thread_mark(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!mu_.try_lock()) return false;
    owner_.store(this_thread_mark(), std::memory_order_relaxed);
    return true;
  }
  void unlock() {
    owner_.store(nullptr, std::memory_order_relaxed);
    mu_.unlock();
  }
  // True when this thread holds it (a signal handler interrupted it inside and called exit()).
  bool held_here() const { return owner_.load(std::memory_order_relaxed) == this_thread_mark(); }
  // fork(): the child's copy is free and held by nobody (the parent's holder is not in the child).
  void reset_in_child() {
    mu_.reset();
    owner_.store(nullptr, std::memory_order_relaxed);
  }

 private:
  FutexLock mu_;
  std::atomic<const void *> owner_{nullptr};
};

// Set by the first bounded wait of an exit path that ran out: from then on every exit path tries
// once. A forked child starts over (exit_wait_reset).
inline std::atomic<bool> g_exit_wait_gave_up{false};
inline void exit_wait_reset() {
  g_exit_wait_gave_up.store(false, std::memory_order_relaxed);
}
inline bool exit_wait_gave_up() {
  return g_exit_wait_gave_up.load(std::memory_order_relaxed);
}

inline void pause_ns(long ns) {
  timespec t{0, ns};
  nanosleep(&t, nullptr);
}

// Takes m within patience_ns (tries, with 200 us pauses), or returns false: at once when this
// thread holds m itself, or when an earlier wait of the exit path ran out.
template <class Mutex>
bool lock_within(Mutex &m, std::uint64_t patience_ns = kExitPatienceNs) {
  if constexpr (requires { m.held_here(); }) {
    if (m.held_here()) return false;
  }
  for (std::uint64_t waited = 0;; waited += 200'000) {
    if (m.try_lock()) return true;
    if (waited >= patience_ns || exit_wait_gave_up()) {
      g_exit_wait_gave_up.store(true, std::memory_order_relaxed);
      return false;
    }
    pause_ns(200'000);
  }
}

}  // namespace cmg
