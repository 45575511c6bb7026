// SPDX-License-Identifier: Apache-2.0
// The launcher's status directory (tools/run_files.h): what a nested run hands up to the outer
// one is read back there as it was counted, whatever the number of records.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "run_files.h"

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/cmg-run-files-XXXXXX";
    REQUIRE(mkdtemp(t));
    path = t;
  }
  ~TempDir() { cmg::tools::remove_status_dir(path); }
};

}  // namespace

// 5,000 logs, two processes that ended by _exit and one a fatal signal ended: every record is
// read back (the names' search started at the first name each time and ran out after 4,096),
// with the states as counted, also past names another record already took.
TEST_CASE("pass_up_totals: every record reaches the outer directory", "[run_files]") {
  TempDir d;
  // A name the search must step over: taken before (a shim of this pid, an earlier launcher).
  const std::string taken = d.path + "/" + std::to_string(getpid()) + ".64";
  const int fd = ::open(taken.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  cmg::tools::RunTotals t;
  t.findings = 3;
  t.leaks = 2;
  t.leaks_unchecked = 2;
  t.signalled = 1;
  for (int i = 0; i < 5000; ++i) t.logs.push_back("/tmp/x." + std::to_string(i) + ".log");
  cmg::tools::pass_up_totals(d.path, t);
  const cmg::tools::RunTotals back = cmg::tools::read_status_dir(d.path);
  CHECK(back.processes == 5000);
  CHECK(back.unreadable == 1);  // the empty file planted at the first name
  CHECK(back.findings == 3);
  CHECK(back.leaks == 2);
  CHECK(back.leaks_unchecked == 2);
  CHECK(back.signalled == 1);
  REQUIRE(back.logs.size() == 5000);
  CHECK(back.unfinished.empty());
}

// No log and nothing unchecked: one record with the counts.
TEST_CASE("pass_up_totals: a run without logs hands up one record", "[run_files]") {
  TempDir d;
  cmg::tools::RunTotals t;
  t.findings = 1;
  cmg::tools::pass_up_totals(d.path, t);
  const cmg::tools::RunTotals back = cmg::tools::read_status_dir(d.path);
  CHECK(back.processes == 1);
  CHECK(back.findings == 1);
  CHECK(back.leaks_unchecked == 0);
  CHECK(back.signalled == 0);
  CHECK(back.logs.empty());
}
