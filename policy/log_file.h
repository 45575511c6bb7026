// SPDX-License-Identifier: Apache-2.0
// The rule for a file found at an event log's path: which ones a log may truncate. The shim applies
// it when it opens its log, and `cumemguard run` before the program starts (status 73), so both
// refuse the same files with the same words.
#pragma once

#include <sys/types.h>

#include <string>

namespace cmg {

// Why an existing file (its lstat/fstat mode, owner and link count) is not one a log of user euid
// may replace, or empty. A FIFO or socket would block the writer; a file another user owns was
// planted (in /tmp, or in any directory others may write, sticky or not); a file with more than
// one link is also some other name, which a planted hard link would make the log truncate; a
// device (/dev/null, /dev/zero) keeps nothing a report could read. A log is a regular file or a
// new one.
std::string log_file_refusal(mode_t mode, uid_t owner, nlink_t links, uid_t euid);

}  // namespace cmg
