// SPDX-License-Identifier: Apache-2.0
// Descriptors the shim opens inside a host it does not control. A host may close every descriptor
// it did not open itself (daemonising servers call close_range(3, ~0U)), dup2() over low numbers,
// or close a number and reuse it for its own socket or file: the number the shim remembers then
// names the host's object. So the shim keeps each of its own descriptors at a high number (out of
// the range hosts use), remembers what it is (st_dev, st_ino: unique per socket, pipe and file),
// and checks that before every use. A descriptor that is no longer the shim's is forgotten, never
// written, accepted on or closed (docs/reliability.md, "Descriptors").
#pragma once

#include <sys/types.h>

namespace cmg::shim {

struct OwnedFd {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;

  // Takes a descriptor the shim just opened: moves it above the host's usual range
  // (F_DUPFD_CLOEXEC, the original is closed) and remembers its identity. An OwnedFd with fd -1
  // when fd was -1 or cannot be inspected (it is closed then).
  static OwnedFd adopt(int fd);
  bool valid() const { return fd >= 0; }
  // True while the number still names the object adopted. One fstat(2): async-signal-safe.
  bool still_ours() const;
  // Closes it if it is still ours; forgets it either way.
  void close();
  // Forgets it without closing (the number is the host's now).
  void forget() { fd = -1; }
};

// The lowest number adopt() moves descriptors to: three quarters of the soft RLIMIT_NOFILE,
// capped at 3072 (the kernel's descriptor table grows to the highest number used).
int owned_fd_floor();

}  // namespace cmg::shim
