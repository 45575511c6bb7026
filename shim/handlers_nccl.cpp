// SPDX-License-Identifier: Apache-2.0
// NCCL communicator-lifecycle hook body: the transport registry and the `nccl` log record.
#include "handlers.h"
#include <nccl.h>

namespace cmg::shim {

int nccl_call(Api api, CommEvent ev, const std::function<int()> &real,
              const std::function<void(Args &, int &, std::uint64_t &)> &after) {
  Call c(api, StackWhen::Never, Nested::Recorded);
  if (!c.tracked()) return real();
  State &s = state();
  const bool was_suppressed = s.transport.suppressed();
  if (ev == CommEvent::Create) s.transport.on_create_enter();
  int r = real();
  Args args;
  int created = 0;
  std::uint64_t comm = 0;
  if (r == ncclSuccess || r == ncclInProgress) after(args, created, comm);
  if (ev == CommEvent::Create) s.transport.on_create_exit(created);
  if (ev == CommEvent::Destroy && r == ncclSuccess) s.transport.on_destroy();
  if (s.log.is_open()) {
    char buf[512];
    JsonLine j(buf, sizeof buf);
    const char *name = kApis[static_cast<std::size_t>(api)].base;
    j.str("k", "nccl").unum("seq", c.ev().seq).unum("ts", c.ev().ts).unum("tid", c.ev().tid)
        .str("event", name).str("api", api_name(api)).hex("comm", comm).num("dev", current_device())
        .num("res", r).num("live", s.transport.live());
    if (ev == CommEvent::Create && !was_suppressed) j.boolean("suppressed", true);
    s.log.write(j.finish(), now_ns());
  }
  c.log(r, args);
  return r;
}

}  // namespace cmg::shim
