// SPDX-License-Identifier: Apache-2.0
// VMM calls in flight whose effect the driver and the model hear of at different times: a
// cuMemCreate (or retain, or import) whose driver call handed out a value the model has not heard
// of yet, and a cuMemRelease the model noted before its driver call. In those windows the driver
// holds a value live that the model holds as released — exactly what a value issued again through
// a path the shim does not see looks like. A release the model would skip and the driver says is
// live waits for the calls in flight before it is judged again (vmm_model.h, confirm_ticket).
// Pure C++: each thread marks its own slot with plain stores, and the rare waiter reads them all.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace cmg {

namespace in_flight_detail {
// Per thread: its slot + 1 (0: none yet), and how deep it is in such calls. Initial-exec: the
// shim is preloaded (its TLS is in the static block anyway), and the default model would call
// __tls_get_addr at every access (shim/state.h, CMG_HOT_TLS).
extern thread_local __attribute__((tls_model("initial-exec"))) std::size_t t_slot;
extern thread_local __attribute__((tls_model("initial-exec"))) unsigned t_depth;
}  // namespace in_flight_detail

class InFlightCalls {
 public:
  static constexpr std::size_t kSlots = 128;  // threads beyond share one count

  // The calling thread enters such a call; only its outermost one counts (a create nested in
  // another intercepted call is part of it). Returns whether this call entered. Inline: every
  // create, retain, import and release makes both.
  bool enter() {
    if (in_flight_detail::t_depth++) return false;
    mark(+1);
    return true;
  }
  void leave() {
    if (--in_flight_detail::t_depth) return;
    mark(-1);
    // A waiter is woken; one that raced past this load wakes at its next slice (settle()).
    if (waiters_.load(std::memory_order_relaxed)) [[unlikely]]
      wake();
  }
  // Waits until every such call of another thread in flight now has left, at most timeout_ns.
  // Returns false when none was in flight (nothing to wait for).
  bool settle(std::uint64_t timeout_ns);
  // How many such calls entered or left so far, and whether one of another thread is in flight:
  // a window [mark(), quiet_since()] saw none of them when no other was in flight at its start
  // and none entered or left in it.
  struct Mark {
    std::uint64_t events = 0;
    bool others = false;
  };
  Mark mark() const;
  bool quiet_since(const Mark &m) const { return !m.others && mark().events == m.events; }
  // The number in flight now (tests).
  std::size_t in_flight() const;
  // fork(): the child has none of the parent's other threads.
  void fork_child();

 private:
  struct alignas(64) Slot {
    // Odd while the thread is inside such a call: 2 * (calls so far) + 1.
    std::atomic<std::uint64_t> v{0};
  };
  std::size_t slot_of_thread() {
    std::size_t &t = in_flight_detail::t_slot;
    if (!t) [[unlikely]]
      t = next_slot_.fetch_add(1, std::memory_order_relaxed) + 1;
    return t - 1;
  }
  // One step of this thread's slot (odd: inside), or of the shared counts past the slots.
  void mark(int step) {
    const std::size_t i = slot_of_thread();
    if (i < kSlots) {
      // Only this thread writes its slot: a plain read-modify-write, published with release.
      Slot &s = slots_[i];
      s.v.store(s.v.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    } else {
      (step > 0 ? shared_entered_ : shared_left_).fetch_add(1, std::memory_order_acq_rel);
    }
  }
  void wake();
  std::array<Slot, kSlots> slots_{};
  std::atomic<std::size_t> next_slot_{0};
  std::atomic<std::uint64_t> shared_entered_{0}, shared_left_{0};
  std::atomic<int> waiters_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

// RAII for one such call.
class InFlightCall {
 public:
  explicit InFlightCall(InFlightCalls &w) : w_(w), entered_(w.enter()) {}
  ~InFlightCall() {
    if (entered_) w_.leave();
  }
  InFlightCall(const InFlightCall &) = delete;
  InFlightCall &operator=(const InFlightCall &) = delete;

 private:
  InFlightCalls &w_;
  bool entered_;
};

}  // namespace cmg
