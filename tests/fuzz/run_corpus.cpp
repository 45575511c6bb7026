// SPDX-License-Identifier: Apache-2.0
// Runs a libFuzzer entry point without libFuzzer: well-formed seeds, every single-byte change of
// them and deterministic random inputs, so that CI (g++) exercises the same code the fuzzers do.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "ipc_bridge.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size);

int main() {
  namespace ipc = cmg::ipc;
  std::vector<std::vector<std::uint8_t>> seeds;
  ipc::Handle h;
  h.pid = 77;
  h.tag = 0x55;
  h.export_id = 2;
  h.pages = 4;
  h.nonce.fill(9);
  const auto hb = ipc::encode_handle(h);
  seeds.emplace_back(hb.begin(), hb.end());
  ipc::Request r;
  r.export_id = 2;
  const auto rb = ipc::encode_request(r);
  seeds.emplace_back(rb.begin(), rb.end());
  ipc::Reply rep;
  rep.pages = 2;
  rep.span = 4 << 20;
  rep.res_size = 8 << 20;
  const auto pb = ipc::encode_reply(rep);
  seeds.emplace_back(pb.begin(), pb.end());
  const std::vector<ipc::PageRange> pages = {{0, 2 << 20}, {2 << 20, 2 << 20}};
  seeds.push_back(ipc::encode_chunk(0, pages));
  std::size_t runs = 0;
  for (const auto &s : seeds) {
    LLVMFuzzerTestOneInput(s.data(), s.size());
    for (std::size_t cut = 0; cut < s.size(); ++cut, ++runs) LLVMFuzzerTestOneInput(s.data(), cut);
    for (std::size_t i = 0; i < s.size(); ++i)
      for (int v = 0; v < 256; v += 17, ++runs) {
        auto m = s;
        m[i] = static_cast<std::uint8_t>(v);
        LLVMFuzzerTestOneInput(m.data(), m.size());
      }
  }
  std::uint64_t x = 0x2545F4914F6CDD1Dull;
  std::vector<std::uint8_t> buf;
  for (int i = 0; i < 100000; ++i, ++runs) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    buf.resize(x % 1200);
    for (auto &b : buf) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      b = static_cast<std::uint8_t>(x);
    }
    const auto &s = seeds[x % seeds.size()];
    for (std::size_t k = 0; k < s.size() && k < buf.size() && (x & 1); ++k) buf[k] = s[k];
    LLVMFuzzerTestOneInput(buf.data(), buf.size());
  }
  std::printf("%zu inputs, no crash\n", runs);
  return 0;
}
