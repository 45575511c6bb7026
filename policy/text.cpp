// SPDX-License-Identifier: Apache-2.0
// Text helpers: see text.h.
#include "text.h"

#include <cinttypes>
#include <cstdio>

namespace cmg {

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

std::string at_seq(const EventRef &e) {
  if (!e.known()) return "before tracking";
  std::string s = "seq " + std::to_string(e.seq);
  if (e.api) s += std::string(" (") + e.api + ", thread " + std::to_string(e.tid) + ")";
  return s;
}

std::string range_text(std::uint64_t p, std::uint64_t size) {
  return hex(p) + " (+" + std::to_string(size) + " bytes)";
}

}  // namespace cmg
