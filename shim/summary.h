// SPDX-License-Identifier: Apache-2.0
// The exit summary (stderr, when CUMEMGUARD_SUMMARY is set) and the last log records: leaks from
// the model, counters, `end`. The exit path allocates nothing, waits on no lock without a bound
// and makes no CUDA call (the driver may be torn down, or held by the thread a signal handler
// interrupted): docs/reliability.md, "Exit and signal paths".
#pragma once

#include <cstdint>

#include "exiting.h"

namespace cmg::shim {

// How the process is ending: exit(), strict mode's abort, or a sanitizer's exit (AddressSanitizer's
// error report, LeakSanitizer's leak check: sanitizer_exit.h), which ends the process right after.
enum class ExitHow : std::uint8_t { Exit, Abort, Sanitizer };
void exit_summary(ExitHow how);
// Policies applied once at load, before any library reads the environment.
void on_load();
// At the first CUDA call: did the environment change since load (bug-patterns.md P21)?
void on_first_cuda_call();
// Before the crash handlers are installed: gives SIGABRT back from the handler that says the
// load's findings when `import torch` aborts before any CUDA call (config_env.cpp).
void release_load_abort_handler();
// At exit of a process that loaded libc10_cuda.so and never called CUDA: the load's findings.
void say_load_findings_at_exit();

}  // namespace cmg::shim
