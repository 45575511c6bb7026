// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry point: the broker's request parser, and the importer's parsers of the broker's
// replies and page messages (policy/ipc_bridge.h). A message that parses must be exactly what the
// encoder writes for it; nothing may crash.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ipc_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  namespace ipc = cmg::ipc;
  const std::span<const std::uint8_t> in(data, size);
  ipc::Request req;
  if (ipc::parse_request(in, req) == ipc::ParseError::None) {
    const auto again = ipc::encode_request(req);
    if (size != again.size() || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  }
  ipc::Reply rep;
  if (ipc::parse_reply(in, rep) == ipc::ParseError::None) {
    const auto again = ipc::encode_reply(rep);
    if (size != again.size() || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  }
  std::uint32_t first = 0;
  std::vector<ipc::PageRange> pages;
  if (ipc::parse_chunk(in, first, pages) == ipc::ParseError::None) {
    if (ipc::encode_chunk(first, pages) != std::vector<std::uint8_t>(data, data + size))
      __builtin_trap();
    (void)ipc::pages_valid(pages, UINT64_MAX);
  }
  return 0;
}
