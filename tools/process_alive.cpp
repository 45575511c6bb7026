// SPDX-License-Identifier: Apache-2.0
// A log's process still alive on this host: /proc/PID/stat's state and start time against the
// log header's pid, host and start.
#include "process_alive.h"

#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace cmg::report {
namespace {

// The boot time in seconds since the epoch (/proc/stat btime), or 0.
std::int64_t boot_time() {
  std::ifstream in("/proc/stat");
  std::string key;
  std::int64_t v = 0;
  while (in >> key) {
    if (key == "btime" && in >> v) return v;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

bool still_running(const Header &h) {
  if (h.pid <= 0 || h.host.empty() || h.start_unix_ns <= 0) return false;
  char host[256] = "";
  if (gethostname(host, sizeof host - 1) != 0 || h.host != host) return false;
  std::ifstream in("/proc/" + std::to_string(h.pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // "PID (COMM) STATE ..." where COMM may hold spaces and parentheses: fields after the last ')'.
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(stat.substr(close + 1));
  std::string state, f;
  fields >> state;
  if (state.empty() || state == "Z" || state == "X") return false;  // ended, not yet reaped
  // Field 22, starttime (clock ticks after boot): fields 4 to 21 come between.
  for (int i = 4; i <= 21 && fields >> f; ++i) {
  }
  std::int64_t ticks = 0;
  if (!(fields >> ticks)) return false;
  const long hz = sysconf(_SC_CLK_TCK);
  const std::int64_t btime = boot_time();
  if (hz <= 0 || btime <= 0) return false;
  const std::int64_t started_ns =
      btime * 1'000'000'000 + ticks / hz * 1'000'000'000 + ticks % hz * (1'000'000'000 / hz);
  // The shim stamps the log after the process started; btime is whole seconds, so allow 2 s. A
  // process that started later is another one that was given the pid.
  return started_ns <= h.start_unix_ns + 2'000'000'000;
}

}  // namespace cmg::report
