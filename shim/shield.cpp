// SPDX-License-Identifier: Apache-2.0
// A failure inside the shim during a call: see shield.h.
#include "shield.h"

#include <atomic>
#include <cstdio>

#include "jsonline.h"
#include "loader.h"
#include "state.h"

namespace cmg::shim {

void internal_failure(Api api) {
  static std::atomic<bool> said{false};
  if (!g_state.load(std::memory_order_acquire)) return;  // nothing of the shim's is set up
  State &s = state();
  s.linear.distrust();
  s.vmm.distrust();
  if (said.exchange(true)) return;
  // Raw and from fixed buffers: what failed may be the host's memory itself.
  char msg[320];
  std::snprintf(msg, sizeof msg,
                "an allocation inside the shim failed (or another internal error) in %s: the call "
                "went to the driver unchanged, and from now on every call does (the shim no longer "
                "answers any call itself)",
                api_name(api));
  trace_line("warning: %s", msg);
  try {
    if (!s.log.is_open()) return;
    char buf[512];
    JsonLine j(buf, sizeof buf);
    j.str("k", "note").unum("ts", now_ns()).str("level", "warning").str("msg", msg);
    s.log.write(j.finish(), now_ns());
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
  }
}

}  // namespace cmg::shim
