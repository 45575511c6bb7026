// SPDX-License-Identifier: Apache-2.0
// NCCL communicator-lifecycle hook body: the transport registry, what a communicator's end takes
// with it, and the `nccl` log record.
#include "handlers.h"
#include <dlfcn.h>
#include "resident.h"
#include <nccl.h>

#include <cstring>

#include "text.h"

namespace cmg::shim {
namespace {

const char *event_name(Api api) {
  return kApis[static_cast<std::size_t>(api)].base;
}

// A destroy or abort of a communicator the registry saw end, not created again since: NCCL would
// read the freed communicator (2.28.9 init.cc clears its magic and frees it). Every create path
// of NCCL up to 2.30 is hooked (api_nccl.def), so a pointer issued again is seen; NCCL has no
// query that is safe on a freed communicator, so none is asked.
std::optional<Finding> ended_before(Api api, std::uint64_t comm) {
  State &s = state();
  if (!comm || s.transport.comm_state(comm)) return std::nullopt;
  const std::optional<EventRef> end = s.transport.ended(comm);
  if (!end) return std::nullopt;
  return nccl_findings::ended_again(api_name(api), comm, *end);
}

// The end of a communicator (destroy or abort succeeded): its registrations and windows go with
// it; peer memory NCCL imported on its device while it was live and that is still mapped once no
// communicator is live there is reported now, at the boundary, not only as a leak at exit.
std::optional<Finding> on_ended(const Call &c, Api api, std::uint64_t comm,
                                const Transport::CommState &st) {
  State &s = state();
  s.transport.on_destroy(comm, c.ev());
  s.nccl.on_comm_end(comm);
  if (s.transport.live_on(st.dev) != 0) return std::nullopt;  // an import's owner is not known yet
  const std::vector<PeerImport> left =
      s.nccl.take_mapped_imports(st.dev, st.created.seq, [&](std::uint64_t id) {
        const auto a = s.vmm.alloc(id);
        return a && a->map_count != 0;
      });
  if (left.empty()) return std::nullopt;
  std::uint64_t bytes = 0;
  for (const PeerImport &imp : left)
    if (const auto a = s.vmm.alloc(imp.alloc_id)) bytes += a->size;
  return nccl_findings::imports_after_end(api_name(api), comm, left, bytes);
}

}  // namespace

void nccl_record(const Call &c, const char *event, std::uint64_t comm, int dev, int res,
                 const NcclFields &x) {
  State &s = state();
  if (!s.log.is_open()) return;
  char buf[640];
  JsonLine j(buf, sizeof buf);
  j.str("k", "nccl")
      .unum("seq", c.ev().seq)
      .unum("ts", c.ev().ts)
      .unum("tid", c.ev().tid)
      .str("event", event)
      .str("api", api_name(c.api()))
      .hex("comm", comm)
      .num("dev", dev)
      .num("res", res)
      .num("live", s.transport.live());
  if (x.buff || x.size) j.hex("buff", x.buff).unum("size", x.size);
  if (x.handle) j.hex("handle", x.handle);
  if (x.has_flags) j.num("flags", x.flags);
  if (x.stat >= 0) j.num("stat", x.stat);
  if (x.has_value) j.unum("value", x.value);
  if (x.ranges) j.unum("ranges", x.ranges).unum("range_bytes", x.range_bytes);
  if (x.suppressed) j.boolean("suppressed", true);
  if (c.ev().stack) j.unum("stack", c.ev().stack);
  s.log.write(j.finish(), now_ns());
}

int nccl_call(Api api, CommEvent ev, std::uint64_t named, FnRef<int()> real,
              FnRef<void(Args &, std::vector<CommOnDevice> &)> after) {
  return shielded<int>(api, real, [&](auto &fwd) -> int {
    Call c(api, StackWhen::Never, Nested::Recorded);
    if (!c.tracked()) return fwd();
    State &s = state();
    const int dev = current_device();
    Args args;
    if (named) args.hex("comm", named);
    const std::optional<Transport::CommState> st =
        named ? s.transport.comm_state(named) : std::nullopt;
    const int named_dev = st ? st->dev : dev;
    std::optional<Finding> again =
        ev == CommEvent::Destroy ? ended_before(api, named) : std::nullopt;
    Decision d;
    // Findings are reported after the call's `nccl` and `call` records, which share its seq: the
    // reader releases events in seq order, and one between the two would make the second late.
    NcclFindings after_call;
    if (again) {
      d = decide(s.opts, again->cls, /*skippable=*/true);
      if (d.abort_first) report_finding(c, *again, Action::Abort, -1, args);  // does not return
      if (d.skip) {
        nccl_record(c, event_name(api), named, named_dev, ncclSuccess, NcclFields{});
        Call::Extra x;
        x.skipped = true;
        c.log(ncclSuccess, args, x);
        after_call.add(std::move(*again), d.action);
        after_call.report(c, ncclSuccess, args);
        return ncclSuccess;
      }
    }
    // Suppression begins before NCCL starts any background work (nccl-and-cleanup.md 6.1), and
    // waits for a cumemguard_maybe_empty_cache() flush that is already running.
    const bool turned_on = ev == CommEvent::Create && s.transport.on_create_enter(c.ev());
    const bool ending = ev == CommEvent::Destroy || ev == CommEvent::Finalize;
    const ThreadScope<std::uint64_t> ending_scope(t_nccl_ending, ending ? named : t_nccl_ending);
    const int r = inside_nccl(fwd);
    std::vector<CommOnDevice> comms;
    if (r == ncclSuccess || r == ncclInProgress) after(args, comms);
    for (CommOnDevice &cd : comms)
      if (cd.dev < 0) cd.dev = dev;
    // A failed setup adds nothing; suppression stays on all the same (sticky).
    if (ev == CommEvent::Create) s.transport.on_create_exit(comms, c.ev());
    if (again) after_call.add(std::move(*again), d.action);
    if (ev == CommEvent::Destroy && st && st->suspended.known() && r != ncclSuccess) {
      // NCCL refused the teardown of a suspended communicator (comm-suspend stands on refusal).
      after_call.add(nccl_findings::teardown_suspended(api_name(api), named, st->suspended,
                                                       s.nccl.sleeping(named), r));
    }
    if (ev == CommEvent::Destroy && r == ncclSuccess) {
      if (!st)
        s.transport.on_destroy(named, c.ev());  // made before the shim saw it: only its end
      else if (auto left = on_ended(c, api, named, *st))
        after_call.add(std::move(*left));
    }
    NcclFields x;
    x.suppressed = turned_on;
    nccl_record(c, event_name(api), named ? named : (comms.empty() ? 0 : comms[0].comm),
                named ? named_dev : (comms.empty() ? dev : comms[0].dev), r, x);
    c.log(r, args);
    after_call.report(c, r, args);
    boundary_after_nccl(api, ev == CommEvent::Create && (r == ncclSuccess || r == ncclInProgress),
                        ev == CommEvent::Destroy && r == ncclSuccess, comms);
    return r;
  });
}

void NcclFindings::add(Finding f) {
  const Action a = decide(state().opts, f.cls, false).action;
  add(std::move(f), a);
}

void NcclFindings::report(const Call &c, int res, const Args &args) {
  for (Finding &f : list) report_finding(c, std::move(f), actions[&f - list.data()], res, args);
  list.clear();
  actions.clear();
}

bool made_by_nccl(const void *caller) {
  if (t_in_nccl) return true;
  // NCCL's proxy threads and its group-end jobs call outside any NCCL call of this thread the
  // shim hooks; the caller's object says it (these calls are rare: one dladdr is nothing to them).
  Dl_info info;
  if (!caller || !dladdr(caller, &info) || !info.dli_fname) return false;
  const char *slash = std::strrchr(info.dli_fname, '/');
  return std::strncmp(slash ? slash + 1 : info.dli_fname, "libnccl", 7) == 0;
}

void note_nccl_import(const Call &c, std::uint64_t handle, const void *caller) {
  if (!made_by_nccl(caller)) return;
  State &s = state();
  const auto h = s.vmm.handle(handle);
  if (!h) return;
  s.nccl.on_import(PeerImport{h->alloc_id, handle, current_device(), c.ev(), false});
}

void report_held(const Call &c, std::vector<Hold> held, const std::string &what, const Args &args,
                 int res) {
  State &s = state();
  for (const Hold &h : held) {
    Finding f = nccl_findings::freed_while_held(what, h);
    const Action a = decide(s.opts, f.cls, false).action;
    report_finding(c, std::move(f), a, res, args);
  }
}

}  // namespace cmg::shim
