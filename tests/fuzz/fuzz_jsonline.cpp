// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the shim's JSON-line builder (shim/eventlog.cpp), which writes every log record in
// the host from a fixed buffer, with program-controlled text (argv, paths, messages) in it.
// Input: a buffer size, then a script of fields built from the input bytes.
// Invariants: whatever the text and however small the buffer, the result is exactly one line
// holding one JSON object that parses, and it never writes past the buffer. The same script is
// built again with a spill target (the log's fixed-size line writer): the pieces and the last part
// together are one line, one JSON object, and nothing is cut (in a buffer of 256 bytes or more).
// Each is built a second time with its numbers, flags and objects through the unchecked writer
// wherever fits() allows it (as the call record is built): the bytes must be the same.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "jsonline.h"

namespace {

[[noreturn]] void fail(const char *what, std::string_view line) {
  std::fprintf(stderr, "fuzz_jsonline: invariant broken: %s: %.*s\n", what,
               static_cast<int>(line.size() > 400 ? 400 : line.size()), line.data());
  std::abort();
}

struct Pieces final : cmg::shim::JsonLine::Spill {
  std::string all;
  std::size_t cap = 0;
  void piece(std::string_view bytes) override {
    if (bytes.size() > cap) fail("a piece longer than the buffer", bytes);
    all.append(bytes);
  }
};

// Writes one member through the unchecked writer when fits() says its largest size fits (what
// the call record does), through the checked one otherwise.
template <class F>
void member(cmg::shim::JsonLine &j, bool fast, std::size_t bound, F &&f) {
  if (fast && j.fits(bound)) {
    cmg::shim::JsonLine::Unchecked u(j);
    f(u);
  } else {
    f(j);
  }
}

// Runs the script in data[0, size) on j; `fast`: numbers, flags and objects through the unchecked
// writer where they fit (the line must come out byte for byte the same).
void build(cmg::shim::JsonLine &j, const std::uint8_t *data, std::size_t size, bool fast) {
  using cmg::shim::JsonLine;
  std::size_t i = 0;
  int depth = 0;
  auto text = [&](std::size_t n) {
    n = std::min(n, size - i);
    std::string_view s(reinterpret_cast<const char *>(data + i), n);
    i += n;
    return s;
  };
  // Keys are the shim's own constants (never program text), so they come from a fixed set.
  static const char *const kKeys[] = {"k", "api", "args", "msg", "related", "x_y", "0"};
  auto key = [](std::size_t n) { return std::string_view(kKeys[n % 7]); };
  std::vector<bool> in_array;  // what each open container is
  while (i < size) {
    const std::uint8_t op = data[i++];
    const std::size_t n = i < size ? data[i++] : 0;
    const bool arr = !in_array.empty() && in_array.back();
    switch (op % 9) {
      case 0: arr ? (void)j.elem_str(text(n)) : (void)j.str(key(n), text(n)); break;
      case 1: {
        std::uint64_t v = 0;
        std::memcpy(&v, data + i - 1, std::min<std::size_t>(8, size - (i - 1)));
        if (arr)
          j.elem_hex(v);
        else
          member(j, fast, key(n).size() + 4 + JsonLine::kNumMax,
                 [&](auto &w) { w.hex(key(n), v); });
        break;
      }
      case 2:
        if (!arr)
          member(j, fast, key(n).size() + 4 + JsonLine::kNumMax,
                 [&](auto &w) { w.num(key(n), -static_cast<std::int64_t>(n) * 1234567891011LL); });
        break;
      case 3:
        if (!arr)
          member(j, fast, key(n).size() + 4 + JsonLine::kNumMax,
                 [&](auto &w) { w.unum(key(n), static_cast<std::uint64_t>(n) << 56); });
        break;
      case 4:
        if (!arr)
          member(j, fast, key(n).size() + 4 + 5, [&](auto &w) { w.boolean(key(n), n & 1); });
        break;
      case 5:
        if (depth < 64) {
          if (arr)
            j.elem_object();
          else  // an object and the API name of a call record in it
            member(j, fast, key(n).size() + key(n + 1).size() + 8 + 2 + 15,
                   [&](auto &w) { w.begin_object(key(n)).ident(key(n + 1), "cuMemAlloc_v2"); });
          in_array.push_back(false);
          ++depth;
        }
        break;
      case 6:
        if (depth < 64 && !arr) {
          j.begin_array(key(n));
          in_array.push_back(true);
          ++depth;
        }
        break;
      case 7:
        if (depth > 0) {
          if (in_array.back())
            j.end_array();
          else
            member(j, fast, 1, [&](auto &w) { w.end_object(); });
          in_array.pop_back();
          --depth;
        }
        break;
      case 8: arr ? (void)j.elem_raw("{\"a\":1}") : (void)j.raw(key(n), "[1,2]"); break;
    }
  }
  while (depth-- > 0) {
    in_array.back() ? (void)j.end_array() : (void)j.end_object();
    in_array.pop_back();
  }
}

void check_line(std::string_view line) {
  if (line.empty() || line.back() != '\n') fail("no newline at the end", line);
  if (line.substr(0, line.size() - 1).find('\n') != std::string_view::npos) fail("a newline inside", line);
  const auto parsed = nlohmann::json::parse(line.substr(0, line.size() - 1), nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) fail("not one JSON object", line);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  if (size < 2) return 0;
  // 64..4159 bytes: small enough to cut values often, large enough for real records.
  const std::size_t cap = 64 + ((static_cast<std::size_t>(data[0]) << 4) | (data[1] & 15));
  data += 2;
  size -= 2;
  std::string plain[2], spilled[2];  // built with checked members, and with unchecked ones
  for (int fast = 0; fast < 2; ++fast) {
    // The buffer sits inside a larger one with guard bytes on both sides.
    std::vector<char> mem(cap + 64, '\x5a');
    char *buf = mem.data() + 32;
    cmg::shim::JsonLine j(buf, cap);
    build(j, data, size, fast);
    const std::string_view line = j.finish();
    for (std::size_t k = 0; k < 32; ++k)
      if (mem[k] != '\x5a' || mem[32 + cap + k] != '\x5a') fail("wrote outside the buffer", line);
    if (line.data() != buf || line.size() > cap) fail("line outside the buffer", line);
    check_line(line);
    plain[fast] = std::string(line);
    // With a spill target: nothing is cut, whatever the size.
    std::fill(mem.begin(), mem.end(), '\x5a');
    Pieces pieces;
    pieces.cap = cap;
    cmg::shim::JsonLine s(buf, cap, &pieces);
    build(s, data, size, fast);
    pieces.all.append(s.finish());
    for (std::size_t k = 0; k < 32; ++k)
      if (mem[k] != '\x5a' || mem[32 + cap + k] != '\x5a')
        fail("spilling wrote outside", pieces.all);
    check_line(pieces.all);
    // A buffer of 256 bytes leaves room for any key and number at the deepest nesting (64); the
    // log's line writer has 4096.
    if (cap >= 256 && pieces.all.find("\"cut\":true") != std::string::npos)
      fail("cut with a spill target", pieces.all);
    spilled[fast] = std::move(pieces.all);
  }
  if (plain[1] != plain[0]) fail("the unchecked members wrote other bytes", plain[1]);
  if (spilled[1] != spilled[0]) fail("the unchecked members spilled other bytes", spilled[1]);
  return 0;
}
