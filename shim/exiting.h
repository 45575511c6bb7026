// SPDX-License-Identifier: Apache-2.0
// When the process begins to exit, and who writes its last records. Exit begins at the first of:
// a call of exit() (the shim's wrapper), or one of the shim's exit handlers (a return from main()
// reaches exit() inside libc, past the wrapper). From then on the exit, crash and signal paths
// allocate nothing, wait on no lock without a bound and call no CUDA function (docs/reliability.md,
// "Exit and signal paths").
//
// exit() from two threads at once (undefined behaviour in C, but such programs run): glibc lets
// both run the exit handlers, and the one that finds the list empty ends the process under the
// other, halfway through the summary. So the second caller of exit() waits, for at most
// kSecondExitPatienceNs, until the first has written the summary and `end`, and only then goes on.
#pragma once

#include <cstdint>

namespace cmg::shim {

// Exit began on this thread (the first call marks it as the exiting one): from now on no log
// write waits long for the log's lock and diagnostics are written raw.
void exit_begun();
// Whether exit began (on any thread). What may allocate or wait (snapshots, the residency
// boundaries' checks) stops from then on.
bool exit_in_progress();

// The last records (State::last_records).
enum LastRecords : int { kRecordsNone = 0, kRecordsExit = 1, kRecordsCrash = 2, kRecordsDone = 3 };
// The exit path claims the last records: true when this thread writes them. False when another
// path has them; then it waits (bounded) for a writer on another thread to finish.
bool claim_exit_records();
void exit_records_done();

inline constexpr std::uint64_t kSecondExitPatienceNs = 10'000'000'000;

// Resolved at load (the real exit() of libc): nothing is looked up on the exit path.
void exiting_at_load();
void exiting_fork_child();

}  // namespace cmg::shim
