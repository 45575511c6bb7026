// SPDX-License-Identifier: Apache-2.0
// Event log writer (see eventlog.h): opening with the planted-file checks, the buffer and its
// flusher thread, descriptor ownership, and the exit and crash paths that never wait on a lock.
#include "eventlog.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>

#include "lock_within.h"
#include "log_file.h"
#include "owned_fd.h"
#include "stderr_out.h"
#include "text.h"
#include "textbuf.h"
#include "threads.h"

// Defined when the ThreadSanitizer runtime is loaded (weak: null otherwise; no dlsym, whose
// failure leaves an error buffer LeakSanitizer reports in forked children).
extern "C" void __tsan_init() __attribute__((weak));

namespace cmg::shim {
namespace {

void sleep_ns(long ns) { pause_ns(ns); }

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

// One stderr line without allocating (it may be said from the crash handler's write-out or the
// exit path), to the verified stderr only.
void warn_raw(std::string_view msg) {
  char line[1024];
  TextBuf t(line, sizeof line - 1);
  t.s("cumemguard: warning: ").s(msg);
  line[t.size()] = '\n';
  stderr_write(std::string_view(line, t.size() + 1));
}

std::string not_ours(const struct stat &st) {
  return log_file_refusal(st.st_mode, st.st_uid, st.st_nlink, geteuid());
}

// Whether the regular file at fd is another process's log, which must not be truncated: one a
// live process writes (it holds the file's lock, taken here for this process otherwise, and
// kept until it exits; flock(2) locks belong to the open file, so a forked child's copy of the
// descriptor, closed in fork_child, never gives it back), or one a process of this run wrote (its
// header names this run's CUMEMGUARD_RUN_ID). Anything else is an earlier run's, replaced as
// before. A file system without locks (ENOLCK) leaves the header check alone.
bool another_process_log(int fd, std::string_view run_id) {
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) return true;
  if (run_id.empty()) return false;
  // The header is the first line; the run id is a key of its "options" object. Inside a JSON
  // string every quote is escaped, so these bytes can only be that key.
  const std::string needle = "\"CUMEMGUARD_RUN_ID\":\"" + json_escape(run_id) + "\"";
  std::string buf(64 * 1024, '\0');
  std::size_t keep = 0;  // bytes carried over from the previous chunk (a needle cut in two)
  for (off_t off = 0; off < (off_t{1} << 20);) {
    const ssize_t n = pread(fd, buf.data() + keep, buf.size() - keep, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    const std::string_view chunk(buf.data(), keep + static_cast<std::size_t>(n));
    const std::size_t eol = chunk.find('\n');
    const std::string_view line = chunk.substr(0, eol);
    if (line.find(needle) != std::string_view::npos) return true;
    if (eol != std::string_view::npos) return false;
    off += n;
    keep = std::min(needle.size() - 1, chunk.size());
    std::memmove(buf.data(), chunk.data() + chunk.size() - keep, keep);
  }
  return false;
}

// Why a file already at the log's path must not be truncated: it holds something other than an
// event log (a source file, a result the program wrote), which a mistyped CUMEMGUARD_LOG or a
// placeholder expanding to an existing name would lose. Every event log starts with its header.
// A file that cannot be read (opened write-only) is taken as before: nothing says whose it is.
std::string not_a_log(int fd, const struct stat &st) {
  static constexpr std::string_view kHead = "{\"cumemguard_log\":";
  char head[kHead.size()];
  ssize_t n;
  do n = pread(fd, head, sizeof head, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return {};
  if (static_cast<std::size_t>(n) == sizeof head && std::string_view(head, sizeof head) == kHead)
    return {};
  return "it is a file of " + std::to_string(st.st_size) +
         " bytes that is not a cumemguard event log (refused: it would be overwritten; remove it "
         "or name another log)";
}

std::string absolute(const std::string &path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

// ---- the lock ----------------------------------------------------------------------------------
inline bool EventLog::lock() {
  if (!exiting_.load(std::memory_order_acquire)) {
    mu_.lock();
    owner_.store(this_thread_mark(), std::memory_order_release);
    return true;
  }
  for (std::uint64_t waited = 0;; waited += 200'000) {
    if (mu_.try_lock()) {
      owner_.store(this_thread_mark(), std::memory_order_release);
      return true;
    }
    // Held by this very thread: a signal handler interrupted it there and called exit().
    if (owner_.load(std::memory_order_acquire) == this_thread_mark()) return false;
    // One wait that ran out (here or in another exit path) is enough: later records go directly.
    if (waited >= kExitPatienceNs || exit_wait_gave_up()) {
      g_exit_wait_gave_up.store(true, std::memory_order_relaxed);
      return false;
    }
    sleep_ns(200'000);
  }
}

// Once exit began, a record written under the lock goes out at once: a later exit record may
// find the lock taken (another thread's call record, and after one bounded wait ran out the exit
// path tries only once) and go out directly with the seal, and nothing would write what was left
// in the buffer (ThreadSanitizer's runs of `exit-signal` lost the summary so, 1 run in 40).
inline bool EventLog::exit_write_through() const {
  return exiting_.load(std::memory_order_acquire);
}

inline void EventLog::unlock() {
  owner_.store(nullptr, std::memory_order_release);
  mu_.unlock();
}

std::string EventLog::open(const std::string &path, std::string_view run_id, bool *taken) {
  if (taken) *taken = false;
  const std::string what = "cannot open event log " + path + ": ";
  // No O_TRUNC yet: nothing is changed before the file is known to be ours. O_NONBLOCK: a FIFO
  // planted at the path would otherwise block the host in open() until someone reads it.
  // Read and write: the header of a file already there says whose it is (another_process_log).
  // O_NOCTTY: a terminal at the path is refused below, and must not become the controlling one.
  constexpr int kFlags = O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  int raw = ::open(path.c_str(), O_RDWR | kFlags, 0666);
  if (raw < 0 && errno == EACCES) raw = ::open(path.c_str(), O_WRONLY | kFlags, 0666);
  if (raw < 0) {
    int e = errno;
    std::string why = std::strerror(e);
    if (e == ELOOP) why = "it is a symbolic link (refused: a planted link could redirect the log)";
    if (e == ENXIO) why = "it is a FIFO or socket nobody reads (refused)";
    return what + why;
  }
  OwnedFd fd = OwnedFd::adopt(raw);
  if (!fd.valid()) return what + std::strerror(errno);
  struct stat st;
  std::string refuse;
  if (fstat(fd.fd, &st) != 0)
    refuse = std::strerror(errno);
  else
    refuse = not_ours(st);
  if (refuse.empty() && S_ISREG(st.st_mode) && another_process_log(fd.fd, run_id)) {
    fd.close();  // gives the lock back: the file stays as its writer left it
    if (taken) *taken = true;
    return what + "another process of the run writes or wrote it";
  }
  if (refuse.empty() && S_ISREG(st.st_mode) && st.st_size > 0) refuse = not_a_log(fd.fd, st);
  if (refuse.empty() && S_ISREG(st.st_mode) && ftruncate(fd.fd, 0) != 0)
    refuse = std::strerror(errno);
  if (!refuse.empty()) {
    fd.close();
    return what + refuse;
  }
  // Writes block normally from here on (a regular file: devices were refused above).
  fcntl(fd.fd, F_SETFL, fcntl(fd.fd, F_GETFL) & ~O_NONBLOCK);
  lock();
  path_ = path;
  abs_path_ = absolute(path);
  dev_ = fd.dev;
  ino_ = fd.ino;
  pos_ = 0;
  used_.store(0, std::memory_order_release);
  write_failed_ = false;
  fd_.store(fd.fd, std::memory_order_release);  // last: is_open() then sees the path too
  unlock();
  return {};
}

// ---- writing -----------------------------------------------------------------------------------
// The number may have been closed, or closed and reused, by the host (close_range before a
// daemon's fork, dup2 over it): never written then. The file is opened again by its path if it is
// still the same file (the log goes on); otherwise logging stops with one warning.
bool EventLog::ours_locked() {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0) return false;
  if (OwnedFd{fd, dev_, ino_}.still_ours()) return true;
  // From a signal handler the file is not opened again (the record would come from a handler in
  // the middle of whatever the thread was doing): the crash lines are dropped, nothing else.
  if (in_signal_) return false;
  // Opened by its path, messages built on the stack: this may run on the exit path.
  OwnedFd again = OwnedFd::adopt(
      ::open(abs_path_.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  char msg[1024];
  TextBuf t(msg, sizeof msg);
  t.s("the event log's descriptor ").i(fd).s(" was closed or replaced by the program");
  if (again.valid() && again.dev == dev_ && again.ino == ino_) {
    fcntl(again.fd, F_SETFL, fcntl(again.fd, F_GETFL) & ~O_NONBLOCK);
    (void)flock(again.fd, LOCK_EX | LOCK_NB);  // the lock went with the closed descriptor
    const off_t end = lseek(again.fd, 0, SEEK_END);
    pos_ = end < 0 ? 0 : end;
    fd_.store(again.fd, std::memory_order_release);
    t.s("; ").s(path_).s(" was opened again (descriptor ").i(again.fd).s(")");
    warn_raw(t.view());
    char buf[1200];
    JsonLine j(buf, sizeof buf);
    j.str("k", "note").str("level", "warning").str("msg", t.view());
    const std::string_view note = j.finish();
    if (write_all(again.fd, note)) pos_ += static_cast<off_t>(note.size());
    return true;
  }
  again.close();
  fd_.store(-1, std::memory_order_release);
  write_failed_ = true;
  t.s(" and ").s(path_).s(" is not the same file any more; further events are not logged");
  warn_raw(t.view());
  return false;
}

void EventLog::write_locked(std::string_view data) {
  // Nothing follows `end`: a writer that held the lock while exit wrote around it (it was slower
  // than the exit path's patience) gives its bytes up rather than put them after the last line.
  if (data.empty() || sealed_.load(std::memory_order_acquire) ||
      write_failed_.load(std::memory_order_relaxed))
    return;
  // write(2) is a cancellation point: a thread cancelled there would keep the lock for good.
  int cancel = 0;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
  if (ours_locked()) write_out(data);
  pthread_setcancelstate(cancel, nullptr);
}

void EventLog::write_out(std::string_view data) {
  // Once exit began, writes take turns with the exit path's direct ones, so that none comes after
  // the seal (write_direct).
  std::unique_lock<std::mutex> turn(direct_mu_, std::defer_lock);
  if (exiting_.load(std::memory_order_acquire)) {
    if (in_signal_)  // the crash handler: its thread may hold the turn already
      (void)turn.try_lock();
    else
      turn.lock();
    if (sealed_.load(std::memory_order_acquire)) return;
  }
  const int fd = fd_.load(std::memory_order_relaxed);
  out_ptr_ = data.data();
  out_len_ = data.size();
  out_start_ = pos_;
  writing_.store(true, std::memory_order_release);
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // A full disk or a revoked file: drop the log, never the program.
      warn_raw("event log write failed; further events are not logged");
      write_failed_ = true;
      break;
    }
    off += static_cast<std::size_t>(n);
    pos_ += n;
  }
  writing_.store(false, std::memory_order_release);
}

void EventLog::flush_locked() {
  write_locked(std::string_view(buf_, used_.load(std::memory_order_relaxed)));
  used_.store(0, std::memory_order_release);
  if (partial_at_.load(std::memory_order_relaxed) >= 0)
    partial_at_.store(-2, std::memory_order_release);  // the pieced line began in what went out
}

inline void EventLog::append_locked(std::string_view data) {
  std::size_t used = used_.load(std::memory_order_relaxed);
  if (data.size() > kBuf) {
    // Straight from the caller's buffer: a line longer than ours (a header with a long argv, a
    // finding quoting a huge environment value) must go out whole, never cut at kBuf.
    flush_locked();
    write_locked(data);
    return;
  }
  if (used + data.size() > kBuf) {
    flush_locked();
    used = 0;
  }
  if (used == 0) {
    if (!flusher_started_) start_flusher_locked();
    if (flusher_idle_) flusher_cv_.notify_one();
  }
  std::memcpy(buf_ + used, data.data(), data.size());
  used_.store(used + data.size(), std::memory_order_release);  // after the bytes (signal order)
}

void EventLog::write(std::string_view line, std::uint64_t now_ns) {
  if (!is_open() || write_failed_.load(std::memory_order_relaxed)) return;
  if (!lock()) {
    write_direct(line);
    return;
  }
  if (!sealed_.load(std::memory_order_relaxed)) {
    append_locked(line);
    if (now_ns - last_flush_ns_ > 1000000000ull || write_through_ || exit_write_through()) {
      flush_locked();
      last_flush_ns_ = now_ns;
    }
  }
  unlock();
}

void EventLog::flush() {
  if (!is_open()) return;
  if (!lock()) {
    write_direct({});
    return;
  }
  flush_locked();
  unlock();
}

EventLog::Pieces EventLog::begin_pieces() {
  if (!is_open() || write_failed_.load(std::memory_order_relaxed)) return Pieces::Dropped;
  if (!lock()) {
    direct_mu_.lock();  // held to the last piece: no other direct line comes between
    direct_locked({});
    return Pieces::Direct;
  }
  if (sealed_.load(std::memory_order_relaxed)) {
    unlock();
    return Pieces::Dropped;
  }
  partial_at_.store(static_cast<long>(used_.load(std::memory_order_relaxed)),
                    std::memory_order_release);
  return Pieces::Locked;
}

void EventLog::piece(Pieces how, std::string_view bytes) {
  if (how == Pieces::Locked) append_locked(bytes);
  if (how == Pieces::Direct) direct_locked(bytes);
}

void EventLog::end_pieces(Pieces how, std::string_view last, std::uint64_t now_ns) {
  piece(how, last);
  if (how == Pieces::Direct) direct_mu_.unlock();
  if (how != Pieces::Locked) return;
  partial_at_.store(-1, std::memory_order_release);
  if (now_ns - last_flush_ns_ > 1000000000ull || exit_write_through()) {
    flush_locked();
    last_flush_ns_ = now_ns;
  }
  unlock();
}

// ---- the flusher ---------------------------------------------------------------------------------
// A record that no later record follows (the program hangs, or sleeps before it is killed)
// reaches the file within a second: the flusher sleeps while the buffer is empty, is woken by the
// record that makes it non-empty (one notify per write-out at most, not per call), and writes it
// out 0.9 s later.
// Started at the first record, not at load; every signal blocked; never joined: it does not keep
// the process alive, and exit never waits for it.
void EventLog::start_flusher_locked() {
  flusher_started_ = true;
  // ThreadSanitizer ends a child of a threaded parent that starts a thread ("not supported"): a
  // forked child under it writes each record through instead (what it logs reaches the file at
  // once, at a write(2) per record; a forked child of a CUDA process rarely makes calls).
  if (forked_ && __tsan_init) {
    write_through_ = true;
    return;
  }
  const int rc = start_detached_quiet(
      [](void *self) -> void * {
        static_cast<EventLog *>(self)->flusher_loop();
        return nullptr;
      },
      this, "cmg-log-flush");
  if (rc != 0) {
    char msg[256];
    TextBuf t(msg, sizeof msg);
    t.s("event log: no flusher thread (").s(std::strerror(rc))
        .s("); records are written when the buffer fills or a later one comes");
    warn_raw(t.view());
  }
}

void EventLog::flusher_loop() {
  while (!lock()) sleep_ns(1'000'000);  // exit began and a writer will not come back: idle
  std::unique_lock<std::mutex> lk(mu_, std::adopt_lock);
  while (!stopping_ && !sealed_.load(std::memory_order_relaxed) && is_open() &&
         !write_failed_.load(std::memory_order_relaxed)) {
    const bool idle = used_.load(std::memory_order_relaxed) == 0;
    owner_.store(nullptr, std::memory_order_release);  // the wait gives the lock up
    flusher_idle_ = idle;
    if (idle)
      flusher_cv_.wait(lk);
    else
      flusher_cv_.wait_until(lk, std::chrono::steady_clock::now() + std::chrono::milliseconds(900));
    flusher_idle_ = false;
    owner_.store(this_thread_mark(), std::memory_order_release);
    if (!idle && used_.load(std::memory_order_relaxed) && !sealed_.load(std::memory_order_relaxed))
      flush_locked();
  }
  flusher_started_ = false;
  owner_.store(nullptr, std::memory_order_release);
}

EventLog::~EventLog() {
  for (;;) {
    mu_.lock();
    const bool running = flusher_started_;
    stopping_ = true;
    flusher_cv_.notify_all();
    mu_.unlock();
    if (!running) break;
    sleep_ns(1'000'000);
  }
  OwnedFd{fd_.load(), dev_, ino_}.close();
}

// ---- process life
// --------------------------------------------------------------------------------
void EventLog::fork_prepare() { locked_for_fork_ = lock(); }

void EventLog::fork_parent() {
  if (locked_for_fork_) unlock();
}

void EventLog::fork_child() {
  owner_.store(nullptr, std::memory_order_relaxed);
  if (locked_for_fork_) mu_.unlock();
  // The parent's flusher is not in this process; a waiter it left in the condition variable would
  // confuse the next wait.
  new (&flusher_cv_) std::condition_variable();
  flusher_started_ = flusher_idle_ = false;
  forked_ = true;
  line_ended_ = false;
  OwnedFd{fd_.exchange(-1), dev_, ino_}.close();
  used_.store(0, std::memory_order_relaxed);
  partial_at_.store(-1, std::memory_order_relaxed);
  path_.clear();
}

void EventLog::seal() { write_last({}); }

void EventLog::write_last(std::string_view line) {
  if (!lock()) {
    write_direct(line, /*then_seal=*/true);
    return;
  }
  if (!sealed_.load(std::memory_order_relaxed)) {
    if (!line.empty()) append_locked(line);
    flush_locked();
  }
  sealed_.store(true, std::memory_order_release);
  flusher_cv_.notify_all();
  unlock();
}

// The lock is held by this thread, which a signal handler interrupted (and which will not return
// to it): what it was writing is finished from where the file says it stopped, the complete
// lines still buffered follow, and a line it was building in pieces is ended, so that the records
// written next stand on lines of their own. Async-signal-safe.
void EventLog::finish_interrupted() {
  if (owner_.load(std::memory_order_acquire) != this_thread_mark()) return;
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0 || !OwnedFd{fd, dev_, ino_}.still_ours()) return;
  const long partial = partial_at_.load(std::memory_order_acquire);  // -2: begun on disk
  std::size_t whole = partial >= 0 ? static_cast<std::size_t>(partial)
                                   : used_.load(std::memory_order_acquire);
  bool open_line = partial == -2;
  if (writing_.load(std::memory_order_acquire)) {
    const off_t now = lseek(fd, 0, SEEK_CUR);
    if (now >= out_start_ && static_cast<std::size_t>(now - out_start_) <= out_len_)
      write_all(fd, std::string_view(out_ptr_ + (now - out_start_),
                                     out_len_ - static_cast<std::size_t>(now - out_start_)));
    if (out_ptr_ == buf_) {  // the buffer itself was going out: nothing of it is left
      open_line = partial != -1;
      whole = 0;
    }
  }
  if (open_line)
    write_all(fd, "\n");  // the rest of that record is lost; the next lines are whole
  else
    write_all(fd, std::string_view(buf_, whole));
}

// Writers without the lock take turns on a lock of their own (and, once exit began, so do the
// write-outs under the lock: write_out), so that nothing is written after the seal. It is taken
// only after exit began: no thread a signal interrupts in the normal path holds it.
void EventLog::write_direct(std::string_view data, bool then_seal) {
  std::lock_guard g(direct_mu_);
  direct_locked(data);
  if (then_seal) sealed_.store(true, std::memory_order_release);
}

void EventLog::direct_locked(std::string_view data) {
  if (sealed_.load(std::memory_order_acquire)) return;
  const int fd = fd_.load(std::memory_order_relaxed);
  if (owner_.load(std::memory_order_acquire) == this_thread_mark()) {
    // Only the holder of the lock can finish what it was writing (its buffered records, its
    // half-written line): claimed by another thread, the repair would do nothing and lose them.
    int expected = 0;
    if (bypass_.compare_exchange_strong(expected, 1)) {
      finish_interrupted();
      bypass_.store(2, std::memory_order_release);
    }
  } else if (!line_ended_ && fd >= 0 &&
             (partial_at_.load(std::memory_order_acquire) == -2 ||
              writing_.load(std::memory_order_acquire)) &&
             OwnedFd{fd, dev_, ino_}.still_ours()) {
    // The holder may have left half a line on disk: this line must not be glued to it (the
    // half line stays a malformed line the report skips and counts).
    line_ended_ = true;
    write_all(fd, "\n");
  }
  if (fd >= 0 && !data.empty() && OwnedFd{fd, dev_, ino_}.still_ours()) write_all(fd, data);
}

void EventLog::write_from_signal(std::string_view lines, std::uint64_t patience_ns) {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0) return;
  bool got = mu_.try_lock();
  // Another thread's write (the flusher's, a call's record) ends in microseconds: waited for, so
  // that the buffered records are written before the last lines (_exit gave them up, and its
  // `end` came before other records). Never when this thread holds the lock (interrupted).
  for (std::uint64_t waited = 0; !got && waited < patience_ns &&
                                 owner_.load(std::memory_order_acquire) != this_thread_mark();
       waited += 1'000'000) {
    const timespec step{0, 1'000'000};
    nanosleep(&step, nullptr);
    got = mu_.try_lock();
  }
  if (got) {
    owner_.store(this_thread_mark(), std::memory_order_release);
    const bool sealed = sealed_.load(std::memory_order_relaxed);
    // Only a descriptor that is still the log's: a handler never opens it again (in_signal_ makes
    // ours_locked say no rather than reopen, should the host close it between the two checks).
    in_signal_ = true;
    if (!sealed && OwnedFd{fd, dev_, ino_}.still_ours()) flush_locked();
    in_signal_ = false;
    sealed_.store(true, std::memory_order_release);
    unlock();
    if (sealed) return;  // the exit summary was written: the log is complete
  } else {
    // Sealed already (the exit path wrote `end` and still holds the lock): nothing after it.
    if (sealed_.load(std::memory_order_acquire)) return;
    // A held lock means a writer was interrupted mid-record (possibly this very thread: then its
    // bytes are finished first) or is writing on another thread (its buffer is given up).
    int expected = 0;
    if (bypass_.compare_exchange_strong(expected, 1)) {
      finish_interrupted();
      bypass_.store(2, std::memory_order_release);
    }
    sealed_.store(true, std::memory_order_release);
  }
  if (OwnedFd{fd, dev_, ino_}.still_ours()) write_all(fd, lines);
}

// ---- LogLine
// -------------------------------------------------------------------------------------
void LogLine::piece(std::string_view bytes) {
  if (!spilled_) {
    how_ = log_.begin_pieces();
    spilled_ = true;
  }
  log_.piece(how_, bytes);
}

void LogLine::commit(std::uint64_t now_ns) {
  if (done_) return;
  done_ = true;
  const std::string_view last = finish();
  if (spilled_)
    log_.end_pieces(how_, last, now_ns);
  else
    log_.write(last, now_ns);
}

}  // namespace cmg::shim
