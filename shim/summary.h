// SPDX-License-Identifier: Apache-2.0
// The exit summary (stderr, when CUMEMGUARD_SUMMARY is set) and the last log records: leaks from
// the model (no CUDA call is made at exit: the driver may already be torn down), counters, `end`.
#pragma once

namespace cmg::shim {

void exit_summary(bool from_abort);
// Every exit handler of the shim calls this first: from then on no log write waits long for the
// log's lock (eventlog.h, exit_begin).
void exit_begun();
// Policies applied once at load, before any library reads the environment.
void on_load();
// At the first CUDA call: did the environment change since load (bug-patterns.md P21)?
void on_first_cuda_call();

}  // namespace cmg::shim
