// SPDX-License-Identifier: Apache-2.0
// The exporter's driver calls (docs/ipc-bridge.md, "Wire protocol"): a POSIX-fd export of each
// page's physical allocation, made by the broker from the mapped address, and the device
// attribute that decides whether bridge mode widens a cuMemCreate's handle types; and what the exit
// summary says of exports no peer opened.
#include <unistd.h>

#include <atomic>

#include "bridge.h"
#include "bridge_io.h"
#include "lock_within.h"
#include "state.h"
#include "units.h"

namespace cmg::shim::bridge {
namespace {

std::atomic<void *> g_dev_attr{nullptr}, g_prim_retain{nullptr}, g_prim_release{nullptr},
    g_ctx_set{nullptr};

CUresult export_one(std::uint64_t va, int &fd) {
  CMG_REAL_OR(cuMemRetainAllocationHandle, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemExportToShareableHandle, CUDA_ERROR_NOT_INITIALIZED);
  CMG_REAL_OR(cuMemRelease, CUDA_ERROR_NOT_INITIALIZED);
  // A handle from the address, not the program's: the program may have released its own already
  // (the mapping keeps the memory, D13), and this reference is ours to drop.
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cuMemRetainAllocationHandle_fn(&h, reinterpret_cast<void *>(va));
  if (r != CUDA_SUCCESS) return r;
  r = cuMemExportToShareableHandle_fn(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cuMemRelease_fn(h);
  return r;
}

// VMM calls work on threads without a context on the H200 (bug-patterns.md P10, P27); should a
// driver ask for one, the broker borrows the device's primary context for this request.
bool borrow_context(int dev) {
  auto retain =
      driver_fn<PFN_cuDevicePrimaryCtxRetain_v7000>(g_prim_retain, "cuDevicePrimaryCtxRetain");
  auto set = driver_fn<PFN_cuCtxSetCurrent_v4000>(g_ctx_set, "cuCtxSetCurrent");
  CUcontext ctx = nullptr;
  if (!retain || !set || retain(&ctx, dev) != CUDA_SUCCESS) return false;
  set(ctx);
  forget_current_device();  // the driver's own export: no hook saw the change
  return true;
}

void return_context(int dev) {
  if (auto set = driver_fn<PFN_cuCtxSetCurrent_v4000>(g_ctx_set, "cuCtxSetCurrent")) set(nullptr);
  forget_current_device();
  if (auto rel = driver_fn<PFN_cuDevicePrimaryCtxRelease_v11000>(g_prim_release,
                                                                 "cuDevicePrimaryCtxRelease_v2"))
    rel(dev);
}

}  // namespace

// The descriptors of every page, in order.
CUresult export_fds(const ipc::Export &e, std::vector<int> &fds) {
  int borrowed = -1;
  CUresult r = CUDA_SUCCESS;
  for (const ipc::ExportPage &p : e.pages) {
    int fd = -1;
    r = export_one(e.res_base + p.off, fd);
    if (r == CUDA_ERROR_INVALID_CONTEXT && borrowed < 0 && e.dev >= 0 && borrow_context(e.dev)) {
      borrowed = e.dev;
      r = export_one(e.res_base + p.off, fd);
    }
    if (r != CUDA_SUCCESS) break;
    fds.push_back(fd);
  }
  if (borrowed >= 0) return_context(borrowed);
  if (r != CUDA_SUCCESS) {
    for (int f : fds) ::close(f);
    fds.clear();
  }
  return r;
}

bool device_supports_posix_fd(int dev) {
  static std::atomic<signed char> cache[64];  // 0 unknown, 1 yes, -1 no
  if (dev < 0 || dev >= 64) return false;
  const signed char v = cache[dev].load(std::memory_order_relaxed);
  if (v) return v > 0;
  auto f = driver_fn<PFN_cuDeviceGetAttribute_v2000>(g_dev_attr, "cuDeviceGetAttribute");
  int val = 0;
  const bool yes = f &&
                   f(&val, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev) ==
                       CUDA_SUCCESS &&
                   val != 0;
  cache[dev].store(yes ? 1 : -1, std::memory_order_relaxed);
  return yes;
}

void unrequested_summary_json(JsonLine &j) {
  const auto u = exports().unrequested_within(kExitPatienceNs);
  if (!u || !u->made) return;
  j.begin_object("bridge").unum("exports", u->made).unum("never_requested", u->never_requested)
      .unum("never_requested_bytes", u->never_requested_bytes);
  if (u->never_requested) j.unum("first_never_requested_seq", u->first.seq);
  j.end_object();
}

void unrequested_summary_text(TextBuf &t) {
  const auto u = exports().unrequested_within(kExitPatienceNs);
  if (!u || !u->made) return;
  t.s("  bridge: ").u(u->made).s(u->made == 1 ? " export" : " exports");
  if (!u->never_requested) {
    t.s(", every one requested by a peer\n");
    return;
  }
  // The peer's open failed (or never happened) and it could not say why: the bytes of a bridge
  // handle mean nothing to a driver, so only a peer under the shim opens one.
  char b[kHumanMax];
  t.s(", ").u(u->never_requested).s(" never requested (")
      .s(std::string_view(b, human_bytes_to(b, sizeof b,
                                            static_cast<std::int64_t>(u->never_requested_bytes))))
      .s("; the first made by ").s(u->first.api ? u->first.api : "?").s(" at seq ").u(u->first.seq)
      .s("): a bridge handle opens only in a process under the shim; a peer without it gets the "
         "driver's error\n");
}

}  // namespace cmg::shim::bridge
