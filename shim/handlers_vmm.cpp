// SPDX-License-Identifier: Apache-2.0
// VMM and pool-trim hook bodies (see handlers.h for the common shape; legacy IPC is in
// handlers_ipc.cpp).
#include "bridge.h"
#include "busy.h"
#include "handlers.h"
#include "ipc_bridge.h"
#include "shield.h"
#include "text.h"
#include "resident.h"

namespace cmg::shim {
namespace {

// The multicast bindings of the allocations a call dropped (their last reference and mapping).
void report_bound(const Call &c, const VmmTicket &t, const std::string &what, const Args &args,
                  int res) {
  std::vector<Hold> held;
  t.dropped.each([&](const PhysAlloc &a) {
    for (Hold &h : state().nccl.take_bound(a.id)) held.push_back(std::move(h));
  });
  if (!held.empty()) report_held(c, std::move(held), what, args, res);
}

Location location_of(const CUmemAllocationProp *prop) {
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: return Location::Device;
    case CU_MEM_LOCATION_TYPE_HOST: return Location::Host;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return Location::HostNuma;
    default: return Location::Other;
  }
}

// Runs a VMM call whose transaction the model opened: the ticket says whether the driver is
// called (policy/decide.h), the model completes the transaction with the driver's answer, and the
// finding is reported when it stands. Nothing here decides.
// How long a release that the driver says is live waits for creates in flight to reach the model.
constexpr std::uint64_t kSettleNs = 1'000'000'000;

// t, from `begin`, with its skip confirmed with the driver's view where it rests on the model
// holding a value as released; returns that view.
template <class Begin>
DriverView confirm(VmmTicket &t, Begin &&begin) {
  struct Calls {
    InFlightCalls &c;
    InFlightCalls::Mark mark() const { return c.mark(); }
    bool quiet_since(const InFlightCalls::Mark &m) const { return c.quiet_since(m); }
    void settle() { c.settle(kSettleNs); }
  } calls{state().vmm.issues};
  return confirm_ticket(
      t, begin, [&] { return driver_view_of_handle(t.value); }, calls);
}

template <class Real>
CUresult run(Call &c, VmmTicket &t, Args &args, Real &&real, const DriverView &view = {}) {
  const VmmOutcome o = run_transaction(c.st().vmm, t, real, view);
  if (o.abort_first) report_finding(c, *t.finding, Action::Abort, -1, args);  // does not return
  if (o.report) report_finding(c, std::move(*t.finding), t.decision.action, o.status, args);
  Call::Extra x;
  x.skipped = !o.called;
  const bool ok = o.called && o.status == CUDA_SUCCESS;
  if (ok && (t.op == VmmTicket::Op::Unmap || t.op == VmmTicket::Op::Release)) {
    x.mem = MemKind::Vmm;
    x.dev = o.freed.dev;
    x.delta = -static_cast<std::int64_t>(o.freed.bytes);
  } else if (ok && t.va_freed) {
    x.mem = MemKind::Va;
    x.delta = -static_cast<std::int64_t>(t.size);
  }
  x.va_state = t.va_state;
  c.log(o.status, args, x);
  boundary_after_vmm(c, t, o.called, o.status);
  return static_cast<CUresult>(o.status);
}

}  // namespace

CUresult vmm_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags, decltype(&::cuMemCreate) drv) {
  // What the driver is asked: the program's request, or in bridge mode one with POSIX_FD added
  // (outside the body: a call forwarded after a failure inside it still asks for what it held).
  const CUmemAllocationProp *use = prop;
  CUmemAllocationProp wide{};
  auto real = [&] { return drv(h, size, use, flags); };
  return shielded<CUresult>(Api::cuMemCreate, real, [&](auto &fwd) {
    Call c(Api::cuMemCreate, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return untracked_alloc<CUresult>(fwd);
    if (!prop || !h) return fwd();
    const InFlightCall w(c.st().vmm.issues);  // until the model has the value
    // Bridge mode: an allocation without POSIX_FD can never be exported, so the type is added
    // where the device supports it; if the driver refuses the wider request, the program's own
    // request is made as it was (never worse than without the shim).
    const bool device = prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    const unsigned asked = static_cast<unsigned>(prop->requestedHandleTypes);
    wide = *prop;
    if (c.st().opts.ipc == IpcMode::Bridge && device && !(asked & ipc::kTypePosixFd))
      wide.requestedHandleTypes = static_cast<CUmemAllocationHandleType>(ipc::widened_types(
          asked, device, bridge::device_supports_posix_fd(prop->location.id)));
    use = wide.requestedHandleTypes != prop->requestedHandleTypes ? &wide : prop;
    bool retried = false;
    CUresult r = call_with_oom_retry<CUresult>(fwd, retried, "cuMemCreate");
    if (use != prop && r != CUDA_SUCCESS && r != CUDA_ERROR_OUT_OF_MEMORY) {
      use = prop;
      r = call_with_oom_retry<CUresult>(fwd, retried, "cuMemCreate");
    }
    Args args;
    args.u("size", size).i("loc_type", prop->location.type).i("loc_id", prop->location.id)
        .u("handle_types", asked).u("flags", flags);
    if (retried) args.u("retried_after_release", 1);
    if (use != prop) args.u("granted_types", static_cast<unsigned>(use->requestedHandleTypes));
    if (r != CUDA_SUCCESS) {
      c.log(r, args);
      boundary_after_create(c, r, 0, size);
      return r;
    }
    args.hex("handle", *h);
    const Location loc = location_of(prop);
    // The types the allocation really has (bug-patterns.md P15), not the ones first asked for.
    c.st().vmm.on_create(*h, size, loc, prop->location.id,
                          static_cast<unsigned>(use->requestedHandleTypes), false, c.ev(), t_vmm);
    Call::Extra x;
    x.mem = MemKind::Vmm;
    x.dev = loc == Location::Device ? prop->location.id : -1;
    x.delta = static_cast<std::int64_t>(size);
    c.log(r, args, x);
    boundary_after_create(c, r, *h, size);
    return r;
  });
}

CUresult vmm_release(CUmemGenericAllocationHandle h, decltype(&::cuMemRelease) drv) {
  auto real = [&] { return drv(h); };
  return shielded<CUresult>(Api::cuMemRelease, real, [&](auto &fwd) {
    Call c(Api::cuMemRelease, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    State &s = c.st();
    const InFlightCall w(s.vmm.issues);  // noted before the driver hears of it
    auto begin = [&] { return s.vmm.begin_release(h, c.ev(), t_vmm, s.opts); };
    VmmTicket t = begin();
    const DriverView view = confirm(t, begin);
    Args args;
    args.hex("handle", h);
    const CUresult r = run(c, t, args, fwd, view);
    if (r == CUDA_SUCCESS && !s.nccl.empty()) {
      // A multicast object released: its bindings go. An allocation whose last reference went
      // with this release while a multicast object still has it bound (free-bound).
      s.nccl.on_multicast_release(h);
      report_bound(c, t, "cuMemRelease of handle " + hex(h) + " (the last reference to it)", args,
                   r);
    }
    return r;
  });
}

CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                     unsigned long long flags, decltype(&::cuMemAddressReserve) drv) {
  auto real = [&] { return drv(ptr, size, align, addr, flags); };
  return shielded<CUresult>(Api::cuMemAddressReserve, real, [&](auto &fwd) {
    Call c(Api::cuMemAddressReserve, StackWhen::Always, Nested::Always);
    if (!c.tracked() || !ptr) return fwd();
    CUresult r = fwd();
    Args args;
    args.u("size", size).u("align", align).hex("addr", addr).u("flags", flags);
    if (r != CUDA_SUCCESS) {
      c.log(r, args);
      return r;
    }
    args.hex("ptr", *ptr);
    c.st().vmm.on_reserve(*ptr, size, c.ev(), t_vmm);
    if (t_nccl_comm) c.st().nccl.on_own_reserve(t_nccl_comm, *ptr, size);
    Call::Extra x;
    x.mem = MemKind::Va;
    x.delta = static_cast<std::int64_t>(size);
    c.log(r, args, x);
    return r;
  });
}

CUresult vmm_address_free(CUdeviceptr ptr, size_t size, decltype(&::cuMemAddressFree) drv) {
  auto real = [&] { return drv(ptr, size); };
  return shielded<CUresult>(Api::cuMemAddressFree, real, [&](auto &fwd) {
    Call c(Api::cuMemAddressFree, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    boundary_before_address_free(c, ptr);
    State &s = c.st();
    VmmTicket t = s.vmm.begin_address_free(ptr, size, c.ev(), t_vmm, s.opts);
    Args args;
    args.hex("ptr", ptr).u("size", size);
    const CUresult r = run(c, t, args, fwd);
    if (r == CUDA_SUCCESS && s.nccl.has_own()) s.nccl.on_address_freed(ptr);
    // A registration or window of addresses no longer reserved (when no unmap reported it before).
    if (r == CUDA_SUCCESS && !s.nccl.empty())
      if (auto held = s.nccl.take_overlapping(ptr, size); !held.empty())
        report_held(c, std::move(held), "cuMemAddressFree of " + range_text(ptr, size), args, r);
    return r;
  });
}

CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags, decltype(&::cuMemMap) drv) {
  auto real = [&] { return drv(ptr, size, offset, h, flags); };
  return shielded<CUresult>(Api::cuMemMap, real, [&](auto &fwd) {
    Call c(Api::cuMemMap, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    State &s = c.st();
    VmmTicket t = s.vmm.begin_map(ptr, size, offset, h, c.ev(), t_vmm, s.opts);
    Args args;
    args.hex("ptr", ptr).u("size", size).u("offset", offset).hex("handle", h).u("flags", flags);
    return run(c, t, args, fwd);
  });
}

CUresult vmm_unmap(CUdeviceptr ptr, size_t size, decltype(&::cuMemUnmap) drv) {
  auto real = [&] { return drv(ptr, size); };
  return shielded<CUresult>(Api::cuMemUnmap, real, [&](auto &fwd) {
    Call c(Api::cuMemUnmap, StackWhen::Always, Nested::Always);
    if (!c.tracked()) return fwd();
    State &s = c.st();
    const bool nccl_own = t_nccl_ending && s.nccl.own_teardown(t_nccl_ending, ptr, size);
    VmmTicket t = s.vmm.begin_unmap(ptr, size, c.ev(), t_vmm, s.opts, nccl_own);
    // Asked before the driver unmaps: afterwards the kernels would already have lost the range.
    const BusyResult busy = t.noted ? busy_check(s.opts.busy_check, t.dev) : BusyResult{};
    // Bridge exports of these pages stop serving before the driver unmaps them (docs/ipc-bridge.md).
    const auto exported = bridge::exports().begin_unmap(ptr, size);
    Args args;
    args.hex("ptr", ptr).u("size", size);
    const CUresult r = run(c, t, args, fwd);
    // NCCL putting a communicator's buffer to sleep (ncclCommSuspend runs on this thread).
    if (r == CUDA_SUCCESS && t_suspending && t.noted)
      s.nccl.on_suspend_unmap(t_suspending, ptr, size, c.ev());
    if (r == CUDA_SUCCESS && !s.nccl.empty()) {
      const std::string what = "cuMemUnmap of " + range_text(ptr, size);
      if (auto held = s.nccl.take_overlapping(ptr, size); !held.empty())
        report_held(c, std::move(held), what, args, r);
      report_bound(c, t, what, args, r);
    }
    if (busy.busy) {
      Finding f = vmm_findings::unmap_while_busy(t, busy.how, busy.waited_ns);
      report_finding(c, std::move(f), decide(s.opts, FindingClass::UnmapWhileBusy, false).action, r,
                     args);
    }
    if (!exported.empty())
      for (const auto &d : bridge::exports().end_unmap(exported, r == CUDA_SUCCESS))
        if (d.importers) {
          Finding f = ipc::free_exported_finding(d, api_name(c.api()), ptr, size);
          const Action a = decide(s.opts, f.cls, false).action;
          report_finding(c, std::move(f), a, r, args);
        }
    return r;
  });
}

CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count,
                        decltype(&::cuMemSetAccess) drv) {
  auto real = [&] { return drv(ptr, size, desc, count); };
  return shielded<CUresult>(Api::cuMemSetAccess, real, [&](auto &fwd) {
    Call c(Api::cuMemSetAccess, StackWhen::Never, Nested::Always);
    if (!c.tracked()) return fwd();
    CUresult r = fwd();
    Args args;
    args.hex("ptr", ptr).u("size", size).u("count", count);
    if (desc && count) args.i("loc_type", desc[0].location.type).i("loc_id", desc[0].location.id)
                           .u("access", desc[0].flags);
    Call::Extra x;
    if (r == CUDA_SUCCESS)
      c.st().vmm.on_set_access(ptr, size);
    else
      x.va_state = c.st().vmm.range_state(ptr, size);
    c.log(r, args, x);
    boundary_after_access(c, r);
    return r;
  });
}

CUresult vmm_retain(CUmemGenericAllocationHandle *h, void *addr,
                    decltype(&::cuMemRetainAllocationHandle) drv) {
  auto real = [&] { return drv(h, addr); };
  return shielded<CUresult>(Api::cuMemRetainAllocationHandle, real, [&](auto &fwd) {
    Call c(Api::cuMemRetainAllocationHandle, StackWhen::Always, Nested::Always);
    if (!c.tracked() || !h) return fwd();
    const InFlightCall w(c.st().vmm.issues);
    CUresult r = fwd();
    Args args;
    args.hex("addr", reinterpret_cast<std::uintptr_t>(addr));
    if (r == CUDA_SUCCESS) {
      args.hex("handle", *h);
      c.st().vmm.on_retain(*h, reinterpret_cast<std::uintptr_t>(addr), c.ev(), t_vmm);
    }
    c.log(r, args);
    return r;
  });
}

CUresult vmm_export(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                    unsigned long long flags, decltype(&::cuMemExportToShareableHandle) drv) {
  auto real = [&] { return drv(shareable, h, type, flags); };
  return shielded<CUresult>(Api::cuMemExportToShareableHandle, real, [&](auto &fwd) {
    Call c(Api::cuMemExportToShareableHandle, StackWhen::Never, Nested::Always);
    if (!c.tracked()) return fwd();
    CUresult r = fwd();
    Args args;
    args.hex("handle", h).u("type", static_cast<std::uint64_t>(type)).u("flags", flags);
    if (r == CUDA_SUCCESS && shareable && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      args.i("fd", *static_cast<int *>(shareable));
    c.log(r, args);
    return r;
  });
}

CUresult vmm_import(CUmemGenericAllocationHandle *h, void *os_handle,
                    CUmemAllocationHandleType type,
                    decltype(&::cuMemImportFromShareableHandle) drv, const void *caller) {
  auto real = [&] { return drv(h, os_handle, type); };
  return shielded<CUresult>(Api::cuMemImportFromShareableHandle, real, [&](auto &fwd) {
    Call c(Api::cuMemImportFromShareableHandle, StackWhen::Always, Nested::Always);
    if (!c.tracked() || !h) return fwd();
    const InFlightCall w(c.st().vmm.issues);
    CUresult r = fwd();
    Args args;
    args.u("type", static_cast<std::uint64_t>(type));
    if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
      args.i("fd", static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle)));
    if (r == CUDA_SUCCESS) {
      args.hex("handle", *h);
      // The size of an imported allocation is not known from the handle; mappings carry it.
      // Where the imported memory lives, from the driver (its size comes with its first mapping).
      static std::atomic<void *> props_slot{nullptr};
      CUmemAllocationProp prop{};
      auto props = driver_fn<PFN_cuMemGetAllocationPropertiesFromHandle_v10020>(
          props_slot, "cuMemGetAllocationPropertiesFromHandle");
      const bool known = props && props(&prop, *h) == CUDA_SUCCESS;
      // Ends this thread's pairing, as a retain does (case import-pairing).
      c.st().vmm.on_create(*h, 0, known ? location_of(&prop) : Location::Other,
                            known ? prop.location.id : -1, static_cast<unsigned>(type), true, c.ev(),
                            t_vmm);
      note_nccl_import(c, *h, caller);
    }
    c.log(r, args);
    return r;
  });
}

CUresult pool_trim(Api api, CUmemoryPool pool, size_t keep, decltype(&::cuMemPoolTrimTo) drv) {
  return trim_pool<CUresult>(api, reinterpret_cast<std::uintptr_t>(pool), keep,
                             [&] { return drv(pool, keep); });
}

}  // namespace cmg::shim
