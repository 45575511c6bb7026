// SPDX-License-Identifier: Apache-2.0
// Units for people: see units.h.
#include "units.h"

#include <cstdio>

namespace cmg {

std::string human_bytes(std::int64_t b) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  const std::uint64_t a = b < 0 ? 0 - static_cast<std::uint64_t>(b) : static_cast<std::uint64_t>(b);
  double v = static_cast<double>(a);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[40];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%s%llu B", b < 0 ? "-" : "", static_cast<unsigned long long>(a));
  else
    std::snprintf(buf, sizeof buf, "%s%.1f %s", b < 0 ? "-" : "", v, unit[u]);
  return buf;
}

std::string human_ns(std::uint64_t ns) {
  char buf[32];
  if (ns < 1000)
    std::snprintf(buf, sizeof buf, "%llu ns", static_cast<unsigned long long>(ns));
  else if (ns < 1000000)
    std::snprintf(buf, sizeof buf, "%.1f us", static_cast<double>(ns) / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof buf, "%.1f ms", static_cast<double>(ns) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", static_cast<double>(ns) / 1e9);
  return buf;
}

}  // namespace cmg
