// SPDX-License-Identifier: Apache-2.0
// The event log writer (docs/log-format.md): JSON lines built in a fixed buffer and written with
// write(2) in whole lines, so a killed process leaves a log that parses up to its last line.
// Never spdlog: its statics can be gone while frameworks still free memory from destructors.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "jsonline.h"
#include "logname.h"

namespace cmg::shim {

class EventLog {
 public:
  EventLog() = default;
  // The shim's log is never destroyed (frees from static destructors are still logged); one that
  // is (the unit tests') first stops its flusher.
  ~EventLog();
  EventLog(const EventLog &) = delete;
  EventLog &operator=(const EventLog &) = delete;
  // Opens path for a log of this process. Only a regular file the effective user owns with one
  // link, a new file, or a character device (/dev/null) is used; a symbolic link, a FIFO or
  // socket, a file of another user (planted in a shared directory) or with other names (a hard
  // link to a file the attacker chose) is refused before anything is changed. Returns an error
  // text on failure. The descriptor is kept above the host's range (owned_fd.h).
  // A regular file another process writes (it holds the file's lock) or wrote in this run (its
  // header names run_id) is left alone: `taken` is set, and the caller tries the next name.
  std::string open(const std::string &path, std::string_view run_id = {}, bool *taken = nullptr);
  bool is_open() const { return fd_.load(std::memory_order_acquire) >= 0; }
  const std::string &path() const { return path_; }
  // Appends one complete line ('\n'-terminated). It reaches the file when the buffer fills, when a
  // record comes more than a second after the last write-out, at flush(), and otherwise within a
  // second from the flusher thread (started at the first record): a killed process loses at most
  // the last second, with no cost per call.
  void write(std::string_view line, std::uint64_t now_ns);
  void flush();
  // A record written in pieces (LogLine below): the lock is held from the first piece to the last,
  // so no other record comes between them.
  enum class Pieces : std::uint8_t { Locked, Direct, Dropped };
  Pieces begin_pieces();
  void piece(Pieces how, std::string_view bytes);
  void end_pieces(Pieces how, std::string_view last, std::uint64_t now_ns);
  // fork(): the lock is held across it; the child forgets the parent's descriptor, buffer and
  // flusher (it writes a log of its own).
  void fork_prepare();
  void fork_parent();
  void fork_child();
  // Exit began (an exit handler of the shim runs): from now on no write waits long for the lock.
  // A thread that holds it and runs exit() from a signal handler (a SIGTERM handler calling
  // exit(), as many servers have) never gives it back; its records are finished from where it
  // stopped and the exit records are written directly.
  void exit_begin() { exiting_.store(true, std::memory_order_release); }
  // Exit: write everything; the `end` record was the last line, so later writes are dropped (calls
  // after the exit summary, from other threads or late destructors, are still handled, not logged).
  void seal();
  // The `end` record and the seal at once: nothing can come between them or after them.
  void write_last(std::string_view line);
  // From a fatal-signal handler (crash.cpp): writes out the buffer if the lock is free, or what a
  // writer this thread interrupted had not written yet, then `lines`. Async-signal-safe.
  // patience_ns: how long to wait (nanosleep, async-signal-safe) for another thread's write to end
  // before giving its buffer up; 0 for a crash, a moment for _exit (an ending, not a fault).
  void write_from_signal(std::string_view lines, std::uint64_t patience_ns = 0);

 private:
  static constexpr std::size_t kBuf = 1 << 16;
  bool lock();  // false: exit began and the lock is held by a thread that will not let it go
  void unlock();
  void flush_locked();
  void write_locked(std::string_view data);  // write(2) until done or failed
  void write_out(std::string_view data);
  bool ours_locked();                        // the descriptor is still the log's (reopened if not)
  void append_locked(std::string_view data);
  void start_flusher_locked();
  void flusher_loop();
  void finish_interrupted();                 // the lock's holder is this thread, interrupted
  void write_direct(std::string_view data, bool then_seal = false);  // without the lock (exit)
  bool exit_write_through() const;
  void direct_locked(std::string_view data);                         // direct_mu_ held

  // Atomic: hooks ask is_open() without the lock, and a failed write stops every later one.
  std::atomic<int> fd_{-1};
  dev_t dev_ = 0;  // what fd_ must still be (owned_fd.h)
  ino_t ino_ = 0;
  std::string path_, abs_path_;
  std::mutex mu_;
  std::mutex direct_mu_;  // writes without mu_, at exit (write_direct)
  bool line_ended_ = false;  // direct_mu_: a newline was written after a holder's half line
  std::atomic<const void *> owner_{nullptr};  // the thread holding mu_ (its marker), or null
  char buf_[kBuf];
  // What the writer has done, in the order a signal handler on its own thread can rely on.
  std::atomic<std::size_t> used_{0};
  std::atomic<long> partial_at_{-1};  // a pieced line begins at this offset; -2: before the buffer
  std::atomic<bool> writing_{false};  // write_locked is writing [out_ptr_, +out_len_) at out_start_
  const char *out_ptr_ = nullptr;
  std::size_t out_len_ = 0;
  off_t out_start_ = 0, pos_ = 0;
  std::uint64_t last_flush_ns_ = 0;
  std::atomic<bool> sealed_{false};
  std::atomic<bool> exiting_{false};
  std::atomic<int> bypass_{0};  // 1: finishing an interrupted writer's bytes; 2: done
  std::atomic<bool> write_failed_{false};
  std::condition_variable flusher_cv_;
  bool flusher_started_ = false, flusher_idle_ = false, stopping_ = false;
  bool locked_for_fork_ = false;
  bool forked_ = false, write_through_ = false;  // a forked child; one without a flusher
  bool in_signal_ = false;  // write_from_signal is writing out (under mu_)
};

// One record written through a fixed buffer: a record longer than it (a finding quoting a long
// value, a header with a long argv) reaches the log in pieces under the log's lock, so it stays
// one whole line, with no heap string per record. commit() (or the destructor) writes it.
struct LogLineBuffer {
  char buf[4096];
};
class LogLine final : private LogLineBuffer, private JsonLine::Spill, public JsonLine {
 public:
  explicit LogLine(EventLog &log) : JsonLine(buf, sizeof buf, this), log_(log) {}
  ~LogLine() {
    if (!done_) commit(0);
  }
  LogLine(const LogLine &) = delete;
  LogLine &operator=(const LogLine &) = delete;
  void commit(std::uint64_t now_ns);

 private:
  void piece(std::string_view bytes) override;
  EventLog &log_;
  EventLog::Pieces how_ = EventLog::Pieces::Dropped;
  bool spilled_ = false, done_ = false;
};

}  // namespace cmg::shim
