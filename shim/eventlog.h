// SPDX-License-Identifier: Apache-2.0
// The event log writer (docs/log-format.md): JSON lines built in a fixed buffer and written with
// write(2) in whole lines, so a killed process leaves a log that parses up to its last line.
// Never spdlog: its statics can be gone while frameworks still free memory from destructors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

namespace cmg::shim {

// Appends one JSON object to a caller-provided buffer without allocating. Strings are escaped;
// when the buffer runs short, string values are cut and the object is still closed properly.
class JsonLine {
 public:
  JsonLine(char *buf, std::size_t cap);
  JsonLine &str(std::string_view key, std::string_view v);
  JsonLine &hex(std::string_view key, std::uint64_t v);
  JsonLine &num(std::string_view key, std::int64_t v);
  JsonLine &unum(std::string_view key, std::uint64_t v);
  JsonLine &boolean(std::string_view key, bool v);
  JsonLine &raw(std::string_view key, std::string_view json);  // an already-rendered JSON value
  JsonLine &begin_object(std::string_view key);
  JsonLine &end_object();
  JsonLine &begin_array(std::string_view key);
  JsonLine &end_array();
  // Array elements (inside begin_array): a string or a hex string or raw JSON.
  JsonLine &elem_str(std::string_view v);
  JsonLine &elem_hex(std::uint64_t v);
  JsonLine &elem_raw(std::string_view json);
  // Closes the object and adds '\n'. The view stays valid while the buffer lives.
  std::string_view finish();

 private:
  bool room(std::size_t n);
  void put(std::string_view s);
  void put_escaped(std::string_view s);
  bool key(std::string_view k, std::size_t extra);
  bool elem(std::size_t n);
  char *buf_;
  std::size_t cap_, len_ = 0;
  bool first_ = true;
  int skip_ = 0;   // objects/arrays left out because they did not fit
  int depth_ = 0;  // objects/arrays open: one closing byte each is kept free (fuzz_jsonline found
                   // deep nesting writing its closing brackets past the buffer)
  bool cut_ = false;
};

class EventLog {
 public:
  // Opens path (O_NOFOLLOW, created with the caller's umask). Returns an error text on failure.
  std::string open(const std::string &path);
  bool is_open() const { return fd_.load(std::memory_order_acquire) >= 0; }
  const std::string &path() const { return path_; }
  // Appends one complete line ('\n'-terminated). Flushes when the buffer fills or a second passed.
  void write(std::string_view line, std::uint64_t now_ns);
  void flush();
  // fork(): the lock is held across it; the child forgets the parent's descriptor and buffer
  // (it writes a log of its own).
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child();
  // Exit: write everything; the `end` record was the last line, so later writes are dropped (calls
  // after the exit summary, from other threads or late destructors, are still handled, not logged).
  void seal();
  // From a fatal-signal handler (crash.cpp): flushes the buffer if the lock is free (a try-lock,
  // kept: the process is about to end) and appends `lines` with write(2). Async-signal-safe.
  void write_from_signal(std::string_view lines);

 private:
  void flush_locked();
  void write_locked(std::string_view data);  // write(2) until done or failed
  // Atomic: hooks ask is_open() without the lock, and a failed write stops every later one.
  std::atomic<int> fd_{-1};
  std::string path_;
  std::mutex mu_;
  static constexpr std::size_t kBuf = 1 << 16;
  char buf_[kBuf];
  std::size_t used_ = 0;
  std::uint64_t last_flush_ns_ = 0;
  bool sealed_ = false;
  std::atomic<bool> write_failed_{false};
};

// "%p" -> pid, "%r" -> rank ("na" without one), "%%" -> "%".
std::string expand_log_path(std::string_view pattern, long pid, int rank);
// RANK, then SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK; -1 when none is set.
int rank_from_env();

}  // namespace cmg::shim
