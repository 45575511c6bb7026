// SPDX-License-Identifier: Apache-2.0
// Decisions on findings: see decide.h.
#include "decide.h"

namespace cmg {

Decision decide(const Options &o, FindingClass c, bool skippable, bool if_refused) {
  Decision d;
  d.action = o.action_for(c);
  if (d.action == Action::Skip && !skippable) d.action = Action::Forward;
  d.skip = d.action == Action::Skip;
  d.if_refused = if_refused || finding_info(c).stands == Stands::IfRefused;
  // A finding that stands only on refusal is not known to be one until the driver answered: strict
  // mode then aborts after the call, when it is reported.
  d.abort_first = d.action == Action::Abort && !d.if_refused;
  return d;
}

}  // namespace cmg
