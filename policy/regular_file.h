// SPDX-License-Identifier: Apache-2.0
// Opening a file on a path the product did not create (a module of the host, a log given to the
// report, a torch install's version file) without letting what sits there stop it: a FIFO blocks
// open(2) until a writer comes, a terminal can become the controlling one, /dev/zero never ends.
// One rule for the shim and the tools (docs/reliability.md, "Files on hostile paths"): opened
// non-blocking, checked to be a regular file before a byte is read.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>

namespace cmg {

struct RegularFile {
  int fd = -1;     // -1 when refused or not opened
  off_t size = 0;  // st_size at open
  dev_t dev = 0;
  ino_t ino = 0;
  const char *why = nullptr;  // static text when fd is -1: strerror(errno) or "not a regular file
                              // (a FIFO)"; never freed, never allocated (usable at exit)
  int error = 0;              // errno of the failed call; 0 when refused for what the file is
};

// Opens `path` read-only with O_NONBLOCK | O_CLOEXEC | O_NOCTTY (| O_NOFOLLOW when `nofollow`),
// then fstat(2)s it: anything but a regular file is closed and refused. O_NONBLOCK stays set; it
// changes nothing for a regular file. Allocates nothing.
RegularFile open_regular(const char *path, bool nofollow = false);

// The first `max_bytes` of a regular file (open_regular), or nullopt when it is not one or cannot
// be read. For the small text files the product reads by path (version.py, METADATA).
std::optional<std::string> read_regular(const std::string &path, std::size_t max_bytes);

}  // namespace cmg
