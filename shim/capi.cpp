// SPDX-License-Identifier: Apache-2.0
// The C API of include/cumemguard.h: the seed's flush contract on the shim's transport registry.
// It works whether or not the program makes CUDA calls, and with CUMEMGUARD_DISABLE (then it
// writes nothing and only explicit suppression counts, since NCCL is no longer intercepted).
#include "cumemguard.h"

#include "flush.h"
#include "held.h"
#include "loader.h"
#include "state.h"

using namespace cmg::shim;
using cmg::EventRef;

namespace {

// An event for one C API call; seq 0 (nothing logged) when the shim is disabled.
EventRef begin(const char *api) {
  EventRef ev;
  if (disabled()) return ev;
  activate();  // the program talks to the shim: its log exists from here on
  State &s = state();
  if (s.opts.disable) return ev;
  ev.seq = s.seq.fetch_add(1, std::memory_order_relaxed) + 1;
  ev.ts = now_ns();
  ev.tid = thread_id();
  ev.api = api;
  return ev;
}

}  // namespace

CMG_EXPORT void cumemguard_suppress_opportunistic_cleanup(void) {
  const EventRef ev = begin("cumemguard_suppress_opportunistic_cleanup");
  const bool turned_on = state().transport.suppress_external(ev);
  if (ev.seq) capi_suppress_record(ev, turned_on);
}

CMG_EXPORT int cumemguard_maybe_empty_cache(void (*flush)(void *), void *arg) {
  const EventRef ev = begin("cumemguard_maybe_empty_cache");
  const bool ran = state().transport.run_flush(flush, arg);
  if (ev.seq)
    capi_call_record("cumemguard_maybe_empty_cache", ev, ran ? 1 : 0, now_ns() - ev.ts, "ran",
                     ran ? 1 : 0);
  return ran ? 1 : 0;
}

CMG_EXPORT int cumemguard_opportunistic_cleanup_suppressed(void) {
  return state().transport.suppressed() ? 1 : 0;
}

CMG_EXPORT size_t cumemguard_release_deferred(void) {
  const EventRef ev = begin("cumemguard_release_deferred");
  const std::uint64_t bytes = held().release_all(HoldReason::Deferred);
  if (ev.seq)
    capi_call_record("cumemguard_release_deferred", ev, 0, now_ns() - ev.ts, "bytes", bytes);
  return static_cast<size_t>(bytes);
}
