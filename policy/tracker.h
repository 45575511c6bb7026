// SPDX-License-Identifier: Apache-2.0
// The state model, in one include: byte counters (counters.h), linear memory (linear_model.h) and
// VMM memory (vmm_model.h). Rules that shape all three:
//  * State follows the driver: issuing calls are applied after the driver succeeded; calls that
//    take something away are noted before forwarding and undone, checked against what they
//    changed, when the driver refuses.
//  * Handle values and addresses are reused by the driver (real-driver.md D18): every record keyed
//    by a value or an address describes the *current* issue of it.
#pragma once

#include "counters.h"
#include "linear_model.h"
#include "text.h"
#include "vmm_model.h"
