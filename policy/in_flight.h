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

class InFlightCalls {
 public:
  static constexpr std::size_t kSlots = 128;  // threads beyond share one count

  // The calling thread enters such a call; only its outermost one counts (a create nested in
  // another intercepted call is part of it). Returns whether this call entered.
  bool enter();
  void leave();
  // Waits until every such call of another thread in flight now has left, at most timeout_ns.
  // Returns false when none was in flight (nothing to wait for).
  bool settle(std::uint64_t timeout_ns);
  // The number in flight now (tests).
  std::size_t in_flight() const;
  // fork(): the child has none of the parent's other threads.
  void fork_child();

 private:
  struct alignas(64) Slot {
    // Odd while the thread is inside such a call: 2 * (calls so far) + 1.
    std::atomic<std::uint64_t> v{0};
  };
  std::size_t slot_of_thread();
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
