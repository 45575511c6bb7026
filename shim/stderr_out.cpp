// SPDX-License-Identifier: Apache-2.0
// The shim's verified stderr (see stderr_out.h).
#include "stderr_out.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

#include "owned_fd.h"

namespace cmg::shim {
namespace {

// Written once at load, before any other thread of the shim exists; read without a lock after.
OwnedFd g_dup;
bool g_have_stderr = false;  // what descriptor 2 was at load (its identity in g_stderr)
OwnedFd g_stderr;            // fd 2's identity at load, never closed or adopted
std::atomic<bool> g_taken{false};

// A floor this low (RLIMIT_NOFILE of 16 or less) would put the duplicate among the host's own
// numbers: then only fd 2's identity is checked.
constexpr int kLowestFloor = 12;

bool write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    s.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

void stderr_take() {
  if (g_taken.exchange(true)) return;
  struct stat st;
  if (fstat(2, &st) != 0) return;  // closed at load: nothing is written to any stderr
  g_stderr = OwnedFd{2, st.st_dev, st.st_ino};
  g_have_stderr = true;
  if (owned_fd_floor() < kLowestFloor) return;
  const int high = fcntl(2, F_DUPFD_CLOEXEC, owned_fd_floor());
  if (high >= 0) g_dup = OwnedFd::adopt(high);
}

bool stderr_write(std::string_view bytes) {
  if (g_dup.still_ours()) return write_all(g_dup.fd, bytes);
  // The duplicate was closed by the host (close_range before a daemon's fork): stderr itself, if
  // it is still what it was.
  if (g_have_stderr && g_stderr.still_ours()) return write_all(2, bytes);
  return false;
}

}  // namespace cmg::shim
