// SPDX-License-Identifier: Apache-2.0
// Exported NCCL communicator-lifecycle entry points (PyTorch calls them through the PLT; ctypes
// users such as vLLM's pynccl reach them through the dlsym hook). Each forwards to the strong
// pnccl* definition.
#include "handlers.h"
// After handlers.h: nccl.h brings cuda_runtime.h, whose overloads must come after our declarations.
#include <nccl.h>

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

// The communicator a finalize/destroy/abort names, on the device it was created on.
void named(Args &a, std::vector<CommOnDevice> &out, ncclComm_t comm) {
  a.hex("comm", id(comm));
  out.push_back(CommOnDevice{id(comm), state().transport.device_of(id(comm))});
}
}  // namespace

CMG_HOOK(ncclResult_t, ncclCommInitRank,
         (ncclComm_t *comm, int nranks, ncclUniqueId uid, int rank), (comm, nranks, uid, rank)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommInitRank, CommEvent::Create,
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
      Api::ncclCommInitRankConfig, CommEvent::Create,
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
      Api::ncclCommInitAll, CommEvent::Create,
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
      Api::ncclCommInitRankScalable, CommEvent::Create,
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
      Api::ncclCommSplit, CommEvent::Create,
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
      Api::ncclCommShrink, CommEvent::Create,
      [&] {
        return static_cast<int>(
            CMG_REAL_R(ncclCommShrink)(comm, exclude, nexclude, newcomm, config, flags));
      },
      [&](Args &a, std::vector<CommOnDevice> &out) {
        a.hex("parent", id(comm)).i("excluded", nexclude).i("flags", flags);
        one(a, out, newcomm, state().transport.device_of(id(comm)));
      }));
}

CMG_HOOK(ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommFinalize, CommEvent::Finalize,
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommFinalize)(comm)); },
      [&](Args &a, std::vector<CommOnDevice> &out) { named(a, out, comm); }));
}

CMG_HOOK(ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommDestroy, CommEvent::Destroy,
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommDestroy)(comm)); },
      [&](Args &a, std::vector<CommOnDevice> &out) { named(a, out, comm); }));
}

CMG_HOOK(ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm)) {
  return static_cast<ncclResult_t>(nccl_call(
      Api::ncclCommAbort, CommEvent::Destroy,
      [&] { return static_cast<int>(CMG_REAL_R(ncclCommAbort)(comm)); },
      [&](Args &a, std::vector<CommOnDevice> &out) { named(a, out, comm); }));
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
