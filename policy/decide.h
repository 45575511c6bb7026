// SPDX-License-Identifier: Apache-2.0
// What happens to a call the model has a finding about: the one place where the finding class
// (findings.def: default action, when it stands), the options (mode, CUMEMGUARD_ACTION_*) and the
// model's proof meet. The model asks this before it notes anything for a call, so nothing is
// changed for a call that will be skipped; the shim executes the decision and decides nothing.
#pragma once

#include "findings.h"
#include "options.h"

namespace cmg {

struct Decision {
  Action action = Action::Forward;  // what the log records (skip, forward, abort, defer)
  bool skip = false;                // answer success without calling the driver
  bool abort_first = false;         // strict: report and abort before the driver is called
  bool if_refused = false;          // the finding stands only if the driver refuses the call
  // Whether the finding is reported once the driver answered `ok`.
  bool stands(bool ok) const { return !if_refused || !ok; }
};

// `skippable`: the model proved the call has no effect left to have (architecture.md: skip only
// what is proven); a Skip that is not proven becomes Forward. `if_refused` adds the condition for
// one call where the class itself always stands (a second cudaFreeAsync of a graph allocation).
Decision decide(const Options &o, FindingClass c, bool skippable, bool if_refused = false);

}  // namespace cmg
