// SPDX-License-Identifier: Apache-2.0
// Unit tests of the event log reader: format refusal, truncation, unknown records, event order.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>

#include "json_bounded.h"
#include "logreader.h"

using namespace cmg::report;

namespace {

std::string header(int format = 1, long long start = 1000000000, int pid = 10, int rank = -1) {
  return "{\"cumemguard_log\":" + std::to_string(format) +
         ",\"tool\":\"0.1.0\",\"pid\":" + std::to_string(pid) +
         ",\"ppid\":1,\"rank\":" + std::to_string(rank) +
         ",\"host\":\"h\",\"start_unix_ns\":" + std::to_string(start) +
         ",\"argv\":[\"./a\"],\"mode\":\"guard\",\"options\":{}}\n";
}

std::string call(int seq, long long ts, const char *api = "cudaMalloc") {
  return "{\"k\":\"call\",\"seq\":" + std::to_string(seq) + ",\"ts\":" + std::to_string(ts) +
         ",\"tid\":10,\"api\":\"" + api + "\",\"res\":0,\"dur\":5,\"args\":{}}\n";
}

const std::string kEnd = "{\"k\":\"end\",\"ts\":99}\n";

}  // namespace

TEST_CASE("a log of a newer format is refused with a message naming both versions") {
  ReadResult r = read_log_text(header(2) + call(1, 5) + kEnd, "new.log");
  CHECK(r.status == ReadStatus::NewerFormat);
  CHECK(r.error == "log format 2 is newer than this cumemguard understands (1)");
}

TEST_CASE("the current format is read, with header fields") {
  ReadResult r = read_log_text(header(1, 1234, 77, 3) + call(1, 5) + kEnd, "ok.log");
  REQUIRE(r.status == ReadStatus::Ok);
  CHECK(r.log.header.format == 1);
  CHECK(r.log.header.pid == 77);
  CHECK(r.log.header.rank == 3);
  CHECK(r.log.header.start_unix_ns == 1234);
  CHECK(r.log.header.argv == std::vector<std::string>{"./a"});
  CHECK_FALSE(r.log.truncated());
  CHECK(r.log.end_ts == 99);
}

TEST_CASE("files that are not logs are told apart from logs") {
  CHECK(read_log_text("", "empty").status == ReadStatus::NotALog);
  CHECK(read_log_text("hello\n", "text").status == ReadStatus::NotALog);
  CHECK(read_log_text("{\"k\":\"call\"}\n", "no header").status == ReadStatus::NotALog);
  CHECK(read_log_text("{\"cumemguard_log\":\"1\"}\n", "string version").status ==
        ReadStatus::NotALog);
  CHECK(read_log_text("{\"cumemguard_log\":0}\n", "format 0").status == ReadStatus::NotALog);
  CHECK(read_log_file("/nonexistent/cumemguard.log").status == ReadStatus::Unreadable);
}

TEST_CASE("a cut-off last line and a missing end record make the log truncated, not unreadable") {
  SECTION("partial last line") {
    std::string text =
        header() + call(1, 5) + call(2, 6) + "{\"k\":\"call\",\"seq\":3,\"ts\":7,\"ap";
    ReadResult r = read_log_text(text, "cut.log");
    REQUIRE(r.status == ReadStatus::Ok);
    CHECK(r.log.partial_last_line);
    CHECK(r.log.truncated());
    CHECK(r.events.size() == 2);
    CHECK(r.log.records == 2);
    CHECK(r.log.malformed == 0);
  }
  SECTION("complete lines but no end record") {
    ReadResult r = read_log_text(header() + call(1, 5), "noend.log");
    REQUIRE(r.status == ReadStatus::Ok);
    CHECK_FALSE(r.log.partial_last_line);
    CHECK(r.log.truncated());
  }
  SECTION("a last line without newline that parses is kept") {
    std::string text = header() + call(1, 5) + "{\"k\":\"end\",\"ts\":9}";
    ReadResult r = read_log_text(text, "nonl.log");
    REQUIRE(r.status == ReadStatus::Ok);
    CHECK_FALSE(r.log.truncated());
  }
  SECTION("a broken line in the middle is counted, the rest is read") {
    std::string text = header() + call(1, 5) + "{\"k\":\"ca\n" + call(2, 6) + kEnd;
    ReadResult r = read_log_text(text, "mid.log");
    REQUIRE(r.status == ReadStatus::Ok);
    CHECK(r.log.malformed == 1);
    CHECK_FALSE(r.log.partial_last_line);
    CHECK(r.events.size() == 2);
  }
}

TEST_CASE("unknown record kinds are skipped and counted; unknown fields are ignored") {
  std::string text = header() +
                     "{\"k\":\"gpu_util\",\"seq\":1,\"ts\":1,\"util\":0.5}\n"
                     "{\"k\":\"call\",\"seq\":2,\"ts\":2,\"tid\":10,\"api\":\"cudaFree\",\"res\":0,"
                     "\"args\":{\"ptr\":\"0x10\"},\"dev\":0,\"mem\":\"linear\",\"delta\":-16,"
                     "\"stream_ordered\":true,\"extra\":{\"a\":[1]}}\n"
                     "{\"k\":\"gpu_util\",\"seq\":3,\"ts\":3}\n" +
                     "{\"k\":\"topology\"}\n" + kEnd;
  ReadResult r = read_log_text(text, "unknown.log");
  REQUIRE(r.status == ReadStatus::Ok);
  CHECK(r.log.unknown_kinds ==
        std::map<std::string, std::size_t>{{"gpu_util", 2}, {"topology", 1}});
  CHECK(r.log.malformed == 0);
  REQUIRE(r.events.size() == 1);
  const auto &c = std::get<Call>(r.events[0].body);
  CHECK(c.api == "cudaFree");
  CHECK(c.delta == -16);
  CHECK(c.mem == "linear");
}

TEST_CASE("known records without their required fields are malformed, not fatal") {
  std::string text = header() + "{\"k\":\"call\",\"seq\":1,\"ts\":1}\n" +  // no api
                     "{\"k\":\"call\",\"ts\":1,\"api\":\"cudaFree\"}\n" +  // no seq
                     "{\"k\":\"stack\",\"id\":1,\"pcs\":[\"0xzz\"]}\n" +   // bad pc
                     "[1,2]\n" + call(4, 4) + kEnd;
  ReadResult r = read_log_text(text, "bad.log");
  REQUIRE(r.status == ReadStatus::Ok);
  CHECK(r.log.malformed == 4);
  CHECK(r.events.size() == 1);
}

TEST_CASE("addresses as hex strings keep all 64 bits") {
  std::string text = header() +
                     "{\"k\":\"module\",\"path\":\"/x.so\",\"base\":\"0xffffffffff600000\","
                     "\"size\":4096}\n"
                     "{\"k\":\"stack\",\"id\":7,\"pcs\":[\"0xffffffffffffffff\",\"0x1\"]}\n" +
                     kEnd;
  ReadResult r = read_log_text(text, "hex.log");
  REQUIRE(r.status == ReadStatus::Ok);
  REQUIRE(r.log.modules.size() == 1);
  CHECK(r.log.modules[0].base == 0xffffffffff600000ull);
  CHECK(r.log.stacks.at(7) == std::vector<std::uint64_t>{0xffffffffffffffffull, 1});
  CHECK(parse_hex("0x10") == 16u);
  CHECK(parse_hex("16") == 16u);
  CHECK_FALSE(parse_hex("0x").has_value());
  CHECK_FALSE(parse_hex("12ab").has_value());
  CHECK(hex(0x7f3a00000000ull) == "0x7f3a00000000");
}

TEST_CASE("events are ordered by seq, not by line") {
  ReadResult r = read_log_text(header() + call(3, 30) + call(1, 10) + call(2, 20) + kEnd, "o.log");
  REQUIRE(r.status == ReadStatus::Ok);
  REQUIRE(r.events.size() == 3);
  CHECK(r.events[0].seq == 1);
  CHECK(r.events[1].seq == 2);
  CHECK(r.events[2].seq == 3);
}

TEST_CASE("merging orders logs by start time plus ts and keeps each log's seq order") {
  // Log A starts at t=1000, log B at t=500. B's events at absolute 600 and 1600, A's at 1100,
  // 1600 (a tie with B: the log given first wins) and, by seq, one whose ts went backwards (the
  // threads of one process may stamp out of order): seq order is kept within a log.
  const std::string a = header(1, 1000) + call(1, 100) + call(2, 600) + call(3, 550) + kEnd;
  const std::string b = header(1, 500) + call(1, 100) + call(2, 1100) + kEnd;
  LogReader ra(text_source(a), "a"), rb(text_source(b), "b");
  REQUIRE(ra.open());
  REQUIRE(rb.open());
  std::vector<LogReader *> readers{&ra, &rb};
  std::vector<std::pair<std::size_t, std::uint64_t>> got;
  merge_logs(readers, [&](std::size_t log, const Event &e) { got.emplace_back(log, e.seq); });
  const std::vector<std::pair<std::size_t, std::uint64_t>> want = {
      {1, 1}, {0, 1}, {0, 2}, {0, 3}, {1, 2}};
  CHECK(got == want);
  CHECK(rel_time(ra.log().header, 100, 500) == 600);
}

TEST_CASE("values nested 100,000 deep are read, kept bounded and marked where cut") {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string text = header() +
                           "{\"k\":\"finding\",\"seq\":1,\"ts\":1,\"tid\":1,\"class\":\"double-free\","
                           "\"api\":\"cudaFree\",\"args\":{\"a\":" + deep + "},\"state\":" + deep +
                           "}\n" + kEnd;
  ReadResult r = read_log_text(text, "deep.log");
  REQUIRE(r.status == ReadStatus::Ok);
  REQUIRE(r.events.size() == 1);
  const auto &f = std::get<Finding>(r.events[0].body);
  CHECK(f.state_json.size() < 200);
  CHECK(f.state_json.find("[nested deeper than 32 levels: cut]") != std::string::npos);
  CHECK(f.args_json.find("nested deeper than") != std::string::npos);
  CHECK(r.log.malformed == 0);
}

TEST_CASE("bounded JSON stays valid when cut by depth or size, and refuses what is not JSON") {
  CHECK(bounded_json("{\"a\":[1,2,{\"b\":null}]}", 32, 1000) == "{\"a\":[1,2,{\"b\":null}]}");
  CHECK(bounded_json("[[[1]]]", 2, 1000) == "[[\"[nested deeper than 2 levels: cut]\"]]");
  std::string many = "[";
  for (int i = 0; i < 1000; ++i) many += (i ? ",\"xxxxxxxx\"" : "\"xxxxxxxx\"");
  many += "]";
  const std::string cut = bounded_json(many, 32, 100);
  CHECK(cut.size() < 160);
  CHECK(cut.find("[cut at 100 bytes]") != std::string::npos);
  CHECK(cut.back() == ']');
  CHECK(bounded_json("[1,,2]", 32, 100) == "\"[not valid JSON]\"");
  CHECK(bounded_json("{\"a\" 1}", 32, 100) == "\"[not valid JSON]\"");
  CHECK(bounded_json("\"a\x01" "b\"", 32, 100) == "\"a\\u0001b\"");
}

TEST_CASE("text from a log has its control characters escaped, C1 included") {
  CHECK(clean("plain") == "plain");
  CHECK(clean("a\x1b[2Jb\n") == "a\\x1b[2Jb\\x0a");
  CHECK(clean("csi \xc2\x9b" "31m") == "csi \\xc2\\x9b31m");
  CHECK(clean("caf\xc3\xa9") == "caf\xc3\xa9");  // ordinary UTF-8 stays
  // U+202E (right-to-left override) made "evil_gpj.exe" print as "evil_exe.jpg"; every
  // Bidi_Control character and the line and paragraph separators are escaped byte by byte.
  CHECK(clean("evil_\xe2\x80\xae"
              "gpj.exe") == "evil_\\xe2\\x80\\xaegpj.exe");
  for (const char *bidi :
       {"\xd8\x9c", "\xe2\x80\x8e", "\xe2\x80\x8f", "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaa",
        "\xe2\x80\xab", "\xe2\x80\xac", "\xe2\x80\xad", "\xe2\x81\xa6", "\xe2\x81\xa7",
        "\xe2\x81\xa8", "\xe2\x81\xa9"}) {
    const std::string out = clean(std::string("a") + bidi + "b");
    CHECK(out.find(bidi) == std::string::npos);
    CHECK(out.size() == 2 + 4 * std::strlen(bidi));
  }
  // Their neighbours in the same blocks are text: an en dash, a bullet, U+2070.
  CHECK(clean("\xe2\x80\x93 \xe2\x80\xa2 \xe2\x81\xb0") ==
        "\xe2\x80\x93 \xe2\x80\xa2 \xe2\x81\xb0");
  // A cut sequence at the end is not read past.
  CHECK(clean("x\xe2\x80") == "x\xe2\x80");
  const std::string long_text(10000, 'x');
  CHECK(clean(long_text).size() < kMaxText + 32);
  std::string text = header() +
                     "{\"k\":\"note\",\"ts\":1,\"level\":\"warn\",\"msg\":\"x\\u001b]0;t\\u0007\"}\n" +
                     kEnd;
  ReadResult r = read_log_text(text, "esc.log");
  REQUIRE(r.log.notes.size() == 1);
  CHECK(r.log.notes[0].msg == "x\\x1b]0;t\\x07");
}

TEST_CASE("a line longer than the limit is skipped and counted, the rest is read") {
  std::string text = header() + call(1, 5) + "{\"k\":\"note\",\"msg\":\"" +
                     std::string(kMaxLine + 10, 'x') + "\"}\n" + call(2, 6) + kEnd;
  ReadResult r = read_log_text(text, "long.log");
  REQUIRE(r.status == ReadStatus::Ok);
  CHECK(r.log.overlong == 1);
  CHECK(r.log.malformed == 1);
  CHECK(r.events.size() == 2);
  CHECK_FALSE(r.log.truncated());
}

TEST_CASE("status: complete, crashed, aborted, truncated from the end record") {
  auto status = [](const std::string &end) { return read_log_text(header() + end, "s").log.status(); };
  CHECK(status(kEnd) == Status::Complete);
  CHECK(status("{\"k\":\"end\",\"ts\":9,\"signal\":11,\"signal_name\":\"SIGSEGV\"}\n") ==
        Status::Crashed);
  CHECK(status("{\"k\":\"end\",\"ts\":9,\"aborted\":true}\n") == Status::Aborted);
  CHECK(status(call(1, 5)) == Status::Truncated);
}

TEST_CASE("an output file is recognised as a log by its first line") {
  CHECK(is_log_header(header()));
  CHECK(is_log_header("{\"cumemguard_log\":2}"));
  CHECK_FALSE(is_log_header("{\"traceEvents\":[]}"));
  CHECK_FALSE(is_log_header("<!DOCTYPE html>"));
}
