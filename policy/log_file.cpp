// SPDX-License-Identifier: Apache-2.0
// Which files at a log's path a log may replace (see log_file.h).
#include "log_file.h"

#include <sys/stat.h>

namespace cmg {

std::string log_file_refusal(mode_t mode, uid_t owner, nlink_t links, uid_t euid) {
  if (S_ISLNK(mode))
    return "it is a symbolic link (refused: a planted link could redirect the log)";
  if (S_ISFIFO(mode) || S_ISSOCK(mode))
    return "it is a FIFO or socket (refused: a reader that stops would block the program)";
  if (S_ISDIR(mode)) return "it is a directory";
  // A log is a file to read afterwards: /dev/zero or /dev/null took the events and kept nothing
  // a report could read, and `cumemguard run` refused them already (an empty CUMEMGUARD_LOG is
  // how no log is asked for).
  if (S_ISCHR(mode)) return "not a regular file (a character device)";
  if (S_ISBLK(mode)) return "not a regular file (a block device)";
  if (!S_ISREG(mode)) return "not a regular file";
  if (owner != euid)
    return "the file belongs to another user (uid " + std::to_string(owner) +
           "; refused: it may have been planted)";
  if (links != 1)
    return "the file has " + std::to_string(links) +
           " links (refused: a hard link would make the log truncate another file)";
  return {};
}

}  // namespace cmg
