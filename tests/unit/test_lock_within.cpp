// SPDX-License-Identifier: Apache-2.0
// The exit path's locks and visits (policy/lock_within.h, fn_ref.h): a lock the calling thread
// holds itself is given up at once, a bounded wait that ran out is remembered, and the models are
// visited in place without allocating. The waits are proven by their result with a patience far
// beyond the test's time limit: a wait that happened would show as a timeout, not as a slow pass.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "fn_ref.h"
#include "lock_within.h"
#include "tracker.h"

using namespace cmg;

namespace {

// Allocations made by this thread while counting (the global operator new of this test binary).
thread_local bool t_counting = false;
thread_local long t_allocations = 0;

constexpr std::uint64_t kForever = 3'600'000'000'000;  // an hour: never reached in a passing run

// Holds a mutex on another thread until told to let go.
template <class Mutex>
struct Holder {
  Mutex &m;
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false, release = false;
  std::thread t;
  explicit Holder(Mutex &mm) : m(mm) {
    t = std::thread([this] {
      // m before mu, always: the wait below takes mu again while m is held, and the opposite
      // order first is a lock-order inversion to ThreadSanitizer.
      m.lock();
      std::unique_lock lk(mu);
      holding = true;
      cv.notify_all();
      cv.wait(lk, [this] { return release; });
      m.unlock();
    });
    std::unique_lock lk(mu);
    cv.wait(lk, [this] { return holding; });
  }
  ~Holder() {
    {
      std::lock_guard lk(mu);
      release = true;
    }
    cv.notify_all();
    t.join();
  }
};

}  // namespace

void *operator new(std::size_t n) {
  if (t_counting) ++t_allocations;
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
// The nothrow form too (Catch2 allocates its test invokers with it): a sanitizer's own nothrow
// new paired with the free above is an alloc-dealloc mismatch to AddressSanitizer.
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  if (t_counting) ++t_allocations;
  return std::malloc(n ? n : 1);
}
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }

TEST_CASE("A MarkedMutex knows its holder") {
  MarkedMutex m;
  CHECK_FALSE(m.held_here());
  m.lock();
  CHECK(m.held_here());
  bool elsewhere = true;
  std::thread([&] { elsewhere = m.held_here(); }).join();
  CHECK_FALSE(elsewhere);
  m.unlock();
  CHECK_FALSE(m.held_here());
  REQUIRE(m.try_lock());
  CHECK(m.held_here());
  m.unlock();
}

TEST_CASE("A MarkedMutex excludes, and wakes the threads that wait for it") {
  MarkedMutex m;
  // Held by another thread: try_lock fails, and a waiting lock() sleeps until it is given back.
  std::atomic<int> phase{0};
  std::thread holder([&] {
    m.lock();
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    m.unlock();
  });
  while (phase.load() != 1) std::this_thread::yield();
  CHECK_FALSE(m.try_lock());
  phase.store(2);
  m.lock();  // returns only once the holder gave it back (a lost wake-up would hang here)
  CHECK(m.held_here());
  m.unlock();
  holder.join();
  // Contended by four threads: no increment is lost, and every waiter is woken.
  long n = 0;
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        m.lock();
        n = n + 1;
        m.unlock();
      }
    });
  for (auto &t : ts) t.join();
  CHECK(n == long{kThreads} * kEach);
  CHECK(m.try_lock());
  m.unlock();
}

TEST_CASE("An exit path never waits on a lock its own thread holds") {
  exit_wait_reset();
  MarkedMutex m;
  m.lock();  // as a thread a signal handler interrupted inside the lock, then called exit()
  CHECK_FALSE(lock_within(m, kForever));
  // Not a give-up: another thread's lock is still waited for.
  CHECK_FALSE(exit_wait_gave_up());
  m.unlock();
  REQUIRE(lock_within(m, kForever));
  m.unlock();
}

TEST_CASE("After one bounded wait ran out, exit paths try each lock once") {
  exit_wait_reset();
  MarkedMutex a, b;
  {
    Holder<MarkedMutex> ha(a), hb(b);
    CHECK_FALSE(lock_within(a, 1'000'000));  // 1 ms, then given up
    CHECK(exit_wait_gave_up());
    CHECK_FALSE(lock_within(b, kForever));  // one try: the give-up is remembered
  }
  // A free lock is still taken (one try suffices).
  REQUIRE(lock_within(b, kForever));
  b.unlock();
  exit_wait_reset();
  CHECK_FALSE(exit_wait_gave_up());
}

TEST_CASE("FnRef calls the callable it refers to, without copying it") {
  int calls = 0, sum = 0;
  long a = 1, b = 2, c = 3, d = 4;  // more captures than std::function keeps inline
  auto f = [&](int v) {
    ++calls;
    sum += v + static_cast<int>(a + b + c + d);
  };
  t_allocations = 0;
  t_counting = true;
  FnRef<void(int)> r(f);
  r(1);
  r(2);
  t_counting = false;
  CHECK(calls == 2);
  CHECK(sum == 1 + 10 + 2 + 10);
  CHECK(t_allocations == 0);
}

TEST_CASE("The models are visited at exit in place, allocating nothing") {
  LinearModel lin;
  for (std::uint64_t i = 0; i < 500; ++i)
    lin.on_alloc(LinearRec{0x100000 + i * 0x1000, 4096, 0,
                           i % 2 ? MemKind::Linear : MemKind::Host, EventRef{i + 1}});
  ByteCounters counters;
  VmmModel vmm{counters};
  ThreadVmmState ts;
  for (std::uint64_t i = 0; i < 20; ++i) {
    vmm.on_create(0x5000 + i, 2 << 20, Location::Device, 0, 1, false, EventRef{1000 + i}, ts);
    vmm.on_reserve(0x7f0000000000 + i * (4 << 20), 4 << 20, EventRef{2000 + i}, ts);
  }
  // Visitors that capture as much as the exit summary's do (more than std::function keeps inline).
  std::size_t n[kMemKinds] = {};
  std::uint64_t bytes = 0, seen_phys = 0, seen_res = 0, phys_bytes = 0, va_bytes = 0, last = 0;
  VmmCounts vc;
  t_allocations = 0;
  t_counting = true;
  const std::size_t skipped = lin.for_each_live_within(
      [&](const LinearRec &r) {
        ++n[static_cast<std::size_t>(r.kind)];
        bytes += r.size;
        last = r.ptr;
      },
      kExitPatienceNs);
  const bool whole = vmm.visit_within(
      kExitPatienceNs,
      [&](const PhysAlloc &a) {
        ++seen_phys;
        phys_bytes += a.size;
        last = a.size;
      },
      [&](const Reservation &r) {
        ++seen_res;
        va_bytes += r.size;
        last = r.base;
      },
      vc);
  t_counting = false;
  CHECK(t_allocations == 0);
  CHECK(skipped == 0);
  CHECK(n[static_cast<std::size_t>(MemKind::Linear)] == 250);
  CHECK(n[static_cast<std::size_t>(MemKind::Host)] == 250);
  CHECK(bytes == 500 * 4096);
  REQUIRE(whole);
  CHECK(seen_phys == 20);
  CHECK(seen_res == 20);
  CHECK(phys_bytes == 20 * (2 << 20));
  CHECK(va_bytes == 20 * (4 << 20));
  CHECK(last != 0);
  CHECK(vc.phys == 20);
  CHECK(vc.reservations == 20);
}

TEST_CASE("A shard or model the exiting thread holds is left out at once") {
  exit_wait_reset();
  LinearModel lin;
  lin.on_alloc(LinearRec{0x1000, 4096, 0, MemKind::Linear, EventRef{1}});
  // The shard of 0x1000 held by this thread: the visit goes on without it, with no wait.
  std::size_t visited = 0;
  // Held through the model's own lock: a visit from inside a visit of the same shard.
  lin.for_each_live([&](const LinearRec &) {
    const std::size_t skipped =
        lin.for_each_live_within([&](const LinearRec &) { ++visited; }, kForever);
    CHECK(skipped == 1);
  });
  CHECK(visited == 0);
  CHECK_FALSE(exit_wait_gave_up());
}

TEST_CASE("The futex lock excludes: four threads' increments under contention all count") {
  FutexLock mu;
  long count = 0;  // guarded by mu only: a lost exclusion shows as a short count (and to TSan)
  constexpr int kThreads = 4, kEach = 50'000;
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads; ++i)
    ts.emplace_back([&] {
      for (int j = 0; j < kEach; ++j) {
        std::lock_guard lk(mu);
        ++count;
        if (j % 1000 == 0) std::this_thread::yield();  // a holder descheduled: waiters sleep
      }
    });
  for (auto &t : ts) t.join();
  CHECK(count == static_cast<long>(kThreads) * kEach);
  CHECK(mu.try_lock());
  CHECK_FALSE(mu.try_lock());  // held: refused, not re-entered
  mu.unlock();
  CHECK(mu.try_lock());
  mu.reset();  // a forked child's copy: free
  CHECK(mu.try_lock());
  mu.unlock();
}
