// SPDX-License-Identifier: Apache-2.0
// The log writer: every line it builds is valid JSON (also when cut short), paths expand, and a
// written log reads back with a real JSON parser.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "eventlog.h"

using cmg::shim::EventLog;
using cmg::shim::JsonLine;
using nlohmann::json;

TEST_CASE("JsonLine writes escaped, typed members") {
  char buf[512];
  JsonLine j(buf, sizeof buf);
  j.str("k", "call").hex("ptr", 0x7f0000000000ull).num("res", -1).unum("size", 2097152)
      .boolean("skipped", true).str("msg", "quote \" slash \\ nl \n tab \t ctl \x01")
      .begin_object("args").hex("handle", 0x55).end_object()
      .begin_array("pcs").elem_hex(1).elem_hex(2).end_array();
  std::string_view line = j.finish();
  REQUIRE(line.back() == '\n');
  json v = json::parse(line);
  CHECK(v["k"] == "call");
  CHECK(v["ptr"] == "0x7f0000000000");
  CHECK(v["res"] == -1);
  CHECK(v["size"] == 2097152);
  CHECK(v["skipped"] == true);
  CHECK(v["msg"] == "quote \" slash \\ nl \n tab \t ctl \x01");
  CHECK(v["args"]["handle"] == "0x55");
  CHECK(v["pcs"] == json::array({"0x1", "0x2"}));
  CHECK_FALSE(v.contains("cut"));
}

TEST_CASE("JsonLine keeps valid UTF-8 and escapes bytes that are not") {
  char buf[256];
  JsonLine j(buf, sizeof buf);
  j.str("ok", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80").str("bad", "a\xe9" "b\xc3")
      .str("surrogate", "\xed\xa0\x80");
  std::string_view line = j.finish();
  json v = json::parse(line);  // throws on invalid UTF-8
  CHECK(v["ok"] == "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  CHECK(v["bad"] == "a\xc3\xa9" "b\xc3\x83");  // \u00e9 and \u00c3, read back as UTF-8
  CHECK(line.find("\\u00e9") != std::string_view::npos);
  CHECK(v["surrogate"] == "\xc3\xad\xc2\xa0\xc2\x80");
}

TEST_CASE("JsonLine stays valid JSON when the buffer is too small") {
  for (std::size_t cap : {96u, 128u, 200u, 300u}) {
    char buf[300];
    JsonLine j(buf, cap);
    std::string longtext(1000, 'x');
    j.str("k", "finding").str("msg", longtext).begin_object("args").unum("a", 1).unum("b", 2)
        .end_object().begin_array("related").elem_raw("{\"what\":\"first release\"}").end_array()
        .unum("after", 7);
    std::string_view line = j.finish();
    INFO("cap " << cap << ": " << line);
    REQUIRE(line.size() <= cap);
    json v = json::parse(line);
    CHECK(v["k"] == "finding");
    CHECK(v["cut"] == true);
  }
}

TEST_CASE("Log paths expand %p, %r and %%") {
  CHECK(cmg::shim::expand_log_path("cg.%p.%r.log", 42, 3) == "cg.42.3.log");
  CHECK(cmg::shim::expand_log_path("cg.%r.log", 42, -1) == "cg.na.log");
  CHECK(cmg::shim::expand_log_path("100%%-%x%", 1, 0) == "100%-%x%");
}

TEST_CASE("Rank comes from RANK, then the launchers' variables") {
  unsetenv("RANK");
  unsetenv("SLURM_PROCID");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("PMI_RANK");
  CHECK(cmg::shim::rank_from_env() == -1);
  setenv("PMI_RANK", "5", 1);
  CHECK(cmg::shim::rank_from_env() == 5);
  setenv("RANK", "2", 1);
  CHECK(cmg::shim::rank_from_env() == 2);
  setenv("RANK", "x", 1);
  CHECK(cmg::shim::rank_from_env() == 5);
  unsetenv("RANK");
  unsetenv("PMI_RANK");
}

TEST_CASE("EventLog writes whole lines, refuses a symlink and reports an unwritable path") {
  char dir[] = "/tmp/cmg-logtest-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string path = std::string(dir) + "/log";
  {
    EventLog log;
    REQUIRE(log.open(path).empty());
    char buf[256];
    for (int i = 0; i < 5000; ++i) {
      JsonLine j(buf, sizeof buf);
      j.str("k", "call").num("i", i);
      log.write(j.finish(), 0);
    }
    log.flush();
  }
  std::ifstream in(path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    json v = json::parse(line);
    CHECK(v["i"] == n);
    ++n;
  }
  CHECK(n == 5000);

  std::string link = std::string(dir) + "/link";
  REQUIRE(symlink(path.c_str(), link.c_str()) == 0);
  EventLog l2;
  std::string err = l2.open(link);
  CHECK(err.find("symbolic link") != std::string::npos);
  CHECK_FALSE(l2.is_open());

  EventLog l3;
  err = l3.open(std::string(dir) + "/no/such/dir/log");
  CHECK(err.find("No such file or directory") != std::string::npos);
  unlink(link.c_str());
  unlink(path.c_str());
  rmdir(dir);
}

TEST_CASE("numbers are written like printf writes them, at the edges too") {
  char buf[512];
  JsonLine j(buf, sizeof buf);
  j.num("min", INT64_MIN).num("neg", -7).num("zero", 0).unum("max", UINT64_MAX).unum("u0", 0)
      .hex("h0", 0).hex("hmax", UINT64_MAX).begin_array("a").elem_hex(0xabcdef).end_array();
  const std::string line(j.finish());
  CHECK(line == "{\"min\":-9223372036854775808,\"neg\":-7,\"zero\":0,\"max\":18446744073709551615,"
                "\"u0\":0,\"h0\":\"0x0\",\"hmax\":\"0xffffffffffffffff\",\"a\":[\"0xabcdef\"]}\n");
}
