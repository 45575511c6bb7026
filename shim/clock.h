// SPDX-License-Identifier: Apache-2.0
// The shim's clocks, in nanoseconds: CLOCK_MONOTONIC for durations and log times (also read from
// the crash handler: clock_gettime is async-signal-safe), CLOCK_REALTIME for the log header.
#pragma once

#include <time.h>

#include <cstdint>

namespace cmg::shim {

inline std::uint64_t clock_ns(clockid_t id) {
  timespec ts;
  clock_gettime(id, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}
inline std::uint64_t mono_ns() { return clock_ns(CLOCK_MONOTONIC); }
inline std::uint64_t unix_ns() { return clock_ns(CLOCK_REALTIME); }

}  // namespace cmg::shim
