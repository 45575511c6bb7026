// SPDX-License-Identifier: Apache-2.0
// Event log writer and JSON-line builder (see eventlog.h).
#include "eventlog.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <new>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cmg::shim {

JsonLine::JsonLine(char *buf, std::size_t cap) : buf_(buf), cap_(cap) { buf_[len_++] = '{'; }

// Room kept back so the closing brackets, a "cut" marker and the newline always fit.
static constexpr std::size_t kReserve = 48;

// Numbers are formatted by hand: snprintf costs about 400 instructions per number, and a call
// record has eight to twelve of them (docs/performance.md: the log cost per call).
namespace {
int put_dec(char *out, std::uint64_t v) {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  for (int i = 0; i < n; ++i) out[i] = tmp[n - 1 - i];
  return n;
}

int put_signed(char *out, std::int64_t v) {
  if (v >= 0) return put_dec(out, static_cast<std::uint64_t>(v));
  out[0] = '-';
  return 1 + put_dec(out + 1, ~static_cast<std::uint64_t>(v) + 1);
}

// "0x..." in quotes, lower case, as "%#" PRIx64 would write it (0 is "0x0").
int put_hex_str(char *out, std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = digits[v & 15];
    v >>= 4;
  } while (v);
  out[0] = '"';
  out[1] = '0';
  out[2] = 'x';
  for (int i = 0; i < n; ++i) out[3 + i] = tmp[n - 1 - i];
  out[3 + n] = '"';
  return n + 4;
}
}  // namespace

bool JsonLine::room(std::size_t n) {
  if (!cut_ && len_ + n + kReserve + static_cast<std::size_t>(depth_) < cap_) return true;
  cut_ = true;
  return false;
}

void JsonLine::put(std::string_view s) {
  std::memcpy(buf_ + len_, s.data(), s.size());
  len_ += s.size();
}

// Strings are escaped as JSON; bytes that are not valid UTF-8 (an argv in Latin-1, a path with a
// stray byte) become \u00XX so the line stays valid JSON, and a multi-byte character is never cut.
void JsonLine::put_escaped(std::string_view s) {
  const auto *u = reinterpret_cast<const unsigned char *>(s.data());
  const std::size_t n = s.size();
  for (std::size_t i = 0; i < n;) {
    if (len_ + 8 + kReserve + static_cast<std::size_t>(depth_) >= cap_) {
      cut_ = true;
      return;
    }
    const unsigned char c = u[i];
    if (c < 0x80) {
      switch (c) {
        case '"': put("\\\""); break;
        case '\\': put("\\\\"); break;
        case '\n': put("\\n"); break;
        case '\t': put("\\t"); break;
        case '\r': put("\\r"); break;
        default:
          if (c < 0x20) {
            len_ += static_cast<std::size_t>(
                std::snprintf(buf_ + len_, 8, "\\u%04x", static_cast<unsigned>(c)));
          } else {
            buf_[len_++] = static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // A well-formed UTF-8 sequence of 2 to 4 bytes is copied whole.
    std::size_t len = c >= 0xf0 && c < 0xf5 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    if (c >= 0xf5) len = 0;
    bool ok = len && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (u[i + k] & 0xc0) == 0x80;
    if (ok && len == 3 && ((c == 0xe0 && u[i + 1] < 0xa0) || (c == 0xed && u[i + 1] >= 0xa0)))
      ok = false;  // overlong, or a UTF-16 surrogate
    if (ok && len == 4 && ((c == 0xf0 && u[i + 1] < 0x90) || (c == 0xf4 && u[i + 1] >= 0x90)))
      ok = false;  // overlong, or beyond U+10FFFF
    if (ok) {
      std::memcpy(buf_ + len_, s.data() + i, len);
      len_ += len;
      i += len;
    } else {
      len_ += static_cast<std::size_t>(
          std::snprintf(buf_ + len_, 8, "\\u%04x", static_cast<unsigned>(c)));
      ++i;
    }
  }
}

// Writes `,"key":` only when the key and `extra` more bytes fit; once a value is left out, every
// later one is too, so the line never holds a half-written member.
bool JsonLine::key(std::string_view k, std::size_t extra) {
  if (skip_ || !room(k.size() + 4 + extra)) return false;
  if (!first_) buf_[len_++] = ',';
  first_ = false;
  buf_[len_++] = '"';
  put(k);
  put("\":");
  return true;
}

JsonLine &JsonLine::str(std::string_view k, std::string_view v) {
  if (!key(k, 2)) return *this;
  buf_[len_++] = '"';
  put_escaped(v);  // may cut the text short, never the closing quote (kReserve)
  buf_[len_++] = '"';
  return *this;
}

JsonLine &JsonLine::hex(std::string_view k, std::uint64_t v) {
  char tmp[24];
  int n = put_hex_str(tmp, v);
  if (key(k, static_cast<std::size_t>(n))) put(std::string_view(tmp, static_cast<std::size_t>(n)));
  return *this;
}

JsonLine &JsonLine::num(std::string_view k, std::int64_t v) {
  char tmp[24];
  int n = put_signed(tmp, v);
  if (key(k, static_cast<std::size_t>(n))) put(std::string_view(tmp, static_cast<std::size_t>(n)));
  return *this;
}

JsonLine &JsonLine::unum(std::string_view k, std::uint64_t v) {
  char tmp[24];
  int n = put_dec(tmp, v);
  if (key(k, static_cast<std::size_t>(n))) put(std::string_view(tmp, static_cast<std::size_t>(n)));
  return *this;
}

JsonLine &JsonLine::boolean(std::string_view k, bool v) {
  if (key(k, 5)) put(v ? "true" : "false");
  return *this;
}

JsonLine &JsonLine::raw(std::string_view k, std::string_view json) {
  if (key(k, json.size())) put(json);
  return *this;
}

JsonLine &JsonLine::begin_object(std::string_view k) {
  if (!key(k, 2)) {
    ++skip_;
    return *this;
  }
  buf_[len_++] = '{';
  first_ = true;
  ++depth_;
  return *this;
}

JsonLine &JsonLine::end_object() {
  if (skip_) {
    --skip_;
    return *this;
  }
  --depth_;
  buf_[len_++] = '}';
  first_ = false;
  return *this;
}

JsonLine &JsonLine::begin_array(std::string_view k) {
  if (!key(k, 2)) {
    ++skip_;
    return *this;
  }
  buf_[len_++] = '[';
  first_ = true;
  ++depth_;
  return *this;
}

JsonLine &JsonLine::end_array() {
  if (skip_) {
    --skip_;
    return *this;
  }
  --depth_;
  buf_[len_++] = ']';
  first_ = false;
  return *this;
}

bool JsonLine::elem(std::size_t n) {
  if (skip_ || !room(n + 1)) return false;
  if (!first_) buf_[len_++] = ',';
  first_ = false;
  return true;
}

JsonLine &JsonLine::elem_str(std::string_view v) {
  if (!elem(2)) return *this;
  buf_[len_++] = '"';
  put_escaped(v);
  buf_[len_++] = '"';
  return *this;
}

JsonLine &JsonLine::elem_hex(std::uint64_t v) {
  char tmp[24];
  int n = put_hex_str(tmp, v);
  if (elem(static_cast<std::size_t>(n))) put(std::string_view(tmp, static_cast<std::size_t>(n)));
  return *this;
}

JsonLine &JsonLine::elem_raw(std::string_view json) {
  if (elem(json.size())) put(json);
  return *this;
}

std::string_view JsonLine::finish() {
  if (cut_) {
    if (!first_) buf_[len_++] = ',';
    put("\"cut\":true");
  }
  buf_[len_++] = '}';
  buf_[len_++] = '\n';
  return std::string_view(buf_, len_);
}

// ---------------------------------------------------------------------------------------------
namespace {

// A file another user owns in a world-writable sticky directory (/tmp): someone planted it to
// read our log or to have us truncate a file they chose (the kernel's protected_regular rule,
// applied whatever that sysctl says).
bool planted_by_another_user(const std::string &path, const struct stat &st) {
  if (st.st_uid == geteuid()) return false;
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat ds;
  if (::stat(dir.c_str(), &ds) != 0) return true;  // cannot tell: refuse
  return (ds.st_mode & S_ISVTX) && (ds.st_mode & S_IWOTH);
}

}  // namespace

std::string EventLog::open(const std::string &path) {
  const std::string what = "cannot open event log " + path + ": ";
  // No O_TRUNC yet: nothing is changed before the file is known to be ours. O_NONBLOCK: a FIFO
  // planted at the path would otherwise block the host in open() until someone reads it.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0666);
  if (fd < 0) {
    int e = errno;
    std::string why = std::strerror(e);
    if (e == ELOOP) why = "it is a symbolic link (refused: a planted link could redirect the log)";
    if (e == ENXIO) why = "it is a FIFO or socket nobody reads (refused)";
    return what + why;
  }
  struct stat st;
  std::string refuse;
  if (fstat(fd, &st) != 0)
    refuse = std::strerror(errno);
  else if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))
    refuse = "it is a FIFO or socket (refused: a reader that stops would block the program)";
  else if (!S_ISREG(st.st_mode) && !S_ISCHR(st.st_mode))
    refuse = "not a regular file";
  else if (S_ISREG(st.st_mode) && planted_by_another_user(path, st))
    refuse = "the file belongs to another user in a shared directory (refused: it may be planted)";
  else if (S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0)
    refuse = std::strerror(errno);
  if (!refuse.empty()) {
    ::close(fd);
    return what + refuse;
  }
  // Writes block normally from here on (a character device such as /dev/full is allowed).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::lock_guard lk(mu_);
  path_ = path;
  used_ = 0;
  write_failed_ = false;
  fd_.store(fd, std::memory_order_release);  // last: is_open() then sees the path too
  return {};
}

void EventLog::write_locked(std::string_view data) {
  std::size_t off = 0;
  const int fd = fd_.load(std::memory_order_relaxed);
  while (off < data.size() && fd >= 0 && !write_failed_.load(std::memory_order_relaxed)) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // A full disk or a revoked file: drop the log, never the program.
      static const char msg[] = "cumemguard: warning: event log write failed; further events "
                                "are not logged\n";
      ssize_t ignored = ::write(2, msg, sizeof msg - 1);
      (void)ignored;
      write_failed_ = true;
      break;
    }
    off += static_cast<std::size_t>(n);
  }
}

void EventLog::flush_locked() {
  write_locked(std::string_view(buf_, used_));
  used_ = 0;
}

void EventLog::write(std::string_view line, std::uint64_t now_ns) {
  if (!is_open() || write_failed_.load(std::memory_order_relaxed)) return;
  std::lock_guard lk(mu_);
  if (sealed_) return;
  if (line.size() > kBuf) {
    // Straight from the caller's buffer: a line longer than ours (a header with a long argv, a
    // finding quoting a huge environment value) must go out whole, never cut at kBuf.
    flush_locked();
    write_locked(line);
    return;
  }
  if (used_ + line.size() > kBuf) flush_locked();
  std::memcpy(buf_ + used_, line.data(), line.size());
  used_ += line.size();
  if (now_ns - last_flush_ns_ > 1000000000ull) {
    flush_locked();
    last_flush_ns_ = now_ns;
  }
}

void EventLog::flush() {
  std::lock_guard lk(mu_);
  flush_locked();
}

void EventLog::fork_child() {
  mu_.unlock();
  const int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
  used_ = 0;
  path_.clear();
}

void EventLog::seal() {
  std::lock_guard lk(mu_);
  flush_locked();
  sealed_ = true;
}

void EventLog::write_from_signal(std::string_view lines) {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0) return;
  // A held lock means a writer was interrupted mid-line (possibly this very thread): its buffer
  // is left alone and only the crash lines are written.
  if (mu_.try_lock()) {
    if (sealed_) return;  // the exit summary was written: the log is complete
    flush_locked();
    sealed_ = true;
  }
  while (!lines.empty()) {
    ssize_t n = ::write(fd, lines.data(), lines.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    lines.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string expand_log_path(std::string_view pattern, long pid, int rank) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '%' && i + 1 < pattern.size()) {
      char n = pattern[i + 1];
      if (n == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (n == 'r') {
        out += rank >= 0 ? std::to_string(rank) : std::string("na");
        ++i;
        continue;
      }
      if (n == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += c;
  }
  return out;
}

int rank_from_env() {
  for (const char *v : {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    const char *s = std::getenv(v);
    if (!s || !*s) continue;
    char *end = nullptr;
    long r = std::strtol(s, &end, 10);
    if (end && *end == '\0' && r >= 0 && r < (1L << 30)) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace cmg::shim
