// SPDX-License-Identifier: Apache-2.0
// The log writer: every line it builds is valid JSON (also when cut short), paths expand, and a
// written log reads back with a real JSON parser.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

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

// Found by fuzz_jsonline (tests/fuzz/regressions/jsonline/invalid-utf8-in-string): program text
// that is not UTF-8 made lines a strict JSON reader (the report's) refuses.
TEST_CASE("JsonLine escapes each byte that is not well-formed UTF-8 and keeps valid UTF-8") {
  char buf[512];
  JsonLine j(buf, sizeof buf);
  const std::string latin1 = "caf\xe9.pt";                  // a Latin-1 file name in argv
  const std::string valid = "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";  // é € 😀
  const std::string bad = "\xc0\xaf \xed\xa0\x80 \xf4\x90\x80\x80 \xe2\x82";  // overlong, surrogate, >10FFFF, cut
  j.str("a", latin1).str("b", valid).str("c", bad).begin_array("argv").elem_str(latin1).end_array();
  std::string_view line = j.finish();
  json v = json::parse(line);
  CHECK(v["a"] == "caf\xc3\xa9.pt");  // \u00e9: read as Latin-1, the likely intent
  CHECK(v["b"] == valid);
  CHECK(v["argv"][0] == "caf\xc3\xa9.pt");
  // Overlong, surrogate, beyond U+10FFFF and cut sequences: every byte escaped on its own.
  CHECK(v["c"] == "\xc3\x80\xc2\xaf \xc3\xad\xc2\xa0\xc2\x80 \xc3\xb4\xc2\x90\xc2\x80\xc2\x80 "
                  "\xc3\xa2\xc2\x82");
}

// A line longer than the log's own buffer (a finding that quotes a huge environment value, a header
// with a long argv) was cut at 64 KiB without its newline, merging it with the next record.
TEST_CASE("EventLog writes a line longer than its buffer whole") {
  char dir[] = "/tmp/cmg-logtest-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string path = std::string(dir) + "/log";
  {
    EventLog log;
    REQUIRE(log.open(path).empty());
    std::string big(300000, '\0');
    JsonLine j(big.data(), big.size());
    j.str("k", "finding").str("msg", std::string(200000, 'A'));
    log.write(j.finish(), 0);
    char small[128];
    JsonLine k(small, sizeof small);
    k.str("k", "end");
    log.write(k.finish(), 0);
    log.seal();
    log.write(k.finish(), 0);  // after the seal: dropped
  }
  std::ifstream in(path);
  std::string line;
  std::vector<json> recs;
  while (std::getline(in, line)) recs.push_back(json::parse(line));
  REQUIRE(recs.size() == 2);
  CHECK(recs[0]["msg"].get<std::string>().size() == 200000);
  CHECK(recs[1]["k"] == "end");
  unlink(path.c_str());
  rmdir(dir);
}

// A FIFO planted at the log path blocked open(2) until someone read it: the host hung at its first
// CUDA call. A file another user planted in a sticky directory was truncated and written.
TEST_CASE("EventLog refuses a FIFO without blocking, and a file planted in a shared directory") {
  char dir[] = "/tmp/cmg-logtest-XXXXXX";
  REQUIRE(mkdtemp(dir));
  std::string fifo = std::string(dir) + "/fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  EventLog l1;
  std::string err = l1.open(fifo);
  CHECK(err.find("FIFO") != std::string::npos);
  CHECK_FALSE(l1.is_open());
  unlink(fifo.c_str());
  if (geteuid() == 0) {
    REQUIRE(chmod(dir, 01777) == 0);
    std::string planted = std::string(dir) + "/planted";
    {
      std::ofstream(planted) << "planted\n";
    }
    REQUIRE(chown(planted.c_str(), 65534, 65534) == 0);
    EventLog l2;
    err = l2.open(planted);
    CHECK(err.find("another user") != std::string::npos);
    std::ifstream in(planted);
    std::string content;
    std::getline(in, content);
    CHECK(content == "planted");
    unlink(planted.c_str());
  }
  rmdir(dir);
}
