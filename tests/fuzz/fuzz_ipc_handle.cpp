// SPDX-License-Identifier: Apache-2.0
// libFuzzer entry point: the importer's decoder of 64-byte bridge handles (policy/ipc_bridge.h).
// Anything that decodes must be exactly what the encoder writes for it (P14: no stray bytes).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ipc_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  cmg::ipc::Handle h;
  const auto st = cmg::ipc::decode_handle({data, size}, h);
  if (st == cmg::ipc::HandleStatus::Ok) {
    const auto again = cmg::ipc::encode_handle(h);
    if (size < again.size() || std::memcmp(again.data(), data, again.size()) != 0) __builtin_trap();
  }
  return 0;
}
