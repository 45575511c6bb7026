// SPDX-License-Identifier: Apache-2.0
// VMM calls in flight: see in_flight.h.
#include "in_flight.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <vector>

namespace cmg {
namespace in_flight_detail {
thread_local __attribute__((tls_model("initial-exec"))) std::size_t t_slot = 0;
thread_local __attribute__((tls_model("initial-exec"))) unsigned t_depth = 0;
}  // namespace in_flight_detail

using in_flight_detail::t_depth;
using in_flight_detail::t_slot;

void InFlightCalls::wake() {
  std::lock_guard lk(mu_);
  cv_.notify_all();
}

InFlightCalls::Mark InFlightCalls::mark() const {
  Mark m;
  const std::size_t mine = t_slot ? t_slot - 1 : kSlots;
  // Only the slots handed out so far: a thread given one later had made no call at this mark, and
  // the next mark sees its slot (the count of events grows, the window is not quiet).
  const std::size_t used = std::min(next_slot_.load(std::memory_order_acquire), kSlots);
  for (std::size_t i = 0; i < used; ++i) {
    const std::uint64_t v = slots_[i].v.load(std::memory_order_seq_cst);
    m.events += v;
    if (i != mine) m.others |= (v & 1) != 0;
  }
  const std::uint64_t e = shared_entered_.load(std::memory_order_seq_cst);
  const std::uint64_t l = shared_left_.load(std::memory_order_seq_cst);
  m.events += e + l;
  const std::uint64_t own = mine >= kSlots && t_depth ? 1 : 0;
  m.others |= e > l + own;
  return m;
}

std::size_t InFlightCalls::in_flight() const {
  std::size_t n = 0;
  for (const Slot &s : slots_) n += s.v.load(std::memory_order_acquire) & 1;
  const std::uint64_t e = shared_entered_.load(), l = shared_left_.load();
  return n + static_cast<std::size_t>(e > l ? e - l : 0);
}

bool InFlightCalls::settle(std::uint64_t timeout_ns) {
  // Who is in flight now: each slot's odd value, and the shared count entered so far. The calling
  // thread's own call (a release that waits, having noted nothing) is not in flight while it
  // waits: two releases waiting at once must not wait for each other.
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  const std::size_t mine = t_slot ? t_slot - 1 : kSlots;
  const bool own = mine < kSlots && t_depth && (slots_[mine].v.load() & 1);
  if (own) slots_[mine].v.store(slots_[mine].v.load(std::memory_order_relaxed) + 1);
  std::array<std::uint64_t, kSlots> seen{};
  bool any = false;
  for (std::size_t i = 0; i < kSlots; ++i) {
    seen[i] = i == mine ? 0 : slots_[i].v.load(std::memory_order_seq_cst);
    any |= (seen[i] & 1) != 0;
  }
  const std::uint64_t shared_target =
      shared_entered_.load(std::memory_order_seq_cst) - (mine >= kSlots && t_depth ? 1 : 0);
  any |= shared_left_.load(std::memory_order_seq_cst) < shared_target;
  if (any) {
    auto done = [&] {
      for (std::size_t i = 0; i < kSlots; ++i)
        if ((seen[i] & 1) && slots_[i].v.load(std::memory_order_acquire) == seen[i]) return false;
      // Threads past the slots share a count: those in flight now have left once as many
      // left as had entered (a later one may stand in for an earlier: bounded by the time).
      return shared_left_.load(std::memory_order_acquire) >= shared_target;
    };
    std::unique_lock lk(mu_);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeout_ns);
    // Woken by leave(); the wait is in slices so that a wake-up raced past is a delay, not a hang.
    while (!done() && std::chrono::steady_clock::now() < deadline)
      cv_.wait_for(lk, std::chrono::milliseconds(1));
  }
  if (own) slots_[mine].v.store(slots_[mine].v.load(std::memory_order_relaxed) + 1);
  waiters_.fetch_sub(1, std::memory_order_seq_cst);
  return any;
}

void InFlightCalls::fork_child() {
  // The other threads are gone, and so are their calls; the forking thread's own stays as it is
  // (it leaves it as usual).
  const std::size_t mine = t_slot ? t_slot - 1 : kSlots;
  for (std::size_t i = 0; i < kSlots; ++i)
    if (i != mine)
      slots_[i].v.store(slots_[i].v.load(std::memory_order_relaxed) & ~std::uint64_t{1});
  shared_left_.store(shared_entered_.load() - (mine >= kSlots && t_depth ? 1 : 0));
  waiters_.store(0);
  new (&mu_) std::mutex();
  new (&cv_) std::condition_variable();
}

}  // namespace cmg
