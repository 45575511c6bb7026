// SPDX-License-Identifier: Apache-2.0
// Units for people: see units.h.
#include "units.h"

#include <algorithm>
#include <cstdio>

namespace cmg {

// snprintf into the caller's buffer: glibc formats a string this short on the stack, with no lock
// and no allocation.
std::size_t human_bytes_to(char *out, std::size_t cap, std::int64_t b) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (!cap) return 0;
  const std::uint64_t a = b < 0 ? 0 - static_cast<std::uint64_t>(b) : static_cast<std::uint64_t>(b);
  double v = static_cast<double>(a);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  int n;
  if (u == 0)
    n = std::snprintf(out, cap, "%s%llu B", b < 0 ? "-" : "", static_cast<unsigned long long>(a));
  else
    n = std::snprintf(out, cap, "%s%.1f %s", b < 0 ? "-" : "", v, unit[u]);
  return n < 0 ? 0 : std::min(static_cast<std::size_t>(n), cap - 1);
}

std::size_t human_ns_to(char *out, std::size_t cap, std::uint64_t ns) {
  if (!cap) return 0;
  int n;
  if (ns < 1000)
    n = std::snprintf(out, cap, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000)
    n = std::snprintf(out, cap, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    n = std::snprintf(out, cap, "%.1f ms", static_cast<double>(ns) / 1e6);
  else
    n = std::snprintf(out, cap, "%.2f s", static_cast<double>(ns) / 1e9);
  return n < 0 ? 0 : std::min(static_cast<std::size_t>(n), cap - 1);
}

std::string human_bytes(std::int64_t b) {
  char buf[kHumanMax];
  return std::string(buf, human_bytes_to(buf, sizeof buf, b));
}

std::string human_ns(std::uint64_t ns) {
  char buf[kHumanMax];
  return std::string(buf, human_ns_to(buf, sizeof buf, ns));
}

}  // namespace cmg
