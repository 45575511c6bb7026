// SPDX-License-Identifier: Apache-2.0
// What happens to a call the model has a finding about: the one place where the finding class
// (findings.def: default action, when it stands), the options (mode, CUMEMGUARD_ACTION_*) and the
// model's proof meet. The model asks this before it notes anything for a call, so nothing is
// changed for a call that will be skipped; the shim executes the decision and decides nothing.
#pragma once

#include <cstdint>

#include "findings.h"
#include "options.h"

namespace cmg {

struct Decision {
  Action action = Action::Forward;  // what the log records (skip, forward, abort, defer)
  bool skip = false;                // answer success without calling the driver
  bool abort_first = false;         // strict: report and abort before the driver is called
  bool if_refused = false;          // the finding stands only if the driver refuses the call
  // The skip (or strict mode's abort) rests on the model holding the address or handle value as
  // freed: before the call is answered without the driver, the driver is asked whether it holds it
  // live (architecture.md: a skip is proven with the driver's view). Only on this path.
  bool confirm = false;
  // Not confirmed (confirmed() below): the call is forwarded, and the driver's answer says which
  // finding it was — accepted: an unseen re-issue; refused: the model's finding, with `action`.
  bool unseen = false;
  // Whether the finding is reported once the driver answered `ok`.
  bool stands(bool ok) const { return !if_refused || !ok; }
};

// What the driver says of an address or handle value the model holds as freed or released. The
// model sees only what is hooked: a CUDA graph's memory node, external memory, a driver function
// pointer fetched before the shim loaded or another library can issue it again behind its back.
struct DriverView {
  enum class Live : std::uint8_t {
    No,       // the driver does not know it: the model's proof stands
    Yes,      // the driver holds it live: issued again through a path the shim does not see
    Unknown,  // no answer (no driver, another error): not proven, so the call is forwarded
  };
  Live live = Live::Unknown;
  const char *path = nullptr;  // Yes: how it came back, where the driver says (static text)
};

// How an unseen re-issue comes back, when the driver does not say (DriverView::path).
inline constexpr const char *kUnseenPaths =
    "a path the shim does not see (a CUDA graph's memory node, external memory, a driver function "
    "pointer fetched before the shim loaded, or another library)";

// `skippable`: the model proved the call has no effect left to have (architecture.md: skip only
// what is proven); a Skip that is not proven becomes Forward. `if_refused` adds the condition for
// one call where the class itself always stands (a second cudaFreeAsync of a graph allocation).
Decision decide(const Options &o, FindingClass c, bool skippable, bool if_refused = false);

// A decision whose skip needs the driver's view (Decision::confirm), with the driver's answer: the
// decision stands when the driver does not hold the object. Otherwise (it is live, or the driver
// gave no answer: not proven either way) the call is forwarded with `unseen` set. Returns whether
// the original decision stands.
bool confirmed(const DriverView &v, Decision &d);

// A finding that rests on the model holding the object as freed, for a call that is forwarded
// anyway (report mode, an action override): the driver's answer is its view. Refused, the finding
// stands; accepted, the object was live (an unseen re-issue, Decision::unseen), not a double free.
// Sets `confirm` instead where the call would be answered without the driver (or abort first).
void rests_on_freed(Decision &d);

}  // namespace cmg
