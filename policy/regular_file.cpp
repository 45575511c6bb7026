// SPDX-License-Identifier: Apache-2.0
// Regular files only, opened without blocking (see regular_file.h).
#include "regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cmg {

RegularFile open_regular(const char *path, bool nofollow) {
  RegularFile r;
  // O_NONBLOCK: open(2) of a FIFO without a writer returns at once instead of waiting for one.
  int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  if (nofollow) flags |= O_NOFOLLOW;
  int fd;
  do fd = ::open(path, flags);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    r.error = errno;
    r.why = errno == ELOOP && nofollow ? "a symbolic link (not followed)" : std::strerror(errno);
    return r;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    r.error = errno;
    r.why = std::strerror(errno);
    ::close(fd);
    return r;
  }
  if (!S_ISREG(st.st_mode)) {
    static const char *const kinds[] = {
        "not a regular file (a directory)",        "not a regular file (a FIFO)",
        "not a regular file (a character device)", "not a regular file (a block device)",
        "not a regular file (a socket)",           "not a regular file"};
    r.why = S_ISDIR(st.st_mode)    ? kinds[0]
            : S_ISFIFO(st.st_mode) ? kinds[1]
            : S_ISCHR(st.st_mode)  ? kinds[2]
            : S_ISBLK(st.st_mode)  ? kinds[3]
            : S_ISSOCK(st.st_mode) ? kinds[4]
                                   : kinds[5];
    ::close(fd);
    return r;
  }
  r.fd = fd;
  r.size = st.st_size;
  r.dev = st.st_dev;
  r.ino = st.st_ino;
  return r;
}

std::optional<std::string> read_regular(const std::string &path, std::size_t max_bytes) {
  const RegularFile f = open_regular(path.c_str());
  if (f.fd < 0) return std::nullopt;
  std::string text;
  char buf[4096];
  while (text.size() < max_bytes) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
  }
  ::close(f.fd);
  if (text.size() > max_bytes) text.resize(max_bytes);
  return text;
}

}  // namespace cmg
