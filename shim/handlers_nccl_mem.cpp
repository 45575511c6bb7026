// SPDX-License-Identifier: Apache-2.0
// Hook bodies of what a communicator holds: registrations, windows, suspend and resume, memory
// statistics (the model is policy/nccl_holds.h; the semantics and their NCCL sources are in
// docs/nccl.md).
#include "handlers.h"
#include <nccl.h>

#include "nccl_late.h"
#include "resident.h"

namespace cmg::shim {
namespace {

const char *event_name(Api api) {
  return kApis[static_cast<std::size_t>(api)].base;
}

int device_of(std::uint64_t comm) {
  const int d = state().transport.device_of(comm);
  return d >= 0 ? d : current_device();
}

}  // namespace

int nccl_register(std::uint64_t comm, std::uint64_t buff, std::uint64_t size, void **handle,
                  const void *caller, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommRegister, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommRegister, StackWhen::Always, Nested::Recorded);
    if (!c.tracked()) return fwd();
    // Made by NCCL itself (a window's own registration, through libnccl's PLT).
    const bool inside = made_by_nccl(caller);
    const int r = inside_nccl(fwd);
    NcclFields x;
    x.buff = buff;
    x.size = size;
    if (r == ncclSuccess && handle) {
      x.handle = reinterpret_cast<std::uintptr_t>(*handle);
      state().nccl.on_register(comm, buff, size, x.handle, inside, c.ev());
    }
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    Args args;
    args.hex("comm", comm).hex("buff", buff).u("size", size).hex("handle", x.handle);
    c.log(r, args);
    return r;
  });
}

int nccl_deregister(std::uint64_t comm, std::uint64_t handle, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommDeregister, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommDeregister, StackWhen::Never, Nested::Recorded);
    if (!c.tracked()) return fwd();
    const int r = inside_nccl(fwd);
    if (r == ncclSuccess) state().nccl.on_deregister(comm, handle);
    NcclFields x;
    x.handle = handle;
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    Args args;
    args.hex("comm", comm).hex("handle", handle);
    c.log(r, args);
    return r;
  });
}

int nccl_window_register(std::uint64_t comm, std::uint64_t buff, std::uint64_t size, void **win,
                         int flags, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommWindowRegister, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommWindowRegister, StackWhen::Always, Nested::Recorded);
    if (!c.tracked()) return fwd();
    const ThreadScope<std::uint64_t> comm_scope(t_nccl_comm, comm);
    const int r = inside_nccl(fwd);
    NcclFields x;
    x.buff = buff;
    x.size = size;
    x.has_flags = true;
    x.flags = flags;
    // 2.28.9 answers success and leaves *win as it was for a NULL buffer or size 0.
    if (r == ncclSuccess && win && buff && size) {
      x.handle = reinterpret_cast<std::uintptr_t>(*win);
      state().nccl.on_window(comm, buff, size, x.handle, c.ev());
    }
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    Args args;
    args.hex("comm", comm).hex("buff", buff).u("size", size).i("flags", flags).hex("win", x.handle);
    c.log(r, args);
    return r;
  });
}

int nccl_window_deregister(std::uint64_t comm, std::uint64_t win, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommWindowDeregister, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommWindowDeregister, StackWhen::Never, Nested::Recorded);
    if (!c.tracked()) return fwd();
    const int r = inside_nccl(fwd);
    // NCCL also deregisters windows of its own through its PLT (2.28.9: the device communicator's
    // resource window, ce_coll's sync window): unknown to the model, and ignored.
    if (r == ncclSuccess) state().nccl.on_window_deregister(comm, win);
    NcclFields x;
    x.handle = win;
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    Args args;
    args.hex("comm", comm).hex("win", win);
    c.log(r, args);
    return r;
  });
}

int nccl_suspend(std::uint64_t comm, int flags, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommSuspend, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommSuspend, StackWhen::Always, Nested::Recorded);
    if (!c.tracked()) return fwd();
    State &s = state();
    const bool mem = (flags & NCCL_SUSPEND_MEM) != 0;
    const auto st = s.transport.comm_state(comm);
    // A second NCCL_SUSPEND_MEM: NCCL refuses it (comm-suspend stands on refusal).
    std::optional<Finding> again;
    if (mem && st && st->suspended.known())
      again = nccl_findings::suspended_again(comm, st->suspended);
    int r;
    {
      struct Suspending {
        std::uint64_t prev = t_suspending;
        explicit Suspending(std::uint64_t comm) { t_suspending = comm; }
        ~Suspending() { t_suspending = prev; }
      } suspending(mem ? comm : 0);
      r = inside_nccl(fwd);
    }
    Args args;
    args.hex("comm", comm).i("flags", flags);
    NcclFindings after_call;
    if (again && decide(s.opts, again->cls, false).stands(r == ncclSuccess))
      after_call.add(std::move(*again));
    // Asleep now and quiet: no longer live for opportunistic-cleanup suppression (transport.h).
    if (r == ncclSuccess && mem) s.transport.on_suspended(comm, c.ev());
    NcclFields x;
    x.has_flags = true;
    x.flags = flags;
    for (const SleepingRange &sr : s.nccl.sleeping(comm)) {
      ++x.ranges;
      x.range_bytes += sr.size;
    }
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    c.log(r, args);
    after_call.report(c, r, args);
    // A suspend that released the communicator's memory is a boundary: what is still resident,
    // with the suspend's unmaps as the sleep that ended there.
    if (r == ncclSuccess && mem) snapshot_at_boundary("ncclCommSuspend", SnapshotTrigger::Suspend);
    return r;
  });
}

int nccl_resume(std::uint64_t comm, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommResume, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommResume, StackWhen::Always, Nested::Recorded);
    if (!c.tracked()) return fwd();
    State &s = state();
    const auto st = s.transport.comm_state(comm);
    std::optional<Finding> running;
    if (!st || !st->suspended.known())
      running = nccl_findings::resume_running(comm, st.has_value());
    // Running again from here on: an init-like transition, serialized with a running flush.
    s.transport.on_resume_enter(comm);
    const int r = inside_nccl(fwd);
    s.transport.on_resume_exit(comm, r == ncclSuccess);
    if (r == ncclSuccess) s.nccl.on_resumed(comm);
    Args args;
    args.hex("comm", comm);
    NcclFindings after_call;
    if (running && decide(s.opts, running->cls, false).stands(r == ncclSuccess))
      after_call.add(std::move(*running));
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, NcclFields{});
    c.log(r, args);
    after_call.report(c, r, args);
    return r;
  });
}

int nccl_mem_stats(std::uint64_t comm, int stat, const std::uint64_t *value, FnRef<int()> real) {
  return shielded<int>(Api::ncclCommMemStats, real, [&](auto &fwd) -> int {
    Call c(Api::ncclCommMemStats, StackWhen::Never, Nested::Recorded);
    if (!c.tracked()) return fwd();
    const int r = inside_nccl(fwd);
    NcclFields x;
    x.stat = stat;
    if (r == ncclSuccess && value) {
      x.has_value = true;
      x.value = *value;
    }
    nccl_record(c, event_name(c.api()), comm, device_of(comm), r, x);
    Args args;
    args.hex("comm", comm).i("stat", stat).u("value", x.value);
    c.log(r, args);
    return r;
  });
}

}  // namespace cmg::shim
