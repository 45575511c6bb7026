// SPDX-License-Identifier: Apache-2.0
// The JSON-line builder's numbers and short copies, inline so that a record's members are built in
// the caller (docs/performance.md, "the log's cost per call"): decimal digits counted first and
// written in pairs straight into the buffer, hex strings written a byte at a time from the end,
// and copies of a few bytes done with overlapping loads instead of a call to memcpy. The same
// text as printf's "%" PRIu64, "%" PRId64 and "\"%#" PRIx64 "\"" (0 is "0x0"). No allocation,
// no locale, no libc call: the exit and crash paths build their lines with them too.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cmg::shim::jsonnum {

// Decimal digits of v (1 for 0): the bit length gives log10 within one (1233/4096 is just above
// log10(2)), and one comparison with the power of ten corrects it. v|1 leaves the count alone
// (every power of ten above 1 is even) and makes 0 count as one digit.
inline constexpr auto kPow10 = [] {
  std::array<std::uint64_t, 20> p{};
  std::uint64_t v = 1;
  for (auto &x : p) {
    x = v;
    v *= 10;  // wraps after 10^19, which is the last one kept
  }
  return p;
}();

inline int dec_len(std::uint64_t v) {
  const std::uint64_t w = v | 1;
  const int t = ((64 - __builtin_clzll(w)) * 1233) >> 12;
  return t + 1 - (w < kPow10[t]);
}

inline constexpr char kDecPairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233343536373839"
    "40414243444546474849505152535455565758596061626364656667686970717273747576777879"
    "8081828384858687888990919293949596979899";

// Writes the n = dec_len(v) digits of v at out (two per division, from the end).
inline void put_dec_n(char *out, std::uint64_t v, int n) {
  char *p = out + n;
  while (v >= 100) {
    const std::uint64_t q = v / 100;
    p -= 2;
    std::memcpy(p, kDecPairs + 2 * (v - q * 100), 2);
    v = q;
  }
  if (v >= 10)
    std::memcpy(p - 2, kDecPairs + 2 * v, 2);
  else
    p[-1] = static_cast<char>('0' + v);
}

// The magnitude of a signed value, without overflow at INT64_MIN.
inline std::uint64_t magnitude(std::int64_t v) {
  return v < 0 ? ~static_cast<std::uint64_t>(v) + 1 : static_cast<std::uint64_t>(v);
}

// Hex digits of v without the "0x" (1 for 0).
inline int hex_len(std::uint64_t v) {
  return (64 - __builtin_clzll(v | 1) + 3) >> 2;
}

// Writes "0x..." in quotes at out, with n = hex_len(v) digits in lower case (n + 4 bytes).
inline void put_hex_str_n(char *out, std::uint64_t v, int n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::memcpy(out, "\"0x", 3);
  char *p = out + 3 + n;
  *p = '"';
  for (; n >= 2; n -= 2) {
    p -= 2;
    p[0] = kDigits[(v >> 4) & 15];
    p[1] = kDigits[v & 15];
    v >>= 8;
  }
  if (n) p[-1] = kDigits[v & 15];
}

// Copies n bytes (the shim's own names: keys, API and kind names, mostly under 32 bytes) with at
// most two overlapping loads and stores per size class; reads only [src, src + n).
inline void copy_short(char *dst, const char *src, std::size_t n) {
  if (n >= 16) {
    if (n > 32) {
      std::memcpy(dst, src, n);
      return;
    }
    char a[16], b[16];
    std::memcpy(a, src, 16);
    std::memcpy(b, src + n - 16, 16);
    std::memcpy(dst, a, 16);
    std::memcpy(dst + n - 16, b, 16);
  } else if (n >= 8) {
    std::uint64_t a, b;
    std::memcpy(&a, src, 8);
    std::memcpy(&b, src + n - 8, 8);
    std::memcpy(dst, &a, 8);
    std::memcpy(dst + n - 8, &b, 8);
  } else if (n >= 4) {
    std::uint32_t a, b;
    std::memcpy(&a, src, 4);
    std::memcpy(&b, src + n - 4, 4);
    std::memcpy(dst, &a, 4);
    std::memcpy(dst + n - 4, &b, 4);
  } else if (n) {
    const char a = src[0], b = src[n / 2], c = src[n - 1];
    dst[0] = a;
    dst[n / 2] = b;
    dst[n - 1] = c;
  }
}

}  // namespace cmg::shim::jsonnum
