// SPDX-License-Identifier: Apache-2.0
// Descriptors the shim owns (see owned_fd.h).
#include "owned_fd.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>

namespace cmg::shim {

int owned_fd_floor() {
  static std::atomic<int> floor{0};
  int f = floor.load(std::memory_order_relaxed);
  if (f) return f;
  rlimit rl{};
  rlim_t cur = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
  if (cur == RLIM_INFINITY || cur > 4096) cur = 4096;
  f = static_cast<int>(cur - cur / 4);
  if (f < 3) f = 3;
  floor.store(f, std::memory_order_relaxed);
  return f;
}

OwnedFd OwnedFd::adopt(int fd) {
  OwnedFd o;
  if (fd < 0) return o;
  // Where the range above the floor is full (or the limit was lowered since), the descriptor stays
  // where it is: the identity check still keeps the shim off a number it lost.
  if (fd < owned_fd_floor()) {
    const int high = fcntl(fd, F_DUPFD_CLOEXEC, owned_fd_floor());
    if (high >= 0) {
      ::close(fd);
      fd = high;
    }
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return o;
  }
  o.fd = fd;
  o.dev = st.st_dev;
  o.ino = st.st_ino;
  return o;
}

bool OwnedFd::still_ours() const {
  if (fd < 0) return false;
  struct stat st;
  return fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
}

void OwnedFd::close() {
  if (still_ours()) ::close(fd);
  fd = -1;
}

}  // namespace cmg::shim
