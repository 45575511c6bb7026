// SPDX-License-Identifier: Apache-2.0
// Where the shim's diagnostics and its exit summary go on the terminal side: never simply to
// descriptor 2, which a host may close and reuse for a file or socket of its own (a daemon that
// closes 0, 1 and 2 and opens its log, which gets 2). At load the shim takes its own duplicate of
// stderr above the host's usual range (F_DUPFD_CLOEXEC, owned_fd.h) and remembers what stderr was
// (st_dev, st_ino). A line goes to that duplicate while it is still the shim's, or else to
// descriptor 2 while 2 is still the object stderr was at load; otherwise nowhere (the event log
// still has it). Under `cumemguard run` the duplicate is the launcher's stderr, so the summary
// still reaches the terminal after the program closed its own.
#pragma once

#include <string_view>

namespace cmg::shim {

// At load (options parsed): takes the duplicate. Once; cheap (fcntl and fstat).
void stderr_take();
// Writes bytes whole to the verified descriptor; false when there is none (nothing written).
// Async-signal-safe (fstat and write), allocates nothing.
bool stderr_write(std::string_view bytes);

}  // namespace cmg::shim
