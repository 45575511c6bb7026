// SPDX-License-Identifier: Apache-2.0
// Suppressions in the host (CUMEMGUARD_SUPPRESSIONS, policy/suppressions.h): the file is read at
// activation; at a finding, the stack is captured (even with CUMEMGUARD_STACKS=0) and symbolized
// in process with the .symtab reader, only then, never on the call path.
#pragma once

#include <cstdint>
#include <string>

#include "findings.h"
#include "jsonline.h"
#include "textbuf.h"

namespace cmg::shim {

// Reads the file named by CUMEMGUARD_SUPPRESSIONS, once; its problems become warnings.
void suppressions_load();

struct SuppressHit {
  int rule = -1;           // index of the matching rule, -1 when not suppressed
  std::uint32_t stack = 0; // the stack captured for the match (0 when none was)
  std::string text;        // "CLASS:PATTERN" of the rule
  explicit operator bool() const { return rule >= 0; }
};

// Whether a finding of class `cls` at this point of this thread's call is suppressed. Nothing is
// captured when no rules are loaded. `count` records the hit for the summary.
SuppressHit suppression_for(FindingClass cls, bool count);

// The summary record's "suppressed" member: {"class":"double-release","pattern":"*libvendor*",
// "count":3} per rule that matched; nothing when none did. Exit path: allocates nothing.
void suppressed_json(JsonLine &j);
// "  suppressed: 3 (double-release:*libvendor*)\n" for the exit summary, or nothing.
void suppressed_text(TextBuf &t);

}  // namespace cmg::shim
