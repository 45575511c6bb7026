// SPDX-License-Identifier: Apache-2.0
// The bridge's socket I/O and shared helpers (see bridge_io.h).
#include "bridge_io.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace cmg::shim::bridge {

std::string errno_text(const char *what, int e) {
  return std::string(what) + ": " + std::strerror(e);
}

namespace {
bool read_exactly(int fd, std::uint8_t *p, std::size_t n, std::size_t &got) {
  while (got < n) {
    ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got == n;
}
}  // namespace

bool random_bytes(std::uint8_t *p, std::size_t n) {
  std::size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  if (got == n) return true;
  // getrandom(2) can be filtered by seccomp; the device gives the same bytes.
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = read_exactly(fd, p, n, got);
  ::close(fd);
  return ok;
}

socklen_t make_addr(sockaddr_un &a, const std::string &name) {
  std::memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof a.sun_path);
  std::memcpy(a.sun_path, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
}

int remaining_ms(const timespec &deadline) {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  const long long ms =
      (deadline.tv_sec - now.tv_sec) * 1000LL + (deadline.tv_nsec - now.tv_nsec) / 1000000;
  return ms < 0 ? 0 : static_cast<int>(ms);
}

timespec deadline_in(int ms) {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += static_cast<long>(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    ++t.tv_sec;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int send_msg(int fd, const void *data, std::size_t len, const int *fds, std::size_t nfds,
             int timeout_ms) {
  iovec iov{const_cast<void *>(data), len};
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * ipc::kPagesPerChunk)];
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  if (nfds) {
    if (nfds > ipc::kPagesPerChunk) return EINVAL;
    std::memset(cbuf, 0, sizeof cbuf);
    m.msg_control = cbuf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  const timespec deadline = deadline_in(timeout_ms);
  for (;;) {
    ssize_t r = sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r == static_cast<ssize_t>(len)) return 0;
    if (r >= 0) return EMSGSIZE;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    const int left = remaining_ms(deadline);
    if (left <= 0) return ETIMEDOUT;
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, left);
  }
}

void Msg::close_fds() {
  for (int f : fds) ::close(f);
  fds.clear();
}

namespace {
void take_fds(msghdr &m, std::vector<int> &fds) {
  for (cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < n; ++i) {
      int f;
      std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      fds.push_back(f);
    }
  }
}
}  // namespace

int recv_msg(int fd, std::size_t max, Msg &out, int timeout_ms) {
  out = Msg{};
  out.data.assign(max, 0);
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int) * 253)];
  const timespec deadline = deadline_in(timeout_ms);
  for (;;) {
    iovec iov{out.data.data(), out.data.size()};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
      const int left = remaining_ms(deadline);
      if (left <= 0) return ETIMEDOUT;
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, left);
      continue;
    }
    take_fds(m, out.fds);
    out.truncated = (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0;
    out.data.resize(static_cast<std::size_t>(r));
    if (r == 0 && out.fds.empty()) return -1;
    return 0;
  }
}

bool peer_cred(int fd, ipc::PeerCred &out) {
  ucred uc{};
  socklen_t ul = sizeof uc;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) != 0 || ul != sizeof uc) return false;
  out = {uc.pid, uc.uid, uc.gid};
  return true;
}

namespace {
std::atomic<void *> g_err_name{nullptr};
}

std::string cu_text(CUresult r) {
  const char *s = nullptr;
  auto f = driver_fn<PFN_cuGetErrorName_v6000>(g_err_name, "cuGetErrorName");
  if (f && f(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUresult " + std::to_string(static_cast<int>(r));
}

}  // namespace cmg::shim::bridge
