// SPDX-License-Identifier: Apache-2.0
// The files `cumemguard run` handles itself: the private directory where each process of the
// program keeps its status record (policy/run_status.h), made before the program starts and read
// back after it, and the check that the event log can be written at all, made before it starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "run_status.h"

namespace cmg::tools {

// What the status records of one run add up to.
struct RunTotals {
  std::uint64_t findings = 0, leaks = 0;
  std::uint64_t by_class[RunStatusRecord::kClasses] = {};
  std::size_t processes = 0;        // records read
  std::size_t unreadable = 0;       // entries that are not a record of this layout (said once)
  std::size_t loaded = 0;           // process images that loaded the shim (<pid>.loaded marks)
  std::size_t leaks_unchecked = 0;  // processes that ended by _exit: their leaks were not checked
  std::size_t signalled = 0;        // processes a fatal signal ended (the shim's crash records):
                                    // their leaks were not checked either
  std::vector<std::string> logs;    // the logs the processes opened, in the order they started
  // Processes that activated and never reached the shim's exit records (neither an exit nor a
  // fatal signal the shim saw): killed by SIGKILL or the out-of-memory killer, an exec (unless the
  // new image has a record of its own), the exit_group system call itself, or still running.
  // Their pid and log (empty: none), by start.
  struct Unfinished {
    std::int64_t pid;
    std::string log;
  };
  std::vector<Unfinished> unfinished;
};

// A directory only this user can enter (mkdtemp, mode 0700) under $TMPDIR or /tmp; empty with
// err set when none can be made.
std::string make_status_dir(std::string &err);
// Every record in dir. Each entry is opened without following a link and without blocking, and
// read only when it is a regular file of this user of exactly one record's size: a FIFO, a
// /dev/zero link or a huge file the program left there is counted as unreadable, never waited on.
RunTotals read_status_dir(const std::string &dir);
// Removes the records (and whatever else the program left in dir), then dir itself.
void remove_status_dir(const std::string &dir);

// A launcher run inside another's program (a script that calls `cumemguard run` itself) hands
// what its own run counted to the outer launcher's directory: records in the same layout, the
// first with the totals, one per log, so the outer exit status and list of logs include them.
void pass_up_totals(const std::string &outer_dir, const RunTotals &t);

// Why an event log named by pattern (CUMEMGUARD_LOG's placeholders) cannot be written, or empty:
// its directory is missing or not a directory, a file cannot be created there (tried: a new name
// is created and removed again, as root passes every permission check), or (a name without
// placeholders) the file there is one the shim refuses (policy/log_file.h), is not a regular file
// (a character device such as /dev/null: the run lists its log to be read), cannot be opened for
// writing, or is a non-empty file that is not a cumemguard log (run_checks.h). A directory part
// holding placeholders is checked up to its last fixed directory.
std::string log_target_problem(const std::string &pattern);

}  // namespace cmg::tools
