// SPDX-License-Identifier: Apache-2.0
// Transport-aware opportunistic cleanup, the shim half: whether one synchronizing free or pool
// trim is a cache flush made while opportunistic cleanup is suppressed (its stack captured and
// symbolized in process, then judged by policy/transport), the finding that reports it, the
// per-call-site table of the exit summary, and the C API's log records.
#pragma once

#include <cstdint>
#include <string>

#include "state.h"
#include "textbuf.h"
#include "transport.h"

namespace cmg::shim {

struct FlushCheck {
  bool opportunistic = false;
  Action action = Action::Forward;  // what the policy wants, when opportunistic
  bool over_limit = false;          // Defer turned into Forward: CUMEMGUARD_DEFER_LIMIT reached
  FlushTarget target = FlushTarget::Free;
  int site = -1;  // row of the call-site table
};

// One atomic load when nothing applies (policy allow, cleanup not suppressed, or this thread is
// inside a flush the program ran through cumemguard_maybe_empty_cache). Otherwise captures and
// classifies the stack; for a flush, the call gets that stack if it has none.
FlushCheck flush_check_slow(Call &c, FlushTarget target);
// Inline: every synchronizing free asks, and the answer is almost always "nothing applies".
inline FlushCheck flush_check(Call &c, FlushTarget target) {
  const State &s = c.st();
  if (s.opts.opportunistic == FlushPolicy::Allow || !s.transport.suppressed()) {
    FlushCheck fc;
    fc.target = target;
    return fc;
  }
  return flush_check_slow(c, target);
}

// The flush-frame patterns (built in, plus CUMEMGUARD_FLUSH_FRAMES). Every caller of frame_syms()
// passes these: the symbol cache keeps the frame kind computed with the first patterns it saw.
const FlushPatterns &patterns();

// Writes the opportunistic-flush finding (fc.action as carried out) and counts it for its call
// site. `res` is what the caller gets; `blocked_ns` how long the driver call took (0: not made).
void flush_report(const Call &c, const FlushCheck &fc, const Args &args, int res,
                  std::uint64_t bytes, std::uint64_t blocked_ns);

// The summary record's "transport" member, and the lines of the stderr summary (none when no
// transport was seen and no flush reported). Exit path: allocates nothing.
void transport_summary_json(JsonLine &j);
void transport_summary_text(TextBuf &t);
// At activation: the call-site table the exit summary reads exists from then on.
void flush_reserve();
// At exit without CUMEMGUARD_SUMMARY: one line saying how many flushes were reported, if any.
void flush_exit_line();

// A record of the C API (`call` kind, api = the function's name) and the `nccl` record of an
// announced transport.
void capi_call_record(const char *api, const EventRef &ev, int res, std::uint64_t dur,
                      const char *arg_key, std::uint64_t arg);
void capi_suppress_record(const EventRef &ev, bool turned_on);

void flush_fork_prepare();
void flush_fork_parent();
void flush_fork_child();

}  // namespace cmg::shim
