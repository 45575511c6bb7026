// SPDX-License-Identifier: Apache-2.0
// Helpers of the fake stack's own tests: descriptor passing, a forked peer process, timing, files.
#pragma once

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace selftest {

// One message with an optional descriptor (SCM_RIGHTS), as NCCL's proxy and the probes pass them.
inline bool send_msg(int s, int fd, const void *data, size_t len) {
  msghdr m{};
  iovec io{const_cast<void *>(data), len};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    m.msg_control = cbuf;
    m.msg_controllen = sizeof cbuf;
    cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  return sendmsg(s, &m, 0) == static_cast<ssize_t>(len);
}

// Returns the descriptor received (-1 for none), or -2 when the peer is gone.
inline int recv_msg(int s, void *data, size_t len) {
  msghdr m{};
  iovec io{data, len};
  m.msg_iov = &io;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
  m.msg_control = cbuf;
  m.msg_controllen = sizeof cbuf;
  if (recvmsg(s, &m, MSG_WAITALL) <= 0) return -2;
  int fd = -1;
  cmsghdr *c = CMSG_FIRSTHDR(&m);
  if (c && c->cmsg_type == SCM_RIGHTS) std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

// A peer process forked before this process touches the driver (the fake, like the real one, is
// not meant to be used across fork), talking over a socket pair. body(socket) is the child's exit
// status.
template <class Body>
struct Peer {
  pid_t pid = -1;
  int sock = -1;
  explicit Peer(Body body) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return;
    pid = fork();
    if (pid == 0) {
      close(sv[0]);
      _exit(body(sv[1]));
    }
    close(sv[1]);
    sock = sv[0];
  }
  int wait() {
    int st = 0;
    if (pid > 0) waitpid(pid, &st, 0);
    if (sock >= 0) close(sock);
    pid = -1;
    sock = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  ~Peer() {
    if (pid > 0) wait();
  }
};

inline double seconds_of(const std::chrono::steady_clock::time_point &t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <class F>
double timed(F &&f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return seconds_of(t0);
}

inline std::vector<std::string> read_lines(const std::string &path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

inline bool has_line(const std::vector<std::string> &lines, const std::string &l) {
  for (const auto &x : lines)
    if (x == l) return true;
  return false;
}

}  // namespace selftest
