// SPDX-License-Identifier: Apache-2.0
// The one way byte counts are written for people (messages, the exit summary, the report): powers
// of 1024 with one decimal, "512 B", "8.0 MiB", "-1.5 GiB"; and durations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cmg {

std::string human_bytes(std::int64_t b);
// "850 ns", "12.5 us", "301.2 ms", "2.00 s"
std::string human_ns(std::uint64_t ns);
// The same into out[0, cap) without allocating (the exit summary): the length written, at most
// cap - 1 (the text is NUL-terminated). kHumanMax bytes hold any value.
inline constexpr std::size_t kHumanMax = 40;
std::size_t human_bytes_to(char *out, std::size_t cap, std::int64_t b);
std::size_t human_ns_to(char *out, std::size_t cap, std::uint64_t ns);

}  // namespace cmg
