// SPDX-License-Identifier: Apache-2.0
// The shim's own threads (the log's flusher, the snapshot thread, the bridge's broker): detached,
// so they never keep the process alive and exit never waits for them, and started with every signal
// blocked, so that the program's handlers run on the program's threads only.
//
// A thread still starting when the program forks may hold a lock of the allocator in the child for
// good: a sanitizer's runtime allocates in a new thread's set-up (GCC 12's AddressSanitizer:
// AsanThread::Init -> pthread_getattr_np -> calloc, under the size class's region mutex) and does
// not reset its locks in a forked child, so the child's next allocation of that class — the
// snapshot thread the child starts, for one — waited forever. fork waits (bounded) until every
// thread the shim started has run past its set-up.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <new>

namespace cmg::shim {

// Threads created and not yet past their set-up (their body not yet entered).
inline std::atomic<int> g_threads_starting{0};
// Held by a start (the count and pthread_create) and by fork's prepare handler, taken there last:
// a start that began after fork looked at the count would otherwise be missed (the flusher starts
// under the log's lock, the snapshot thread under activation's, the broker under its own; each
// is taken before this one, in fork's order too).
inline std::mutex g_start_mu;

namespace threads_detail {
// What a starting thread runs, in a fixed slot rather than on the heap: a thread may be started on
// the exit path (the log's first record written there), where the shim allocates nothing.
struct Start {
  std::atomic<bool> busy{false};
  void *(*fn)(void *) = nullptr;
  void *arg = nullptr;
  const char *name = nullptr;
};
inline Start g_slots[8];  // the shim starts three kinds of thread, each once per process
inline void *trampoline(void *p) {
  Start &slot = *static_cast<Start *>(p);
  void *(*fn)(void *) = slot.fn;
  void *arg = slot.arg;
  pthread_setname_np(pthread_self(), slot.name);  // named before fork can go on: tests see it
  slot.busy.store(false, std::memory_order_release);
  g_threads_starting.fetch_sub(1, std::memory_order_release);
  return fn(arg);
}
}  // namespace threads_detail

// pthread_create's status (0 on success). `name` (at most 15 characters, a literal) is the
// thread's name in /proc/PID/task/TID/comm, set before the body runs.
inline int start_detached_quiet(void *(*fn)(void *), void *arg, const char *name) {
  threads_detail::Start *slot = nullptr;
  for (auto &s : threads_detail::g_slots) {
    bool idle = false;
    if (s.busy.compare_exchange_strong(idle, true, std::memory_order_acq_rel)) {
      slot = &s;
      break;
    }
  }
  if (!slot) return EAGAIN;
  slot->fn = fn;
  slot->arg = arg;
  slot->name = name;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  int rc;
  {
    std::lock_guard lk(g_start_mu);
    g_threads_starting.fetch_add(1, std::memory_order_acq_rel);
    rc = pthread_create(&t, &attr, threads_detail::trampoline, slot);
    if (rc != 0) {
      g_threads_starting.fetch_sub(1, std::memory_order_release);
      slot->busy.store(false, std::memory_order_release);
    }
  }
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return rc;
}

// In fork's prepare handler, after every other lock of the shim: no start can begin now, and each
// one begun has its thread created; a thread starts in microseconds (it takes no lock of ours),
// one the scheduler holds back longer is waited for up to 2 s, then the fork goes on as it would
// have.
inline void threads_fork_prepare() {
  g_start_mu.lock();
  timespec now{}, end{};
  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += 2;
  const timespec step{0, 100'000};
  while (g_threads_starting.load(std::memory_order_acquire) > 0) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec)) break;
    nanosleep(&step, nullptr);
  }
}
inline void threads_fork_parent() { g_start_mu.unlock(); }

// In a forked child: the parent's starting threads are not in it, nor are their slots in use.
// The start lock is given back by the thread that took it in the prepare handler (the child's
// only thread), not made anew: ThreadSanitizer, which sees no placement new, still counted it as
// held, and the child's next lock of it, or the loader's lock in its own fork, was a double lock or
// a lock-order inversion that ended the child (status 66) before its records were written.
inline void threads_fork_child() {
  g_start_mu.unlock();
  g_threads_starting.store(0, std::memory_order_relaxed);
  for (auto &s : threads_detail::g_slots) s.busy.store(false, std::memory_order_relaxed);
}

}  // namespace cmg::shim
