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

}  // namespace cmg::shim
