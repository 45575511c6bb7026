// SPDX-License-Identifier: Apache-2.0
// The exit and crash paths' text writer (shim/textbuf.h): numbers without stdio, fields padded as
// the summary's columns are, a full buffer dropped (no sink) or handed on (sink) with nothing lost.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "textbuf.h"

using cmg::shim::TextBuf;

namespace {
std::string g_sunk;
void sink(std::string_view v) {
  g_sunk.append(v);
}
}  // namespace

TEST_CASE("TextBuf writes numbers as printf would") {
  char buf[256];
  TextBuf t(buf, sizeof buf);
  t.u(0)
      .c(' ')
      .u(18446744073709551615ull)
      .c(' ')
      .i(-1)
      .c(' ')
      .i(std::numeric_limits<std::int64_t>::min())
      .c(' ')
      .hex(0)
      .c(' ')
      .hex(0x7f00dead0000);
  CHECK(t.view() == "0 18446744073709551615 -1 -9223372036854775808 0x0 0x7f00dead0000");
  CHECK_FALSE(t.full());
}

TEST_CASE("TextBuf pads fields like the summary's columns") {
  char buf[128];
  TextBuf t(buf, sizeof buf);
  t.s("  ").left("0", 6).c(' ').left("linear", 8).c(' ').right("4.0 KiB", 12).s("|");
  CHECK(t.view() == "  0      linear        4.0 KiB|");
  TextBuf u(buf, sizeof buf);
  u.left("toolongvalue", 4).right("x", 0);
  CHECK(u.view() == "toolongvaluex");
  CHECK(u.column() == 13);
  u.s("\nab");
  CHECK(u.column() == 2);
}

TEST_CASE("TextBuf without a sink drops what does not fit and says so") {
  char buf[8];
  TextBuf t(buf, sizeof buf);
  t.s("12345").s("6789");
  CHECK(t.full());
  CHECK(t.view() == "12345678");
  t.truncate(0);
  CHECK_FALSE(t.full());
  CHECK(t.view().empty());
}

TEST_CASE("TextBuf with a sink hands full buffers on and loses nothing") {
  g_sunk.clear();
  char buf[7];
  TextBuf t(buf, sizeof buf, sink);
  std::string want;
  for (int i = 0; i < 100; ++i) {
    t.s("line ").u(static_cast<std::uint64_t>(i)).c('\n');
    want += "line " + std::to_string(i) + "\n";
  }
  t.flush();
  CHECK_FALSE(t.full());
  CHECK(g_sunk == want);
}
