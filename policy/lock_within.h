// SPDX-License-Identifier: Apache-2.0
// Locks for exit and signal paths. A SIGTERM handler that calls exit() (many servers have one) runs
// the exit handlers on the thread it interrupted, possibly inside one of our locks, which that
// thread then never gives back: an exit path that waits for it waits forever. So exit paths try for
// a bounded time and then go on without what the lock guards (docs/reliability.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

namespace cmg {

// How long an exit path waits for one lock: a thread that is running holds any of ours for
// microseconds, so a lock still taken after this belongs to a thread that will not come back
// (half a second: a holder descheduled on a loaded machine, under ThreadSanitizer, is back by then).
inline constexpr std::uint64_t kExitPatienceNs = 500'000'000;

// Takes m within patience_ns (tries, with 200 us pauses), or returns false.
template <class Mutex>
bool lock_within(Mutex &m, std::uint64_t patience_ns = kExitPatienceNs) {
  for (std::uint64_t waited = 0;; waited += 200'000) {
    if (m.try_lock()) return true;
    if (waited >= patience_ns) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace cmg
