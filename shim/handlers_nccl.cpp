// SPDX-License-Identifier: Apache-2.0
// NCCL communicator-lifecycle hook body: the transport registry and the `nccl` log record.
#include "handlers.h"
#include <nccl.h>

namespace cmg::shim {

int nccl_call(Api api, CommEvent ev, FnRef<int()> real,
              FnRef<void(Args &, std::vector<CommOnDevice> &)> after) {
  return shielded<int>(api, real, [&](auto &fwd) -> int {
    Call c(api, StackWhen::Never, Nested::Recorded);
    if (!c.tracked()) return fwd();
    State &s = state();
    const int dev = current_device();
    // Suppression begins before NCCL starts any background work (nccl-and-cleanup.md 6.1), and
    // waits for a cumemguard_maybe_empty_cache() flush that is already running.
    const bool turned_on = ev == CommEvent::Create && s.transport.on_create_enter(c.ev());
    int r;
    {
      struct InNccl {
        bool prev = t_in_nccl;
        InNccl() { t_in_nccl = true; }
        ~InNccl() { t_in_nccl = prev; }
      } in_nccl;
      r = fwd();
    }
    Args args;
    std::vector<CommOnDevice> comms;
    if (r == ncclSuccess || r == ncclInProgress) after(args, comms);
    for (CommOnDevice &cd : comms)
      if (cd.dev < 0) cd.dev = dev;
    // A failed setup adds nothing; suppression stays on all the same (sticky).
    if (ev == CommEvent::Create) s.transport.on_create_exit(comms);
    if (ev == CommEvent::Destroy && r == ncclSuccess)
      for (const CommOnDevice &cd : comms) s.transport.on_destroy(cd.comm);
    if (s.log.is_open()) {
      char buf[512];
      JsonLine j(buf, sizeof buf);
      const char *name = kApis[static_cast<std::size_t>(api)].base;
      j.str("k", "nccl")
          .unum("seq", c.ev().seq)
          .unum("ts", c.ev().ts)
          .unum("tid", c.ev().tid)
          .str("event", name)
          .str("api", api_name(api))
          .hex("comm", comms.empty() ? 0 : comms[0].comm)
          .num("dev", comms.empty() ? dev : comms[0].dev)
          .num("res", r)
          .num("live", s.transport.live());
      if (turned_on) j.boolean("suppressed", true);
      s.log.write(j.finish(), now_ns());
    }
    c.log(r, args);
    return r;
  });
}

}  // namespace cmg::shim
