// SPDX-License-Identifier: Apache-2.0
// Text helpers the policy uses when it phrases findings and state objects (messages are built only
// when there is a finding, never on the path of a call without one).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event.h"

namespace cmg {

std::string hex(std::uint64_t v);                // "0x7f0000000000"
std::string json_escape(std::string_view s);     // the inside of a JSON string
// "seq 12 (cuMemRelease, thread 4242)", or "before tracking" for an unknown event.
std::string at_seq(const EventRef &e);
std::string range_text(std::uint64_t p, std::uint64_t size);  // "0x7f00 (+2097152 bytes)"

}  // namespace cmg
