// SPDX-License-Identifier: Apache-2.0
// The crash context and summary: when the program dies of a fatal signal it leaves to the default
// action, the log still gets a `crash` record (signal, faulting thread and address, that thread's
// stack), the counters and an `end` record naming the signal, written with async-signal-safe code
// only; then the signal takes the process down exactly as it would have (docs/reliability.md).
#pragma once

namespace cmg::shim {

// At activation (the first CUDA call, long after the runtime and any framework set up their own
// handlers): installs the handler for SIGSEGV, SIGBUS, SIGFPE, SIGILL and SIGABRT where, and only
// where, the disposition is still SIG_DFL. A handler the program installs later replaces ours.
void install_crash_handlers();
// _exit() or _Exit() (exiting.cpp): the counters, findings and an `end` marked "_exit", with the
// crash path's async-signal-safe writer (_exit is async-signal-safe, and programs call it from
// their own signal handlers): no model is read, so no leak records. Once per process.
void quick_exit_records();
// fork(): the child inherits the handlers and starts with a clean "already written" state.
void crash_fork_child();

}  // namespace cmg::shim
