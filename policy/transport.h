// SPDX-License-Identifier: Apache-2.0
// Transport registry: live NCCL communicators (and transports announced through the C API), and the
// sticky "opportunistic cleanup suppressed" state that follows from them.
//
// A communicator counts from the *entry* of its init call: NCCL starts proxy threads and lazily
// connects peers inside collectives (NCCL_RUNTIME_CONNECT, nccl-and-cleanup.md 1.2), so device work
// may be in flight before the init returns. Suppression is sticky: an empty communicator list does
// not prove the transports are quiet (seed 000's contract).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace cmg {

class Transport {
 public:
  // An init/split/shrink call begins: suppression starts now, before the real call runs.
  void on_create_enter();
  // It returned: `created` communicators exist now (0 on failure; non-blocking init counts).
  void on_create_exit(int created);
  void on_destroy();  // destroy or abort of one communicator
  // cumemguard_suppress_opportunistic_cleanup(): a transport the shim cannot see has started.
  void suppress_external();

  int live() const { return live_.load(std::memory_order_relaxed); }
  bool suppressed() const { return suppressed_.load(std::memory_order_acquire); }
  std::uint64_t created_total() const { return created_total_.load(std::memory_order_relaxed); }

  // A flush runs under this lock so the transition to suppressed is serialized with a flush that
  // is already running (it completes first; the next one sees the new state).
  std::mutex &flush_mutex() { return flush_mu_; }
  void reset();  // after fork(): the child has no communicators

 private:
  void set_suppressed();
  std::atomic<int> live_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> suppressed_{false};
  std::atomic<std::uint64_t> created_total_{0};
  std::mutex flush_mu_;
};

}  // namespace cmg
