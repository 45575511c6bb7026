// SPDX-License-Identifier: Apache-2.0
// Small formatters shared by the text report and the trace: times, durations, byte counts, calls.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <string>

#include <fmt/format.h>

#include "report_model.h"
#include "units.h"

namespace cmg::report {

// Seconds with microseconds, from integers so the text is the same on every machine.
inline std::string fmt_time(std::int64_t ns) {
  const char *sign = ns < 0 ? "-" : "";
  const std::uint64_t a =
      ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  return fmt::format("{}{}.{:06}s", sign, a / 1'000'000'000, a % 1'000'000'000 / 1000);
}

inline std::string fmt_duration(std::int64_t ns) {
  const std::int64_t a = std::llabs(ns);
  if (a < 1000) return fmt::format("{}ns", ns);
  if (a < 1'000'000) return fmt::format("{}.{:03}us", ns / 1000, a % 1000);
  if (a < 1'000'000'000) return fmt::format("{}.{:03}ms", ns / 1'000'000, a % 1'000'000 / 1000);
  return fmt::format("{}.{:03}s", ns / 1'000'000'000, a % 1'000'000'000 / 1'000'000);
}

// "2097152 bytes (2.0 MiB)"
inline std::string bytes_text(std::int64_t b) {
  if (b > -1024 && b < 1024) return fmt::format("{} bytes", b);
  return fmt::format("{} bytes ({})", b, cmg::human_bytes(b));
}

// JSON on one line; invalid UTF-8 from a damaged log is replaced rather than thrown on.
inline std::string compact(const Json &j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// The HTML page's escaping and its stack list (report_html.cpp), for its parts written elsewhere.
std::string html_escape(std::string_view s);
void stack_html(std::ostream &out, const ResolvedStack &s);

// One stack of the text reports (findings, leaks, resident sites, --diff): frames below the
// native main are not printed and the interpreter's own frames below the outermost Python frame
// are folded into a line, unless `full` (--full-stacks); JSON, the trace and the page keep every
// frame.
void print_stack(std::ostream &out, const ResolvedStack &s, const std::string &indent, bool full);

// "cuMemRelease(handle=0x55d0c0a0, size=2097152)"
inline std::string call_text(const std::string &api, const std::string &args) {
  return (api.empty() ? std::string("?") : api) + "(" + args + ")";
}

}  // namespace cmg::report
