// SPDX-License-Identifier: Apache-2.0
// Whether the shim may write the process environment now: see env_write.h.
#include "env_write.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace cmg::shim {

bool environ_write_safe() {
  // /proc/self/stat: "pid (comm) state ..." with comm possibly holding spaces and parentheses;
  // num_threads is the 18th field after the last ')' (proc(5): field 20, counting from pid).
  char buf[1024];
  const int fd = ::open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  const char *p = std::strrchr(buf, ')');
  if (!p) return true;
  ++p;
  for (int field = 3; field < 20; ++field) {  // move to the start of field 20
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
    if (!*p) return true;
  }
  while (*p == ' ') ++p;
  long threads = 0;
  for (; *p >= '0' && *p <= '9'; ++p) threads = threads * 10 + (*p - '0');
  return threads <= 1;
}

}  // namespace cmg::shim
