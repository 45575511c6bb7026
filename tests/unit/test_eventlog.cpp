// SPDX-License-Identifier: Apache-2.0
// The log writer: every line it builds is valid JSON (also when cut short), paths expand, and a
// written log reads back with a real JSON parser.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
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

// The numbers are written by hand, digits counted first (jsonnum.h): each count's first and
// last value, and the values around them, as printf writes them.
TEST_CASE("numbers at every digit and hex-digit count are written like printf writes them") {
  std::vector<std::uint64_t> vs = {0, 1, 9, UINT64_MAX, UINT64_MAX - 1};
  for (std::uint64_t p = 10; p <= 10000000000000000000ull; p *= 10) {
    vs.insert(vs.end(), {p - 1, p, p + 1});
    if (p > UINT64_MAX / 10) break;
  }
  for (int b = 1; b < 64; ++b) vs.insert(vs.end(), {(1ull << b) - 1, 1ull << b});
  for (std::uint64_t v : vs) {
    char buf[256];
    JsonLine j(buf, sizeof buf);
    const auto sv = static_cast<std::int64_t>(v);
    j.unum("u", v)
        .num("i", sv)
        .num("n", v == 0 ? 0 : -static_cast<std::int64_t>(v >> 1))
        .hex("h", v);
    char want[256];
    std::snprintf(want, sizeof want, "{\"u\":%llu,\"i\":%lld,\"n\":%lld,\"h\":\"%#llx\"}\n",
                  static_cast<unsigned long long>(v), static_cast<long long>(sv),
                  v == 0 ? 0LL : -static_cast<long long>(v >> 1),
                  static_cast<unsigned long long>(v));
    if (v == 0) std::snprintf(want, sizeof want, "{\"u\":0,\"i\":0,\"n\":0,\"h\":\"0x0\"}\n");
    INFO("value " << v);
    CHECK(std::string(j.finish()) == want);
  }
}

// The call record's numbers, names and flags are written without a check each once fits() says
// their largest size fits (Call::write_record): at every buffer size the line must be the one
// the checked members write, cut in the same place.
TEST_CASE("JsonLine's unchecked members write the checked members' bytes at every size") {
  auto members = [](auto &w) {
    w.ident("k", "call")
        .unum("seq", 2)
        .unum("ts", 219068483)
        .unum("tid", 3816)
        .ident("api", "cuMemAlloc_v2")
        .num("res", 0)
        .unum("dur", 3430287)
        .begin_object("args")
        .unum("size", 2097152)
        .hex("ptr", 0x500000000000ull)
        .end_object()
        .num("dev", 0)
        .ident("mem", "linear")
        .num("delta", -2097152)
        .boolean("skipped", true);
  };
  const std::size_t bound = 11 + 5 * 27 + 24 + 11 + 28 + 27 + 27 + 15 + 29 + 16;
  for (std::size_t cap = 56; cap <= 400; ++cap) {
    std::vector<char> a(cap), b(cap);
    JsonLine checked(a.data(), cap), fast(b.data(), cap);
    members(checked);
    if (fast.fits(bound)) {
      JsonLine::Unchecked u(fast);
      members(u);
    } else {
      members(fast);
    }
    INFO("cap " << cap);
    CHECK(std::string(fast.str("va_state", "sleeping").finish()) ==
          std::string(checked.str("va_state", "sleeping").finish()));
  }
  char buf[2048];
  JsonLine j(buf, sizeof buf);
  REQUIRE(j.fits(bound));
  {
    JsonLine::Unchecked u(j);
    members(u);
  }
  CHECK(
      std::string(j.finish()) ==
      "{\"k\":\"call\",\"seq\":2,\"ts\":219068483,\"tid\":3816,\"api\":\"cuMemAlloc_v2\",\"res\":0,"
      "\"dur\":3430287,\"args\":{\"size\":2097152,\"ptr\":\"0x500000000000\"},\"dev\":0,"
      "\"mem\":\"linear\",\"delta\":-2097152,\"skipped\":true}\n");
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

namespace {
struct TempDir {
  char path[32] = "/tmp/cmg-logtest-XXXXXX";
  TempDir() { REQUIRE(mkdtemp(path)); }
  ~TempDir() {
    std::string cmd = std::string("rm -rf ") + path;
    (void)!std::system(cmd.c_str());
  }
  std::string operator/(const char *name) const { return std::string(path) + "/" + name; }
};

std::vector<json> read_lines(const std::string &path) {
  std::ifstream in(path);
  std::string line;
  std::vector<json> out;
  while (std::getline(in, line)) out.push_back(json::parse(line));
  return out;
}

const char *test_env(const char *name) {
  if (std::string(name) == "JOB") return "a/b\x01" "c";
  return nullptr;
}
}  // namespace

TEST_CASE("Log names: every placeholder, values as one file-name component, unknown ones kept") {
  cmg::shim::LogNameInputs in;
  in.pid = 42;
  in.rank = 3;
  in.local_rank = -1;
  in.host = "node/7";
  in.program = "python3";
  in.getenv = test_env;
  auto n = cmg::shim::expand_log_name("cg.%p.%r.%l.%h.%e.%q{JOB}.%q{NONE}.%%", in);
  CHECK(n.path == "cg.42.3.na.node_7.python3.a_b_c..%");
  // Each value that had to be changed is named once, and so is a variable that is not set.
  REQUIRE(n.problems.size() == 3);
  CHECK(n.problems[0] ==
        "CUMEMGUARD_LOG: the value of %h ('node/7') holds '/' or control characters; written "
        "with '_' for them (a value is one file-name component, never a directory)");
  CHECK(n.problems[1].find("the value of %q{JOB} ('a/b\\x01c')") != std::string::npos);
  CHECK(n.problems[2] ==
        "CUMEMGUARD_LOG: %q{NONE}: the environment variable NONE is not set; written as nothing "
        "(set it, or leave %q{NONE} out)");
  CHECK(n.unset == std::vector<std::string>{"NONE"});
  n = cmg::shim::expand_log_name("x.%x.%x.%q.%q{}.%", in);
  CHECK(n.path == "x.%x.%x.%q.%q{}.%");
  REQUIRE(n.problems.size() == 3);  // %x once, %q (both forms) once, the lone % once
  CHECK(n.problems[0].find("'%x'") != std::string::npos);
  CHECK(n.problems[1].find("'%q'") != std::string::npos);
  CHECK(n.problems[2].find("'%'") != std::string::npos);
}

const char *dots_env(const char *name) {
  const std::string n(name);
  return n == "JOB" ? ".." : n == "DOT" ? "." : n == "SUB" ? "x.." : nullptr;
}

TEST_CASE("Log names: a value never makes a '.' or '..' component") {
  cmg::shim::LogNameInputs in;
  in.pid = 7;
  in.getenv = dots_env;
  // JOB=.. climbed out of /logs: /logs/../x.log is /x.log.
  auto n = cmg::shim::expand_log_name("/logs/%q{JOB}/x.log", in);
  CHECK(n.path == "/logs/__/x.log");
  REQUIRE(n.problems.size() == 1);
  CHECK(n.problems[0] ==
        "CUMEMGUARD_LOG: a placeholder's value makes the path component '..'; written as '__' "
        "(a value never names a directory)");
  // Said once however often; "." too, and a component made of a value and written dots.
  n = cmg::shim::expand_log_name("/l/%q{JOB}/%q{JOB}/%q{DOT}/%q{DOT}./a.%q{SUB}/%p.log", in);
  CHECK(n.path == "/l/__/__/_/__/a.x../7.log");
  CHECK(n.problems.size() == 2);
  // Dots the pattern itself writes are the user's: kept.
  n = cmg::shim::expand_log_name("/l/../%q{NONE}./x", in);
  CHECK(n.path == "/l/.././x");
  REQUIRE(n.problems.size() == 1);  // only that NONE is not set
  CHECK(n.problems[0].find("NONE is not set") != std::string::npos);
}

TEST_CASE("Local rank comes from LOCAL_RANK, then the launchers' variables") {
  for (const char *v : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                        "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    unsetenv(v);
  CHECK(cmg::shim::local_rank_from_env() == -1);
  setenv("SLURM_LOCALID", "5", 1);
  CHECK(cmg::shim::local_rank_from_env() == 5);
  setenv("MPI_LOCALRANKID", "4", 1);
  CHECK(cmg::shim::local_rank_from_env() == 4);
  setenv("LOCAL_RANK", "1", 1);
  CHECK(cmg::shim::local_rank_from_env() == 1);
  // Slurm's global rank comes last: under torchrun in an sbatch job it is the launcher's.
  setenv("SLURM_PROCID", "9", 1);
  setenv("OMPI_COMM_WORLD_RANK", "7", 1);
  CHECK(cmg::shim::rank_from_env() == 7);
  for (const char *v : {"LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", "SLURM_PROCID",
                        "OMPI_COMM_WORLD_RANK"})
    unsetenv(v);
}

// A hard link at the log path was truncated (the link's other name lost its bytes).
TEST_CASE("EventLog refuses a file with another link and a file of another user anywhere") {
  TempDir d;
  {
    std::ofstream(d / "precious") << "precious\n";
  }
  REQUIRE(link((d / "precious").c_str(), (d / "log").c_str()) == 0);
  EventLog l1;
  CHECK(l1.open(d / "log").find("2 links") != std::string::npos);
  std::ifstream in(d / "precious");
  std::string content;
  std::getline(in, content);
  CHECK(content == "precious");
  if (geteuid() == 0) {  // a directory that is not sticky: the owner rule applies all the same
    {
      std::ofstream(d / "theirs") << "theirs\n";
    }
    REQUIRE(chown((d / "theirs").c_str(), 65534, 65534) == 0);
    EventLog l2;
    CHECK(l2.open(d / "theirs").find("another user") != std::string::npos);
  }
}

TEST_CASE("LogLine writes a record longer than its buffer as one line, whatever else is written") {
  TempDir d;
  EventLog log;
  REQUIRE(log.open(d / "log").empty());
  const std::string msg(100000, 'm');
  std::string state = "{\"list\":[";
  for (int i = 0; i < 5000; ++i) state += (i ? "," : "") + std::to_string(i);
  state += "]}";
  std::atomic<bool> stop{false};
  std::thread other([&] {
    char buf[128];
    for (int i = 0; !stop; ++i) {
      JsonLine j(buf, sizeof buf);
      j.str("k", "call").num("i", i);
      log.write(j.finish(), 0);
    }
  });
  for (int r = 0; r < 20; ++r) {
    cmg::shim::LogLine j(log);
    j.str("k", "finding").str("msg", msg).raw("state", state).num("r", r);
    j.commit(0);
  }
  stop = true;
  other.join();
  log.seal();
  int findings = 0;
  for (const json &v : read_lines(d / "log")) {
    if (v["k"] != "finding") continue;
    CHECK(v["msg"].get<std::string>() == msg);
    CHECK(v["state"]["list"].size() == 5000);
    CHECK_FALSE(v.contains("cut"));
    CHECK(v["r"] == findings);
    ++findings;
  }
  CHECK(findings == 20);
}

// The last records before a program went quiet stayed in the buffer until the next record, which
// never came: a job killed while hung lost them.
TEST_CASE("EventLog writes a quiet buffer out within a second, from its flusher") {
  TempDir d;
  EventLog log;
  REQUIRE(log.open(d / "log").empty());
  char buf[128];
  JsonLine j(buf, sizeof buf);
  j.str("k", "call").num("i", 1);
  log.write(j.finish(), 0);
  std::size_t n = 0;
  for (int i = 0; i < 100 && n == 0; ++i) {  // well above the second: no tight timing
    usleep(50000);
    n = read_lines(d / "log").size();
  }
  CHECK(n == 1);
}

// A host closed the log's descriptor and opened files of its own, which got the number: records
// went into the host's file.
TEST_CASE("EventLog never writes to a number it lost; it opens its file again") {
  TempDir d;
  EventLog log;
  REQUIRE(log.open(d / "log").empty());
  int fd = -1;
  for (int i = 0; i < 4096 && fd < 0; ++i) {
    char link[64], target[512];
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", i);
    const ssize_t k = readlink(link, target, sizeof target - 1);
    if (k > 0 && std::string(target, static_cast<std::size_t>(k)) == d / "log") fd = i;
  }
  REQUIRE(fd >= 64);  // above the range hosts use
  const int host = ::open((d / "host").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  REQUIRE(dup2(host, fd) == fd);  // the host's file at the log's number
  char buf[128];
  JsonLine j(buf, sizeof buf);
  j.str("k", "call").num("i", 7);
  log.write(j.finish(), 0);
  log.flush();
  struct stat st;
  REQUIRE(fstat(host, &st) == 0);
  CHECK(st.st_size == 0);
  const auto recs = read_lines(d / "log");
  REQUIRE(recs.size() == 2);  // the note about the reopening, then the record
  CHECK(recs[0]["k"] == "note");
  CHECK(recs[1]["i"] == 7);
  ::close(host);
  ::close(fd);
}

// A SIGTERM handler that calls exit() runs the exit paths on a thread that may hold the log's
// lock for good: they must not wait for it.
TEST_CASE("After exit began, a write does not wait for a lock that is never given back") {
  TempDir d;
  EventLog log;
  REQUIRE(log.open(d / "log").empty());
  std::atomic<int> step{0};
  std::thread holder([&] {
    const auto how = log.begin_pieces();  // takes the lock, as a record built in pieces does
    step = 1;
    while (step != 2) usleep(1000);
    log.end_pieces(how, "{\"k\":\"late\"}\n", 0);
  });
  while (step != 1) usleep(1000);
  log.exit_begin();
  char buf[128];
  JsonLine j(buf, sizeof buf);
  j.str("k", "end");
  log.write(j.finish(), 0);  // returns after a bounded wait, written directly
  const auto recs = read_lines(d / "log");
  REQUIRE(recs.size() == 1);
  CHECK(recs[0]["k"] == "end");
  step = 2;
  holder.join();
}

TEST_CASE("EventLog leaves a log held or written in this run; an earlier run's is replaced") {
  TempDir d;
  const std::string path = d / "same.log";
  bool taken = true;
  auto first = std::make_unique<EventLog>();
  REQUIRE(first->open(path, "run-1", &taken).empty());
  CHECK_FALSE(taken);
  // Held: the first writer keeps the file's lock while it lives (another open file, as another
  // process has).
  EventLog second;
  CHECK(second.open(path, "run-1", &taken).find("another process") != std::string::npos);
  CHECK(taken);
  CHECK_FALSE(second.is_open());
  const std::string header = R"({"cumemguard_log":1,"options":{"CUMEMGUARD_RUN_ID":"run-1"}})" "\n";
  first->write(header, 0);
  first->write("{\"k\":\"finding\"}\n", 0);
  first->flush();
  first.reset();  // the writer is gone: its lock with it
  // Written by this run: still not ours to truncate.
  EventLog third;
  CHECK_FALSE(third.open(path, "run-1", &taken).empty());
  CHECK(taken);
  CHECK(read_lines(path).size() == 2);
  // A run id only in a string (argv) is not the key: and another run's log is replaced.
  EventLog fourth;
  CHECK(fourth.open(path, "run-2", &taken).empty());
  CHECK_FALSE(taken);
  CHECK(read_lines(path).empty());
  CHECK(cmg::shim::log_name_candidate(path, 42, 0) == path);
  CHECK(cmg::shim::log_name_candidate(path, 42, 1) == path + ".42");
  CHECK(cmg::shim::log_name_candidate(path, 42, 3) == path + ".42.2");
}

TEST_CASE("EventLog finds the run id in a header longer than one read, cut across reads") {
  TempDir d;
  const std::string path = d / "long.log";
  for (std::size_t pad : {65536u - 40u, 65536u - 20u, 65536u - 3u, 200000u}) {
    {
      std::ofstream out(path, std::ios::trunc);
      out << R"({"cumemguard_log":1,"argv":[")" << std::string(pad, 'a')
          << R"(\"CUMEMGUARD_RUN_ID\":\"r\""],"options":{"CUMEMGUARD_RUN_ID":"r"}})" << "\n";
    }
    bool taken = false;
    EventLog l;
    CHECK_FALSE(l.open(path, "r", &taken).empty());
    CHECK(taken);
    // The same text quoted inside argv alone does not make it this run's.
    {
      std::ofstream out(path, std::ios::trunc);
      out << R"({"cumemguard_log":1,"argv":[")" << std::string(pad, 'a')
          << R"(\"CUMEMGUARD_RUN_ID\":\"r\""],"options":{}})" << "\n";
    }
    EventLog m;
    CHECK(m.open(path, "r", &taken).empty());
    CHECK_FALSE(taken);
  }
}
