// SPDX-License-Identifier: Apache-2.0
// The record each process of a `cumemguard run` writes for the launcher (CUMEMGUARD_STATUS_DIR):
// its finding and leak counts and its log's path, so that the launcher's exit status and its list
// of logs never depend on finding, opening or parsing the logs (a log name with %h or a glob
// character, a forked child's LOG.<pid>, a log that could not be opened, a FIFO planted where the
// glob looked). One file per process image, one page, updated in place through a shared mapping:
// a finding is counted the moment it is made, so a process killed by SIGKILL right after it still
// counts; the exit path only stores the leak count and the state (no allocation, no system call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cmg {

struct RunStatusRecord {
  static constexpr char kMagic[8] = {'C', 'M', 'G', 'S', 'T', 'A', 'T', '1'};
  static constexpr std::uint32_t kVersion = 1;
  static constexpr std::size_t kClasses = 32;  // room for every finding class (findings.def)
  static constexpr std::size_t kLogBytes = 3584;

  // QuickExited: the process ended by _exit() or _Exit(); its counts are in, its leaks were not
  // checked (leaks stays 0: the exit path that reads the models did not run).
  enum State : std::uint32_t { Running = 1, Exited = 2, Signalled = 3, QuickExited = 4 };

  char magic[8];
  std::uint32_t version;
  std::uint32_t size;  // sizeof(RunStatusRecord): a reader of another layout refuses it
  std::int64_t pid;
  std::uint64_t start_unix_ns;
  std::uint32_t state;      // State
  std::uint32_t log_state;  // 0 no log asked for, 1 open (log holds its path), 2 could not open
  // Counted as the process's own exit summary counts them: findings not suppressed, per class in
  // findings.def order; leaks are the allocations, handles and reservations live at exit (none
  // counted in QuickExited).
  std::uint64_t findings;
  std::uint64_t leaks;
  std::uint64_t by_class[kClasses];
  std::uint32_t log_len;  // bytes of log used; longer paths are cut (log_cut)
  std::uint32_t log_cut;
  char log[kLogBytes];
};
static_assert(sizeof(RunStatusRecord) <= 4096, "one page per process");

// A record's identity (magic, layout, process) in zero-filled memory: the shim's mapping, or a
// launcher's record handed up to an outer one.
inline void start_run_status(RunStatusRecord &r, std::int64_t pid, std::uint64_t start_unix_ns) {
  std::memcpy(r.magic, RunStatusRecord::kMagic, sizeof r.magic);
  r.version = RunStatusRecord::kVersion;
  r.size = sizeof(RunStatusRecord);
  r.pid = pid;
  r.start_unix_ns = start_unix_ns;
  r.state = RunStatusRecord::Running;
}

// The log's path, cut to the record's room (log_cut says so).
inline void set_run_status_log(RunStatusRecord &r, const char *path, std::size_t len) {
  const std::size_t n = len < RunStatusRecord::kLogBytes ? len : RunStatusRecord::kLogBytes;
  std::memcpy(r.log, path, n);
  r.log_len = static_cast<std::uint32_t>(n);
  r.log_cut = n < len;
}

// Whether bytes read back from a status file are a whole record of this layout.
inline bool valid_run_status(const void *bytes, std::size_t n, RunStatusRecord &out) {
  if (n != sizeof(RunStatusRecord)) return false;
  std::memcpy(&out, bytes, n);
  return std::memcmp(out.magic, RunStatusRecord::kMagic, sizeof out.magic) == 0 &&
         out.version == RunStatusRecord::kVersion && out.size == sizeof(RunStatusRecord) &&
         out.log_len <= RunStatusRecord::kLogBytes;
}

}  // namespace cmg
