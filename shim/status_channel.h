// SPDX-License-Identifier: Apache-2.0
// The launcher's status channel (policy/run_status.h): under `cumemguard run`, each process image
// that activates keeps one record in CUMEMGUARD_STATUS_DIR, a shared mapping of a file of its own,
// with its finding and leak counts and its log's path. Nothing here allocates after activation.
#pragma once

#include <cstdint>
#include <string_view>

namespace cmg::shim {

// Load: marks that the shim was loaded into this process image (an empty file <pid>.loaded), so
// that the launcher can tell a run where no process loaded it (a static or setuid program, whose
// ld.so ignores LD_PRELOAD) from one where none called CUDA. Once per image; a failure is silent.
void status_loaded();
// Activation: makes this process's record (once per process image; a failure is one warning) and
// copies the findings counted so far into it.
void status_open();
// The event log's path once it is open, or that it could not be opened.
void status_log(std::string_view path, bool opened);
// After a finding was counted: the record follows the process's counters.
void status_findings();
// The exit summary: the leaks live at exit, and that the process got there.
void status_exit(std::uint64_t leaks);
// _exit() or _Exit(): the process got to its end without a leak check. Async-signal-safe.
void status_quick_exit();
// The crash handler: the process ends by a signal before its exit records (a record the exit
// path stored is kept: its leaks were counted). Async-signal-safe.
void status_signalled();
// fork(): the child has a record of its own (made at its activation), never the parent's.
void status_fork_child();

}  // namespace cmg::shim
