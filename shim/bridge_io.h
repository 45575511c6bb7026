// SPDX-License-Identifier: Apache-2.0
// The bridge's internals shared by its broker (bridge_broker.cpp) and its importer
// (bridge_import.cpp): socket I/O on SOCK_SEQPACKET with descriptors (SCM_RIGHTS, so no ptrace
// right is needed: pidfd_getfd is refused in many containers, bug-patterns.md P13), deadlines,
// random bytes, and the driver functions the shim does not wrap. Not part of the shim's interface.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_api.h"
#include "ipc_bridge.h"
#include "loader.h"

namespace cmg::shim::bridge {

inline constexpr int kReplyTimeoutMs = 30000;   // an importer waits this long per broker message
inline constexpr int kSendTimeoutMs = 5000;     // the broker gives a slow importer this long
inline constexpr int kReleaseTimeoutMs = 2000;  // a close waits this long for the broker to count it

std::string errno_text(const char *what, int e);
// getrandom(2), or /dev/urandom where a seccomp filter refuses it.
bool random_bytes(std::uint8_t *p, std::size_t n);
// The abstract-namespace address of a broker (ipc::socket_name).
socklen_t make_addr(sockaddr_un &a, const std::string &name);

timespec deadline_in(int ms);
int remaining_ms(const timespec &deadline);

// One SOCK_SEQPACKET message, with descriptors. Returns 0 or an errno value. Never raises SIGPIPE.
int send_msg(int fd, const void *data, std::size_t len, const int *fds, std::size_t nfds,
             int timeout_ms);

struct Msg {
  std::vector<std::uint8_t> data;
  std::vector<int> fds;
  bool truncated = false;  // longer than expected, or descriptors cut off
  void close_fds();
};
// Receives one message of at most `max` bytes. Returns 0, -1 at end of stream, or an errno value
// (ETIMEDOUT after timeout_ms; 0 = do not wait). Descriptors are received close-on-exec.
int recv_msg(int fd, std::size_t max, Msg &out, int timeout_ms);

// The peer's credentials (SO_PEERCRED); false when the socket has none (not a Unix socket).
bool peer_cred(int fd, ipc::PeerCred &out);

std::string cu_text(CUresult r);  // "CUDA_ERROR_ILLEGAL_ADDRESS", or the number

#define CMG_REAL_OR(name, err)     \
  auto name##_fn = CMG_REAL(name); \
  if (!name##_fn) return (err)

// The POSIX-fd descriptors of every page of an export, in order (bridge_export.cpp); none on
// failure.
CUresult export_fds(const ipc::Export &e, std::vector<int> &fds);

// Process lifetime, per part (bridge.cpp calls them in this order).
void broker_fork_prepare();
void broker_fork_parent();
void broker_fork_child();
void import_fork_prepare();
void import_fork_parent();
void import_fork_child();

}  // namespace cmg::shim::bridge
