// SPDX-License-Identifier: Apache-2.0
// `cuda_error` records (docs/log-format.md): the first call that returned each distinct
// non-success status, written at once like a finding, with whether the status poisons the context
// (`sticky`). Called from the common record path for every failing call; a successful call never
// gets here (Call::log tests res != 0, one predictable branch).
#pragma once

#include "cuda_api.h"
#include "event.h"

namespace cmg::shim {

void note_cuda_error(Api api, int res, const EventRef &ev);
// The errors after which every later call of the context fails (the same numbers in the runtime
// and the driver): 214 ECC uncorrectable, 700 illegal address, 702 launch timeout, 714-719
// hardware stack error, illegal instruction, misaligned address, invalid address space, invalid
// PC, launch failed.
bool sticky_status(int res);
// The enumerator's name for a status of this API family ("cudaErrorIllegalAddress",
// "CUDA_ERROR_ILLEGAL_ADDRESS"), or nullptr for a number neither header has.
const char *status_name(Family family, int res);
// fork(): the child reports its own first errors.
void errors_fork_child();

// When every call of a run failed with one status (no driver: the runtime answers every call with
// 35), the exit summary says so once, with the likely cause, instead of a summary of a device the
// shim never saw. Filled from atomics only (the exit path reads it).
struct AllFailed {
  std::uint64_t calls = 0;  // 0: not every call failed the same way (or no call failed)
  int res = 0;
  const char *name = nullptr;   // the status's enumerator, or nullptr
  const char *cause = nullptr;  // the likely cause in words, or nullptr
  const char *fake = nullptr;   // the build's fake CUDA stack next to the shim, or nullptr
};
// `calls`: every call the run made (the call counters' sum).
AllFailed every_call_failed(std::uint64_t calls);

}  // namespace cmg::shim
