// SPDX-License-Identifier: Apache-2.0
// Exported NCCL communicator-lifecycle entry points (PyTorch calls them through the PLT; ctypes
// users such as vLLM's pynccl reach them through the dlsym hook). Each forwards to the strong
// pnccl* definition. What a communicator holds (registration, windows, suspend) is at the end.
#include "handlers.h"
// After handlers.h: nccl.h brings cuda_runtime.h, whose overloads must come after our declarations.
#include <nccl.h>

#include "nccl_late.h"

#define CMG_NCCL(n, e) extern "C" std::remove_pointer_t<decltype(&::n)> n;
#include "api_nccl.def"
#undef CMG_NCCL

using namespace cmg::shim;
using cmg::CommOnDevice;

namespace {
std::uint64_t id(ncclComm_t c) { return reinterpret_cast<std::uintptr_t>(c); }

// The communicator a create call wrote (none when it wrote NULL), on `dev` (-1: current device).
void one(Args &a, std::vector<CommOnDevice> &out, const ncclComm_t *comm, int dev = -1) {
  const std::uint64_t c = (comm && *comm) ? id(*comm) : 0;
  if (c) out.push_back(CommOnDevice{c, dev});
  a.hex("comm", c);
}

// No arguments or communicators beyond the one named.
constexpr auto nothing = [](Args &, std::vector<CommOnDevice> &) {};
}  // namespace

CMG_HOOK(ncclResult_t, ncclCommInitRank,
         (ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank), (comm, nranks, uid, rank)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommInitRank, CommEvent::Create, 0,
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommInitRank)(comm, nranks, uid, rank)); },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.i("nranks", nranks).i("rank", rank);
        one(a, out, comm);
      }));
}

CMG_HOOK(ncclResult_t, ncclCommInitRankConfig,
         (ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank, ncclConfig_t *config),
         (comm, nranks, uid, rank, config)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommInitRankConfig, CommEvent::Create, 0,
      [&] {
        return static_cast<int>(
            CMG_REAL_R(ncclCommInitRankConfig)(comm, nranks, uid, rank, config));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.i("nranks", nranks).i("rank", rank);
        one(a, out, comm);
      }));
}

CMG_HOOK(ncclResult_t, ncclCommInitAll, (ncclComm_t *comms, int ndev, const int *devlist),
         (comms, ndev, devlist)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommInitAll, CommEvent::Create, 0,
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommInitAll)(comms, ndev, devlist)); },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.i("ndev", ndev);
        // One communicator per device of the list (devices 0..ndev-1 without one).
        for (int i = 0; comms && i < ndev; ++i)
          out.push_back(CommOnDevice{id(comms[i]), devlist ? devlist[i] : i});
      }));
}

CMG_HOOK(ncclResult_t, ncclCommInitRankScalable,
         (ncclComm_t *comm, int nranks, int rank, int nid, ncclUniqueId *ids,
          ncclConfig_t *config),
         (comm, nranks, rank, nid, ids, config)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommInitRankScalable, CommEvent::Create, 0,
      [&] {
        return static_cast<int>(
            CMG_REAL_R(ncclCommInitRankScalable)(comm, nranks, rank, nid, ids, config));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.i("nranks", nranks).i("rank", rank).i("nids", nid);
        one(a, out, comm);
      }));
}

CMG_HOOK(ncclResult_t, ncclCommSplit,
         (ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config),
         (comm, color, key, newcomm, config)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommSplit, CommEvent::Create, 0,
      [&] {
        return static_cast<int>(CMG_REAL_R(ncclCommSplit)(comm, color, key, newcomm, config));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.hex("parent", id(comm)).i("color", color).i("key", key);
        // NCCL_SPLIT_NOCOLOR gives no new communicator; a new one lives on the parent's device.
        one(a, out, newcomm, state().transport.device_of(id(comm)));
      }));
}

CMG_HOOK(ncclResult_t, ncclCommShrink,
         (ncclComm_t comm, int *exclude, int nexclude, ncclComm_t *newcomm, ncclConfig_t *config,
          int flags),
         (comm, exclude, nexclude, newcomm, config, flags)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommShrink, CommEvent::Create, 0,
      [&] {
        return static_cast<int>(
            CMG_REAL_R(ncclCommShrink)(comm, exclude, nexclude, newcomm, config, flags));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.hex("parent", id(comm)).i("excluded", nexclude).i("flags", flags);
        one(a, out, newcomm, state().transport.device_of(id(comm)));
      }));
}

// 2.29.2: existing ranks pass their communicator (the new one lives on its device), new ranks NULL.
CMG_HOOK(ncclResult_t, ncclCommGrow,
         (ncclComm_t comm, int nranks, const ncclUniqueId *uid, int rank, ncclComm_t *newcomm,
          ncclConfig_t *config),
         (comm, nranks, uid, rank, newcomm, config)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommGrow, CommEvent::Create, 0,
      [&] {
        return static_cast<int>(CMG_REAL_R(ncclCommGrow)(comm, nranks, uid, rank, newcomm, config));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.hex("parent", id(comm)).i("nranks", nranks).i("rank", rank);
        one(a, out, newcomm, comm ? state().transport.device_of(id(comm)) : -1);
      }));
}

// The communicator a finalize, revoke, destroy or abort names is the third argument: its record
// names it whether or not the call succeeds (a refused destroy names what the program passed).
CMG_HOOK(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(
      nccl_call(Api::ncclCommFinalize, CommEvent::Finalize, id(comm),
                [&] { return static_cast<int>(CMG_REAL_R(ncclCommFinalize)(comm)); }, nothing));
}

CMG_HOOK(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int flags), (comm, flags)) {
  return static_cast<ncclResult_t>(
      nccl_call(Api::ncclCommRevoke, CommEvent::Revoke, id(comm),
                [&] { return static_cast<int>(CMG_REAL_R(ncclCommRevoke)(comm, flags)); },
                [&](Args &a, std::vector<CommOnDevice> &) { a.i("flags", flags); }));
}

CMG_HOOK(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(
      nccl_call(Api::ncclCommDestroy, CommEvent::Destroy, id(comm),
                [&] { return static_cast<int>(CMG_REAL_R(ncclCommDestroy)(comm)); }, nothing));
}

CMG_HOOK(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(
      nccl_call(Api::ncclCommAbort, CommEvent::Destroy, id(comm),
                [&] { return static_cast<int>(CMG_REAL_R(ncclCommAbort)(comm)); }, nothing));
}

// What a communicator holds: registration and windows (2.19, 2.27), suspend, resume and memory
// statistics (2.29.7, declared in shim/nccl/nccl_late.h); bodies in handlers_nccl_mem.cpp.
CMG_HOOK(ncclResult_t, ncclCommRegister,
         (const ncclComm_t comm, void *buff, size_t size, void **handle),
         (comm, buff, size, handle)) {
  // The caller: a registration NCCL makes from its own code (a window's) is the window's.
  return static_cast<ncclResult_t>(nccl_register(
      id(comm), reinterpret_cast<std::uintptr_t>(buff), size, handle,
      __builtin_return_address(0),
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommRegister)(comm, buff, size, handle)); }));
}

CMG_HOOK(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle),
         (comm, handle)) {
  return static_cast<ncclResult_t>(
      nccl_deregister(id(comm), reinterpret_cast<std::uintptr_t>(handle), [&] {
        return static_cast<int>(CMG_REAL_R(ncclCommDeregister)(comm, handle));
      }));
}

CMG_HOOK(ncclResult_t, ncclCommWindowRegister,
         (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int flags),
         (comm, buff, size, win, flags)) {
  return static_cast<ncclResult_t>(nccl_window_register(
      id(comm), reinterpret_cast<std::uintptr_t>(buff), size, reinterpret_cast<void **>(win),
      flags, [&] {
        return static_cast<int>(CMG_REAL_R(ncclCommWindowRegister)(comm, buff, size, win, flags));
      }));
}

CMG_HOOK(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win),
         (comm, win)) {
  return static_cast<ncclResult_t>(
      nccl_window_deregister(id(comm), reinterpret_cast<std::uintptr_t>(win), [&] {
        return static_cast<int>(CMG_REAL_R(ncclCommWindowDeregister)(comm, win));
      }));
}

CMG_HOOK(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags), (comm, flags)) {
  return static_cast<ncclResult_t>(nccl_suspend(id(comm), flags, [&] {
    return static_cast<int>(CMG_REAL_R(ncclCommSuspend)(comm, flags));
  }));
}

CMG_HOOK(ncclResult_t, ncclCommResume, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(nccl_resume(
      id(comm), [&] { return static_cast<int>(CMG_REAL_R(ncclCommResume)(comm)); }));
}

CMG_HOOK(ncclResult_t, ncclCommMemStats,
         (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value), (comm, stat, value)) {
  return static_cast<ncclResult_t>(nccl_mem_stats(id(comm), static_cast<int>(stat), value, [&] {
    return static_cast<int>(CMG_REAL_R(ncclCommMemStats)(comm, stat, value));
  }));
}

namespace cmg::shim {
void *const kNcclWrappers[] = {
#define CMG_NCCL(n, e) reinterpret_cast<void *>(&::n),
#include "api_nccl.def"
#undef CMG_NCCL
};
// The wrappers handle-scoped dlsym answers hand out (ctypes users: Route::Given).
void *const kGivenNcclWrappers[] = {
#define CMG_NCCL(n, e) reinterpret_cast<void *>(&hook_##n<Route::Given>),
#include "api_nccl.def"
#undef CMG_NCCL
};
}  // namespace cmg::shim
