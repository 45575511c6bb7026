// SPDX-License-Identifier: Apache-2.0
// The one way byte counts are written for people (messages, the exit summary, the report): powers
// of 1024 with one decimal, "512 B", "8.0 MiB", "-1.5 GiB"; and durations.
#pragma once

#include <cstdint>
#include <string>

namespace cmg {

std::string human_bytes(std::int64_t b);
// "850 ns", "12.5 us", "301.2 ms", "2.00 s"
std::string human_ns(std::uint64_t ns);

}  // namespace cmg
