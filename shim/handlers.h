// SPDX-License-Identifier: Apache-2.0
// The hook bodies. Every one has the same shape: Call (init, re-entry guard, stamp) → ask the model
// → forward or not → tell the model what really happened → log → return the real status.
// Templates serve the runtime and the driver alike (their statuses are both 0 on success).
#pragma once

#include <functional>
#include <type_traits>
#include <vector>

#include "bridge.h"
#include "driver_view.h"
#include "flush.h"
#include "handlers_capture.h"
#include "held.h"
#include "loader.h"
#include "shield.h"
#include "state.h"
#include "text.h"

namespace cmg::shim {

CMG_HOT_TLS inline ThreadVmmState t_vmm;
// No destructor to register per thread: a forked child's leak checker would see every other
// thread's registration as a leak (those threads are not in the child).
static_assert(std::is_trivially_destructible_v<ThreadVmmState>);
// This thread is inside an NCCL communicator-lifecycle call (nccl_call).
CMG_HOT_TLS inline bool t_in_nccl = false;

// Frees accepted by each family of free calls.
inline constexpr KindMask kDeviceFrees =
    kind_bit(MemKind::Linear) | kind_bit(MemKind::Async) | kind_bit(MemKind::Managed);
inline constexpr KindMask kHostFrees = kind_bit(MemKind::Host);

// Out of memory is 2 in both the driver (CUDA_ERROR_OUT_OF_MEMORY) and the runtime
// (cudaErrorMemoryAllocation).
inline constexpr int kOutOfMemory = 2;
static_assert(CUDA_ERROR_OUT_OF_MEMORY == kOutOfMemory &&
              cudaErrorMemoryAllocation == kOutOfMemory);

// When an allocation fails for lack of memory and the shim holds frees back, it releases them
// and retries once: holding memory must never turn a success into an out-of-memory. Not while a
// stream capture is open: a free inside it would invalidate the capture (PyTorch's allocator does
// the same: it releases its cached blocks only while no capture is underway); that release waits
// for the capture's end, and a note says so (may_release_held).
// Inline: on every allocation the answer is almost always "not out of memory".
template <class R, class Real>
__attribute__((always_inline)) inline R call_with_oom_retry(Real &&real, bool &retried,
                                                            const char *api = nullptr) {
  R r = real();
  retried = false;
  if (static_cast<int>(r) == kOutOfMemory && !held().empty() && may_release_held(api)) {
    held().release_all();
    retried = true;
    r = real();
  }
  return r;
}

// An allocation made inside another intercepted call is not recorded, but one that NCCL makes
// inside ncclCommInitRank* (its buffers) still gets the release-and-retry: memory the shim holds
// back must never make a communicator's setup fail (bug-patterns.md P19).
template <class R, class Real>
R untracked_alloc(Real &&real) {
  if (!t_in_nccl) return real();
  bool retried = false;
  return call_with_oom_retry<R>(real, retried);
}

// The frees that wait for all work on the device (real-driver.md section 3): the ones the
// quarantine and the flush policy may hold back. Stream-ordered memory is never among them.
inline bool sync_free_api(Api api) {
  return api == Api::cudaFree || api == Api::cuMemFree_v2 || api == Api::cudaFreeHost ||
         api == Api::cuMemFreeHost;
}
inline constexpr KindMask kSyncFreedKinds = ~(kind_bit(MemKind::Ipc) | kind_bit(MemKind::Async));
inline bool sync_free(Api api, MemKind kind) {
  return sync_free_api(api) && (kSyncFreedKinds & kind_bit(kind));
}

// cudaFreeAsync and cuMemFreeAsync (and their _ptsz twins): frees ordered on a stream.
inline bool api_is_stream_ordered_free(Api api) {
  return api == Api::cudaFreeAsync || api == Api::cudaFreeAsync_ptsz ||
         api == Api::cuMemFreeAsync || api == Api::cuMemFreeAsync_ptsz;
}

// Quarantine applies to synchronous frees of linear, managed and host memory.
// `s` is the call's state (Call::st): the hooks read the state pointer once per call.
inline bool quarantined_api(const State &s, Api api) {
  return s.opts.quarantine != 0 && sync_free_api(api);
}
inline constexpr KindMask kQuarantinedKinds = kSyncFreedKinds;
inline bool quarantined(const State &s, Api api, MemKind kind) {
  return quarantined_api(s, api) && (kQuarantinedKinds & kind_bit(kind));
}

// What NCCL or a multicast object still holds of memory a call took away (free-registered,
// free-bound), reported after the call with its status. `what` phrases the call ("cudaFree of
// 0x... (+N bytes)").
void report_held(const Call &c, std::vector<Hold> held, const std::string &what, const Args &args,
                 int res);
// The holds a linear free of a live allocation meets (none, at one atomic load, while nothing is
// held).
inline std::vector<Hold> held_by(State &s, std::uint64_t ptr, std::uint64_t size) {
  return s.nccl.empty() ? std::vector<Hold>{} : s.nccl.take_overlapping(ptr, size);
}

// Linear allocation (cudaMalloc, cuMemAlloc_v2, host, managed, async, pitch). `out` reads the new
// pointer after success; `size_of` is the size, or a callable giving it after success (pitch).
// Stream-ordered allocations name their stream (`ptsz`: a _ptsz export, where a null stream is
// the per-thread one): on a capturing stream the driver makes an allocation node, not memory.
template <class R, class Size, class Real, class Out>
R linear_alloc(Api api, MemKind kind, Size size_of, Real &&real, Out &&out,
               std::uint64_t stream = 0, bool ptsz = false) {
  return shielded<R>(
      api, real, [&](auto &fwd) __attribute__((always_inline))->R {
        Call c(api, StackWhen::Sampled);
        if (!c.tracked()) return untracked_alloc<R>(fwd);
        std::uint64_t asked = 0;
        if constexpr (!std::is_invocable_v<Size>) asked = size_of;
        // Read once: a capture this thread could be making the allocation for cannot begin
        // meanwhile.
        const bool capturing = capture_open(c.st());
        // A synchronous allocation during an open capture that prohibits it (capture-unsafe).
        const bool unsafe = capturing && kind != MemKind::Async && unsafe_before(c);
        bool retried = false;
        R r = call_with_oom_retry<R>(fwd, retried, api_name(api));
        Args args;
        if (retried) {
          args.u("retried_after_release", 1);
          // The runtime remembers the failed first attempt as its last error; the caller got
          // success.
          if (r == R(0) && kApis[static_cast<std::size_t>(api)].family == Family::Runtime)
            clear_runtime_error();
        }
        if (r != R(0)) {
          if constexpr (!std::is_invocable_v<Size>) args.u("size", size_of);
          if (unsafe) [[unlikely]]
            unsafe_after(c, static_cast<int>(r), 0, asked, args);
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
        if (capturing && kind == MemKind::Async && captured_alloc(c, stream, ptsz, p, size, args))
          return r;
        const int dev = kind == MemKind::Host ? -1 : current_device();
        State &s = c.st();
        LinearRec rec{p, size, dev, kind, c.ev()};
        rec.stream = stream;
        if (capturing) [[unlikely]] {
          // Made while a capture is open on this thread: the graph's memory (PyTorch's private
          // pool).
          rec.capture = capture_for_alloc(size);
          if (rec.capture) args.u("capture", rec.capture);
        }
        s.linear.on_alloc(rec);
        const MemKind counted = counted_kind(rec);
        s.counters.add(dev, counted, static_cast<std::int64_t>(size));
        c.log(0, args, Call::Extra{dev, counted, static_cast<std::int64_t>(size)});
        return r;
      });
}

// The free of a live allocation: held back (a deferred cache flush, the quarantine) or forwarded,
// with the finding of an opportunistic flush (docs/transport.md). Intentional frees are never
// held by the flush policy; a flush that would pass CUMEMGUARD_DEFER_LIMIT goes through. A held
// free's record is Held in the linear model (a second free of it is a proven double free) until
// held() gives it to the driver.
template <class R, class Real>
__attribute__((always_inline)) inline R free_live(Call &c, Api api, LinearTicket &t, Args &args,
                                                  Real &&real, std::uint64_t stream,
                                                  bool may_hold) {
  State &s = c.st();
  const LinearRec &v = t.rec;
  const auto delta = -static_cast<std::int64_t>(v.size);
  const MemKind counted = counted_kind(v);
  const Call::Extra freed{v.dev, counted, delta};
  args.u("size", v.size);
  // Hands the free to held() with `put`, its record Held (by begin_free already when the
  // quarantine holds its kind); when held() does not take it, the record is Freed and the ticket
  // goes on with that generation.
  auto hold = [&](HoldReason why, auto &&put) {
    const std::uint32_t gen = t.holding ? t.gen : s.linear.mark_held(t);
    t.holding = false;
    const Held h{v.ptr, v.size, v.dev, v.kind, api, why, c.ev(), gen};
    if (put(h)) return true;
    if (h.gen) t.gen = s.linear.given_back(v.ptr, h.gen);
    return false;
  };
  FlushCheck fc;
  if (sync_free(api, v.kind)) fc = flush_check(c, FlushTarget::Free);
  if (fc.opportunistic && fc.action == Action::Defer && !may_hold) fc.action = Action::Forward;
  if (fc.opportunistic && fc.action == Action::Defer) {
    if (hold(HoldReason::Deferred,
             [&](const Held &h) { return held().hold_within(h, s.opts.defer_limit); })) {
      s.counters.add(v.dev, counted, delta);
      flush_report(c, fc, args, 0, v.size, 0);
      Call::Extra x = freed;
      x.deferred = true;
      c.log(0, args, x);
      return R(0);
    }
    fc.action = Action::Forward;
    fc.over_limit = !held().closed();  // at exit nothing is held back, and no limit was reached
  }
  if (fc.opportunistic && fc.action == Action::Abort) flush_report(c, fc, args, -1, v.size, 0);
  // Answer success now, free later: the address is not re-issued while it is held.
  if (may_hold && quarantined(s, api, v.kind) &&
      hold(HoldReason::Quarantine, [](const Held &h) { return held().hold(h); })) {
    s.counters.add(v.dev, counted, delta);
    args.s("held", "quarantine");
    // The older frees the quarantine gives back now are where a flush blocks (each cudaFree
    // waits for the device): their time is this flush's.
    const std::uint64_t t0 = fc.opportunistic ? now_ns() : 0;
    held().release_down_to(HoldReason::Quarantine, quarantine_limit(v.dev));
    if (fc.opportunistic) flush_report(c, fc, args, 0, v.size, now_ns() - t0);
    c.log(0, args, freed);
    return R(0);
  }
  // A free of the other kind's memory while work may still use it (free-kind-mismatch): asked
  // before the driver frees.
  const bool sync_api = !api_is_stream_ordered_free(api);
  const bool mismatch =
      (v.kind == MemKind::Async || !sync_api) && kind_mismatch_before(c, sync_api, v, stream, args);
  const std::uint64_t t0 = fc.opportunistic ? now_ns() : 0;
  R r = real();
  if (fc.opportunistic) flush_report(c, fc, args, static_cast<int>(r), v.size, now_ns() - t0);
  if (mismatch) [[unlikely]]
    kind_mismatch_after(c, sync_api, v, stream, static_cast<int>(r), args);
  if (r != R(0)) {
    s.linear.end(t, false);  // live again (an accepted free's end() would change nothing)
    c.log(static_cast<int>(r), args);
    return r;
  }
  s.counters.add(v.dev, counted, delta);
  c.log(0, args, freed);
  return r;
}

// Linear free (cudaFree, cuMemFree_v2, host frees, async frees; these name their stream): one
// transaction of the linear model (begin_free → the driver → end), like a VMM call.
template <class R, class Real>
R linear_free(Api api, KindMask accepted, std::uint64_t ptr, Real &&real, std::uint64_t stream = 0,
              bool ptsz = false) {
  return shielded<R>(
      api, real, [&](auto &fwd) __attribute__((always_inline))->R {
        Call c(api, StackWhen::Always);
        if (!c.tracked()) return fwd();
        State &s = c.st();
        Args args;
        args.hex("ptr", ptr);
        using FwdFn = std::remove_reference_t<decltype(fwd)>;
        auto forward = [](void *f) { return static_cast<int>((*static_cast<FwdFn *>(f))()); };
        int status = 0;
        bool unsafe = false;
        // Read once: while a capture is open nothing is held (it would have to be given back
        // inside the capture).
        const bool capturing = ptr && capture_open(s);
        const bool may_hold = !capturing || may_hold_frees();
        if (capturing) [[unlikely]] {
          // A stream-ordered free on a capturing stream is a free node of the capture, not a free.
          if (api_is_stream_ordered_free(api)) {
            if (captured_free(c, stream, ptsz, ptr, args, forward, &fwd, status)) return R(status);
          } else {
            // A synchronous free during an open capture that prohibits it (capture-unsafe).
            unsafe = unsafe_before(c);
          }
        }
        // The kinds the quarantine will hold (free_live's condition): their record goes straight
        // to Held, and free_live holds it or gives it back.
        const KindMask hold = quarantined_api(s, api) && may_hold ? kQuarantinedKinds : 0;
        LinearTicket t = s.linear.begin_free(ptr, accepted, c.ev(), s.opts, &s.vmm, hold);
        if (t.cls == FreeClass::Live) {
          std::vector<Hold> holds = held_by(s, t.rec.ptr, t.rec.size);
          R r = free_live<R>(c, api, t, args, fwd, stream, may_hold);
          if (unsafe) [[unlikely]]
            unsafe_after(c, static_cast<int>(r), ptr, t.rec.size, args);
          if (!holds.empty()) [[unlikely]]
            report_held(c, std::move(holds),
                        std::string(api_name(api)) + " of " + range_text(t.rec.ptr, t.rec.size),
                        args, static_cast<int>(r));
          return r;
        }
        if (t.cls == FreeClass::Null) {
          R r = fwd();
          c.log(static_cast<int>(r), args);
          return r;
        }
        // A graph's allocation: made again by every launch, without a call the linear model sees.
        if ((t.cls == FreeClass::DoubleFree || t.cls == FreeClass::Unknown) &&
            graph_owned_free(c, ptr, args, forward, &fwd, status)) [[unlikely]] {
          if (unsafe) unsafe_after(c, status, ptr, 0, args);
          return R(status);
        }
        // The model held the address as freed; the driver says whether it is live again.
        DriverView view;
        if (t.decision.confirm) confirmed(view = driver_view_of_address(ptr), t.decision);
        if (t.skip()) {
          report_finding(c, std::move(*t.finding), t.decision.action, 0, args);
          Call::Extra x;
          x.skipped = true;
          c.log(0, args, x);
          return R(0);
        }
        if (t.decision.abort_first) report_finding(c, *t.finding, t.decision.action, -1, args);
        // Forwarded (report mode) while the first free is still held: that free happens now, so
        // this one meets the driver exactly as it would have without the shim (an error, not a real
        // free of memory the quarantine would release again later).
        if (t.held) held().release(ptr);
        R r = fwd();
        s.linear.end(t, r == R(0));
        if (t.decision.unseen && r == R(0)) {
          report_finding(c, unseen_free(t, api_name(api), ptr, view), Action::Forward, 0, args);
        } else if (t.decision.stands(r == R(0))) {
          report_finding(c, std::move(*t.finding), t.decision.action, static_cast<int>(r), args);
        }
        if (unsafe) [[unlikely]]
          unsafe_after(c, static_cast<int>(r), ptr, 0, args);
        c.log(static_cast<int>(r), args);
        return r;
      });
}

// Pool trims (cuMemPoolTrimTo, cudaMemPoolTrimTo). Under a cache flush while transports are
// live: reported, or not made at all under defer (a trim returns only memory already free in the
// pool, which keeps it for its next allocations; it never waits for the device itself).
template <class R, class Real>
R trim_pool(Api api, std::uint64_t pool, std::uint64_t keep, Real &&real) {
  return shielded<R>(
      api, real, [&](auto &fwd) __attribute__((always_inline))->R {
        Call c(api, StackWhen::Always);
        if (!c.tracked()) return fwd();
        Args args;
        args.hex("pool", pool).u("keep", keep);
        const FlushCheck fc = flush_check(c, FlushTarget::Trim);
        if (fc.opportunistic && fc.action == Action::Skip) {
          flush_report(c, fc, args, 0, 0, 0);
          Call::Extra x;
          x.skipped = true;
          c.log(0, args, x);
          return R(0);
        }
        if (fc.opportunistic && fc.action == Action::Abort) flush_report(c, fc, args, -1, 0, 0);
        const std::uint64_t t0 = now_ns();
        R r = fwd();
        if (fc.opportunistic) flush_report(c, fc, args, static_cast<int>(r), 0, now_ns() - t0);
        c.log(static_cast<int>(r), args);
        return r;
      });
}

// VMM and IPC handlers (driver ABI; the runtime IPC hooks call them with a runtime forwarder).
// Each takes the real function of the route the call came by (loader.h, Route).
CUresult vmm_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags, decltype(&::cuMemCreate) drv);
CUresult vmm_release(CUmemGenericAllocationHandle h, decltype(&::cuMemRelease) drv);
CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                     unsigned long long flags, decltype(&::cuMemAddressReserve) drv);
CUresult vmm_address_free(CUdeviceptr ptr, size_t size, decltype(&::cuMemAddressFree) drv);
CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags, decltype(&::cuMemMap) drv);
CUresult vmm_unmap(CUdeviceptr ptr, size_t size, decltype(&::cuMemUnmap) drv);
CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count,
                        decltype(&::cuMemSetAccess) drv);
CUresult vmm_retain(CUmemGenericAllocationHandle *h, void *addr,
                    decltype(&::cuMemRetainAllocationHandle) drv);
CUresult vmm_export(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                    unsigned long long flags, decltype(&::cuMemExportToShareableHandle) drv);
CUresult vmm_import(CUmemGenericAllocationHandle *h, void *os_handle,
                    CUmemAllocationHandleType type,
                    decltype(&::cuMemImportFromShareableHandle) drv, const void *caller);
// Multicast objects (handlers_multicast.cpp).
CUresult mc_create(CUmemGenericAllocationHandle *mc, const CUmulticastObjectProp *prop,
                   decltype(&::cuMulticastCreate) drv);
CUresult mc_add_device(CUmemGenericAllocationHandle mc, CUdevice dev,
                       decltype(&::cuMulticastAddDevice) drv);
CUresult mc_bind_mem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                     CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                     unsigned long long flags, decltype(&::cuMulticastBindMem) drv);
CUresult mc_bind_addr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr va,
                      size_t size, unsigned long long flags, decltype(&::cuMulticastBindAddr) drv);
CUresult mc_unbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size,
                   decltype(&::cuMulticastUnbind) drv);
CUresult pool_trim(Api api, CUmemoryPool pool, size_t keep, decltype(&::cuMemPoolTrimTo) drv);

// fork(): the legacy-IPC import table's lock (see state.cpp for the order).
void ipc_fork_prepare();
void ipc_fork_parent();
void ipc_fork_child();

// Legacy IPC (handlers_ipc.cpp): `real` performs the call; statuses are the caller's family's
// (CUresult or cudaError_t), given by `codes`. `handle` is the caller's 64-byte handle: written by
// ipc_get in bridge mode, read by ipc_open (a bridge handle never reaches the driver).
struct IpcApi {
  Api api;
  bridge::Codes codes;
  bool runtime;  // cudaIpc*: a missing context is created, as cudart does
};
int ipc_get(const IpcApi &k, void *handle, std::uint64_t ptr, FnRef<int()> real);
int ipc_open(const IpcApi &k, const void *handle, unsigned flags, bool out_ok, FnRef<int()> real,
             FnRef<std::uint64_t()> out, FnRef<void(std::uint64_t)> set_out);
int ipc_close(const IpcApi &k, std::uint64_t ptr, FnRef<int()> real);

// cuGetProcAddress / cudaGetDriverEntryPoint*: forward, then hand back our wrapper of exactly the
// export the driver returned.
template <class R>
R route_after(R r, const char *symbol, void **pfn) {
  try {
    if (r == R(0) && pfn && *pfn) *pfn = route_proc(*pfn, symbol);
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {  // the driver's own answer stands (shield.h)
  }
  return r;
}

// NCCL communicator lifecycle (statuses are ncclResult_t values). `named` is the communicator a
// finalize, revoke, destroy or abort names (0 for a create). `after` runs when the call
// succeeded or is in progress: it adds the arguments and lists the communicators created, each
// with its device (-1: the device current at entry).
enum class CommEvent : std::uint8_t { Create, Finalize, Revoke, Destroy };
int nccl_call(Api api, CommEvent ev, std::uint64_t named, FnRef<int()> real,
              FnRef<void(Args &, std::vector<CommOnDevice> &comms)> after);

// Registration, windows, suspend, resume and statistics (handlers_nccl_mem.cpp). `handle`, `win`
// and `value` are the caller's out-pointers, read after the call.
int nccl_register(std::uint64_t comm, std::uint64_t buff, std::uint64_t size, void **handle,
                  const void *caller, FnRef<int()> real);
int nccl_deregister(std::uint64_t comm, std::uint64_t handle, FnRef<int()> real);
int nccl_window_register(std::uint64_t comm, std::uint64_t buff, std::uint64_t size, void **win,
                         int flags, FnRef<int()> real);
int nccl_window_deregister(std::uint64_t comm, std::uint64_t win, FnRef<int()> real);
int nccl_suspend(std::uint64_t comm, int flags, FnRef<int()> real);
int nccl_resume(std::uint64_t comm, FnRef<int()> real);
int nccl_mem_stats(std::uint64_t comm, int stat, const std::uint64_t *value, FnRef<int()> real);

// The `nccl` log record of one call (docs/log-format.md): the fields beyond the common ones.
struct NcclFields {
  std::uint64_t buff = 0, size = 0, handle = 0;  // registration, window
  bool has_flags = false;
  int flags = 0;                                 // suspend, revoke, window
  int stat = -1;                                 // memstats: the ncclCommMemStat_t asked
  bool has_value = false;
  std::uint64_t value = 0;                       // memstats: what NCCL answered
  std::size_t ranges = 0;                        // suspend: the ranges NCCL put to sleep
  std::uint64_t range_bytes = 0;
  bool suppressed = false;                       // this call turned cleanup suppression on
};
void nccl_record(const Call &c, const char *event, std::uint64_t comm, int dev, int res,
                 const NcclFields &x);

// Findings of an NCCL call, reported once its `nccl` and `call` records are written (they share
// the call's seq; a finding between them would reach the reader out of order).
struct NcclFindings {
  std::vector<Finding> list;
  std::vector<Action> actions;
  void add(Finding f, Action a) {
    list.push_back(std::move(f));
    actions.push_back(a);
  }
  void add(Finding f);  // with the action decide() gives its class (never skipped)
  void report(const Call &c, int res, const Args &args);
};

// This thread is inside ncclCommSuspend of this communicator: the unmaps NCCL makes meanwhile are
// its ranges put to sleep (2.29.7 unmaps on the calling thread, src/mem_manager.cc).
CMG_HOT_TLS inline std::uint64_t t_suspending = 0;

// The communicator of the NCCL call this thread is inside, when that call names one and makes
// memory for it (ncclCommWindowRegister): a reservation made meanwhile is NCCL's own for it.
CMG_HOT_TLS inline std::uint64_t t_nccl_comm = 0;
// The communicator this thread is inside ncclCommDestroy, ncclCommAbort or ncclCommFinalize of:
// an unmap of a whole reservation NCCL made for it is NCCL's teardown (NcclHolds::own_teardown).
CMG_HOT_TLS inline std::uint64_t t_nccl_ending = 0;

// Sets a thread-local for the scope of a call and puts back what it was.
template <class T>
struct ThreadScope {
  T &slot;
  T prev;
  ThreadScope(T &s, T v) : slot(s), prev(s) { slot = v; }
  ~ThreadScope() { slot = prev; }
  ThreadScope(const ThreadScope &) = delete;
  ThreadScope &operator=(const ThreadScope &) = delete;
};

// Runs `real` marked as inside an NCCL call of this thread (t_in_nccl), and returns its status.
template <class Real>
int inside_nccl(Real &&real) {
  struct Scope {
    bool prev = t_in_nccl;
    Scope() { t_in_nccl = true; }
    ~Scope() { t_in_nccl = prev; }
  } scope;
  return static_cast<int>(real());
}

// A call made by NCCL itself: inside an NCCL call of this thread, or from libnccl's code.
bool made_by_nccl(const void *caller);
// A peer import made by NCCL (its caller lies in libnccl, or it runs inside an NCCL call).
void note_nccl_import(const Call &c, std::uint64_t handle, const void *caller);

}  // namespace cmg::shim
