// SPDX-License-Identifier: Apache-2.0
// Transport registry (see transport.h).
#include "transport.h"

#include <new>

namespace cmg {

void Transport::set_suppressed() {
  if (suppressed_.load(std::memory_order_acquire)) return;
  // Wait for a flush already in progress, then publish: no flush straddles the transition.
  std::lock_guard lk(flush_mu_);
  suppressed_.store(true, std::memory_order_release);
}

void Transport::on_create_enter() {
  pending_.fetch_add(1, std::memory_order_relaxed);
  set_suppressed();
}

void Transport::on_create_exit(int created) {
  pending_.fetch_sub(1, std::memory_order_relaxed);
  if (created > 0) {
    live_.fetch_add(created, std::memory_order_relaxed);
    created_total_.fetch_add(static_cast<std::uint64_t>(created), std::memory_order_relaxed);
  }
}

void Transport::on_destroy() {
  int v = live_.load(std::memory_order_relaxed);
  while (v > 0 && !live_.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) {
  }
}

void Transport::suppress_external() { set_suppressed(); }

void Transport::reset() {
  new (&flush_mu_) std::mutex();
  live_.store(0);
  pending_.store(0);
  // Sticky across fork too: the child inherits whatever the parent's transports left behind.
}

}  // namespace cmg
