// SPDX-License-Identifier: Apache-2.0
// The current device remembered per thread, so that a tracked allocation does not ask the driver.
//
// A thread's current context changes only through calls the shim sees (real-driver.md section 5:
// the runtime makes it current through looked-up cuCtxSetCurrent/Push/Pop, which the shim routes):
// each of them drops the calling thread's answer (forget()), and the calls that can change what is
// current on other threads too (a context destroyed, a primary context released or reset) move a
// process-wide epoch that every thread's answer is compared with (forget_everywhere()). Relaxed
// atomics suffice: a destroy on one thread is not ordered with another thread's allocation by the
// program either, and the epoch is read before the driver is asked, so a move during the question
// leaves the answer stale-marked for the next call.
#pragma once

#include <atomic>
#include <cstdint>

namespace cmg {

// The process-wide epoch; never 0 (0 marks a thread's answer as absent).
class DeviceEpoch {
 public:
  std::uint64_t now() const { return epoch_.load(std::memory_order_relaxed); }
  void advance() { epoch_.fetch_add(1, std::memory_order_relaxed); }

 private:
  std::atomic<std::uint64_t> epoch_{1};
};

// One thread's answer. Trivial, so it can live in initial-exec TLS with no constructor.
struct CachedDevice {
  std::uint64_t epoch = 0;  // the epoch it was read under; 0: nothing remembered
  int dev = -1;

  void forget() { epoch = 0; }

  // The remembered device while the epoch has not moved; else query() (returns the device, or a
  // negative value when the driver has none: no current context, no driver yet), remembered only
  // when it is a device, so a thread without a context asks again on its next call.
  template <class Query>
  int get(const DeviceEpoch &e, Query &&query) {
    const std::uint64_t now = e.now();
    if (epoch == now) return dev;
    const int d = query();
    if (d >= 0) {
      dev = d;
      epoch = now;
    }
    return d;
  }
};

}  // namespace cmg
