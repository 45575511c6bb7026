// SPDX-License-Identifier: Apache-2.0
// The hook bodies. Every one has the same shape: Call (init, re-entry guard, stamp) → ask the model
// → forward or not → tell the model what really happened → log → return the real status.
// Templates serve the runtime and the driver alike (their statuses are both 0 on success).
#pragma once

#include <functional>

#include "bridge.h"
#include "held.h"
#include "loader.h"
#include "state.h"

namespace cmg::shim {

thread_local inline ThreadVmmState t_vmm;

// Frees accepted by each family of free calls.
inline constexpr KindMask kDeviceFrees =
    kind_bit(MemKind::Linear) | kind_bit(MemKind::Async) | kind_bit(MemKind::Managed);
inline constexpr KindMask kHostFrees = kind_bit(MemKind::Host);

// Out of memory is 2 in both the driver (CUDA_ERROR_OUT_OF_MEMORY) and the runtime
// (cudaErrorMemoryAllocation).
inline constexpr int kOutOfMemory = 2;
static_assert(CUDA_ERROR_OUT_OF_MEMORY == kOutOfMemory && cudaErrorMemoryAllocation == kOutOfMemory);

// When an allocation fails for lack of memory and the shim holds frees back, it releases them
// and retries once: holding memory must never turn a success into an out-of-memory.
template <class R, class Real>
R call_with_oom_retry(Real &&real, bool &retried) {
  R r = real();
  retried = false;
  if (static_cast<int>(r) == kOutOfMemory && !held().empty()) {
    held().release_all();
    retried = true;
    r = real();
  }
  return r;
}

// Quarantine applies to synchronous frees of linear, managed and host memory.
inline bool quarantined(Api api, MemKind kind) {
  if (state().opts.quarantine == 0) return false;
  const bool sync_free = api == Api::cudaFree || api == Api::cuMemFree_v2 ||
                         api == Api::cudaFreeHost || api == Api::cuMemFreeHost;
  return sync_free && kind != MemKind::Ipc;
}

// Linear allocation (cudaMalloc, cuMemAlloc_v2, host, managed, async, pitch). `out` reads the new
// pointer after success; `size_of` is the size, or a callable giving it after success (pitch).
template <class R, class Size, class Real, class Out>
R linear_alloc(Api api, MemKind kind, Size size_of, Real &&real, Out &&out) {
  Call c(api, StackWhen::Sampled);
  if (!c.tracked()) return real();
  bool retried = false;
  R r = call_with_oom_retry<R>(real, retried);
  Args args;
  if (retried) args.u("retried_after_release", 1);
  if (r != R(0)) {
    if constexpr (!std::is_invocable_v<Size>) args.u("size", size_of);
    c.log(static_cast<int>(r), args);
    return r;
  }
  std::uint64_t size;
  if constexpr (std::is_invocable_v<Size>)
    size = size_of();
  else
    size = size_of;
  args.u("size", size);
  const std::uint64_t p = out();
  args.hex("ptr", p);
  if (p == 0) {
    c.log(0, args);
    return r;
  }
  const int dev = kind == MemKind::Host ? -1 : current_device();
  State &s = state();
  s.linear.on_alloc(LinearRec{p, size, dev, kind, c.ev()});
  s.counters.add(dev, kind, static_cast<std::int64_t>(size));
  c.log(0, args, Call::Extra{dev, kind, static_cast<std::int64_t>(size)});
  return r;
}

// Linear free (cudaFree, cuMemFree_v2, host frees, async frees).
template <class R, class Real>
R linear_free(Api api, KindMask accepted, std::uint64_t ptr, Real &&real) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  FreeVerdict v = s.linear.begin_free(ptr, accepted, c.ev());
  Args args;
  args.hex("ptr", ptr);
  if (v.cls == FreeClass::Live) {
    if (quarantined(api, v.rec.kind)) {
      // Answer success now, free later: the address is not re-issued while it is held.
      held().hold(Held{v.rec.ptr, v.rec.size, v.rec.dev, v.rec.kind, api,
                       HoldReason::Quarantine, c.ev()});
      const auto delta = -static_cast<std::int64_t>(v.rec.size);
      s.counters.add(v.rec.dev, v.rec.kind, delta);
      args.u("size", v.rec.size).s("held", "quarantine");
      c.log(0, args, Call::Extra{v.rec.dev, v.rec.kind, delta});
      held().release_down_to(HoldReason::Quarantine, s.opts.quarantine);
      return R(0);
    }
    R r = real();
    if (r != R(0)) {
      s.linear.rollback(v);
      c.log(static_cast<int>(r), args);
      return r;
    }
    const auto delta = -static_cast<std::int64_t>(v.rec.size);
    s.counters.add(v.rec.dev, v.rec.kind, delta);
    args.u("size", v.rec.size);
    c.log(0, args, Call::Extra{v.rec.dev, v.rec.kind, delta});
    return r;
  }
  if (v.cls == FreeClass::Null) {
    R r = real();
    c.log(static_cast<int>(r), args);
    return r;
  }
  if (v.cls == FreeClass::Unknown || v.cls == FreeClass::Interior) {
    if (auto res = s.vmm.reservation_containing(ptr)) {
      v.cls = FreeClass::InVmm;
      v.vmm_base = res->base;
      v.vmm_size = res->size;
    }
  }
  Finding f = finding_for_free(v, api_name(api), ptr);
  const bool proven = v.cls == FreeClass::DoubleFree;
  const Action a = decide(f, proven);
  if (a == Action::Skip) {
    report_finding(c, std::move(f), a, 0, args);
    Call::Extra x;
    x.skipped = true;
    c.log(0, args, x);
    return R(0);
  }
  if (a == Action::Abort && !needs_driver_refusal(f.cls)) report_finding(c, f, a, -1, args);
  R r = real();
  if (!needs_driver_refusal(f.cls) || r != R(0)) report_finding(c, std::move(f), a, static_cast<int>(r), args);
  c.log(static_cast<int>(r), args);
  return r;
}

// VMM and IPC handlers (driver ABI; the runtime IPC hooks call them with a runtime forwarder).
CUresult vmm_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags);
CUresult vmm_release(CUmemGenericAllocationHandle h);
CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                     unsigned long long flags);
CUresult vmm_address_free(CUdeviceptr ptr, size_t size);
CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags);
CUresult vmm_unmap(CUdeviceptr ptr, size_t size);
CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
CUresult vmm_retain(CUmemGenericAllocationHandle *h, void *addr);
CUresult vmm_export(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                    unsigned long long flags);
CUresult vmm_import(CUmemGenericAllocationHandle *h, void *os_handle, CUmemAllocationHandleType type);
CUresult pool_trim(Api api, CUmemoryPool pool, size_t keep);

// Legacy IPC (handlers_ipc.cpp): `real` performs the call; statuses are the caller's family's
// (CUresult or cudaError_t), given by `codes`. `handle` is the caller's 64-byte handle: written by
// ipc_get in bridge mode, read by ipc_open (a bridge handle never reaches the driver).
struct IpcApi {
  Api api;
  bridge::Codes codes;
  bool runtime;  // cudaIpc*: a missing context is created, as cudart does
};
int ipc_get(const IpcApi &k, void *handle, std::uint64_t ptr, const std::function<int()> &real);
int ipc_open(const IpcApi &k, const void *handle, unsigned flags, bool out_ok,
             const std::function<int()> &real, const std::function<std::uint64_t()> &out,
             const std::function<void(std::uint64_t)> &set_out);
int ipc_close(const IpcApi &k, std::uint64_t ptr, const std::function<int()> &real);

// cuGetProcAddress / cudaGetDriverEntryPoint*: forward, then hand back our wrapper of exactly the
// export the driver returned.
template <class R>
R route_after(R r, const char *symbol, void **pfn) {
  if (r == R(0) && pfn && *pfn) *pfn = route_proc(*pfn, symbol);
  return r;
}

// NCCL communicator lifecycle (statuses are ncclResult_t values).
enum class CommEvent : std::uint8_t { Create, Finalize, Destroy };
int nccl_call(Api api, CommEvent ev, const std::function<int()> &real,
              const std::function<void(Args &, int &created, std::uint64_t &comm)> &after);

}  // namespace cmg::shim
