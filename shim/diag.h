// SPDX-License-Identifier: Apache-2.0
// One-line diagnostics on stderr ("cumemguard[PID]: warning: …") through spdlog while the process runs,
// raw write(2) once exit has begun (spdlog's statics may be gone by then).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "event.h"
#include "options.h"

namespace cmg::shim {

// Whether lines of this level are printed (CUMEMGUARD_LOG_LEVEL; warnings before options are read).
bool enabled(LogLevel l);
// `more`: whole lines ('\n'-terminated, already prefixed) printed right under the line, in the
// same write (a finding's stacks): another process's lines cannot come between them.
void diag_line(LogLevel level, std::string_view msg, std::string_view more = {});
// Notes and records that arrive before the log is open are kept and written once it is.
void flush_pending_notes();
void write_or_keep(std::string line);  // one complete JSON line
// Prints a finding (rate-limited by CUMEMGUARD_WARN_LIMIT). `api` is the call, or where a finding
// that belongs to no call was made ("(load)"): then no driver outcome is claimed. `stack` is the
// finding's own stack: with CUMEMGUARD_WARN_FRAMES its frames, and those of the earlier events it
// names, follow the line (live_stacks.h).
void print_finding(const Finding &f, Action action, int res, const char *api, bool from_call = true,
                   std::uint32_t stack = 0);
// From now on diagnostics bypass spdlog.
void diag_exit_begun();
void diag_fork_prepare();
void diag_fork_parent();
void diag_fork_child();

}  // namespace cmg::shim
