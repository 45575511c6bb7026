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

void rests_on_freed(Decision &d) {
  if (d.skip || d.abort_first) {
    d.confirm = true;
    return;
  }
  d.if_refused = true;
  d.unseen = true;
}

bool confirmed(const DriverView &v, Decision &d) {
  if (!d.confirm) return true;
  d.confirm = false;
  if (v.live == DriverView::Live::No) return true;
  // The model's proof does not hold: forwarded. If the driver refuses, the model's finding was
  // right after all and keeps its action (strict mode aborts after the call, as for any finding
  // that stands on a refusal); if it accepts, the object was live: an unseen re-issue.
  d.skip = false;
  d.abort_first = false;
  d.if_refused = true;
  d.unseen = true;
  if (d.action == Action::Skip) d.action = Action::Forward;
  return false;
}

}  // namespace cmg
