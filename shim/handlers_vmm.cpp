// SPDX-License-Identifier: Apache-2.0
// VMM, legacy IPC, pool-trim and NCCL hook bodies (see handlers.h for the common shape).
#include <mutex>
#include <unordered_map>

#include "handlers.h"

namespace cmg::shim {
namespace {

Location location_of(const CUmemAllocationProp *prop) {
  switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: return Location::Device;
    case CU_MEM_LOCATION_TYPE_HOST: return Location::Host;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return Location::HostNuma;
    default: return Location::Other;
  }
}

// Runs a call the model has a verdict on: skip (proven redundant), abort (strict), or forward and
// then commit or roll back. Returns the status the caller gets.
template <class Real, class Commit, class Rollback>
CUresult with_verdict(Call &c, VmmVerdict &v, Args &args, Real &&real, Commit &&commit,
                      Rollback &&rollback, const char *va_state = nullptr) {
  if (v.finding) {
    const Action a = decide(*v.finding, v.skippable);
    const FindingClass cls = v.finding->cls;
    if (a == Action::Skip) {
      rollback();  // a skippable verdict changed nothing; this keeps that true by construction
      report_finding(c, std::move(*v.finding), a, CUDA_SUCCESS, args);
      Call::Extra x;
      x.skipped = true;
      c.log(CUDA_SUCCESS, args, x);
      return CUDA_SUCCESS;
    }
    if (a == Action::Abort && !needs_driver_refusal(cls)) {
      rollback();
      report_finding(c, std::move(*v.finding), a, -1, args);
    }
    CUresult r = real();
    Call::Extra x = r == CUDA_SUCCESS ? commit() : (rollback(), Call::Extra{});
    if (r != CUDA_SUCCESS) x.va_state = va_state;
    if (!needs_driver_refusal(cls) || r != CUDA_SUCCESS)
      report_finding(c, std::move(*v.finding), a, r, args);
    c.log(r, args, x);
    return r;
  }
  CUresult r = real();
  Call::Extra x = r == CUDA_SUCCESS ? commit() : (rollback(), Call::Extra{});
  if (r != CUDA_SUCCESS) x.va_state = va_state;
  c.log(r, args, x);
  return r;
}

Call::Extra freed_extra(const VmmModel::Freed &f) {
  Call::Extra x;
  x.mem = MemKind::Vmm;
  x.dev = f.dev;
  x.delta = -static_cast<std::int64_t>(f.bytes);
  return x;
}

}  // namespace

CUresult vmm_create(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                    unsigned long long flags) {
  auto real = [&] { return CMG_REAL(cuMemCreate)(h, size, prop, flags); };
  Call c(Api::cuMemCreate, StackWhen::Always);
  if (!c.tracked() || !prop || !h) return real();
  bool retried = false;
  CUresult r = call_with_oom_retry<CUresult>(real, retried);
  Args args;
  args.u("size", size).i("loc_type", prop->location.type).i("loc_id", prop->location.id)
      .u("handle_types", static_cast<std::uint64_t>(prop->requestedHandleTypes)).u("flags", flags);
  if (r != CUDA_SUCCESS) {
    c.log(r, args);
    return r;
  }
  args.hex("handle", *h);
  const Location loc = location_of(prop);
  state().vmm.on_create(*h, size, loc, prop->location.id,
                        static_cast<unsigned>(prop->requestedHandleTypes), false, c.ev());
  VmmModel::break_pairing(t_vmm);
  Call::Extra x;
  x.mem = MemKind::Vmm;
  x.dev = loc == Location::Device ? prop->location.id : -1;
  x.delta = static_cast<std::int64_t>(size);
  c.log(r, args, x);
  return r;
}

CUresult vmm_release(CUmemGenericAllocationHandle h) {
  auto real = [&] { return CMG_REAL(cuMemRelease)(h); };
  Call c(Api::cuMemRelease, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  VmmVerdict v = s.vmm.begin_release(h, c.ev(), t_vmm);
  Args args;
  args.hex("handle", h);
  return with_verdict(
      c, v, args, real, [&] { return freed_extra(s.vmm.commit_release(v)); },
      [&] { s.vmm.rollback_release(v); });
}

CUresult vmm_reserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                     unsigned long long flags) {
  auto real = [&] { return CMG_REAL(cuMemAddressReserve)(ptr, size, align, addr, flags); };
  Call c(Api::cuMemAddressReserve, StackWhen::Always);
  if (!c.tracked() || !ptr) return real();
  CUresult r = real();
  Args args;
  args.u("size", size).u("align", align).hex("addr", addr).u("flags", flags);
  if (r != CUDA_SUCCESS) {
    c.log(r, args);
    return r;
  }
  args.hex("ptr", *ptr);
  state().vmm.on_reserve(*ptr, size, c.ev());
  VmmModel::break_pairing(t_vmm);
  Call::Extra x;
  x.mem = MemKind::Va;
  x.delta = static_cast<std::int64_t>(size);
  c.log(r, args, x);
  return r;
}

CUresult vmm_address_free(CUdeviceptr ptr, size_t size) {
  auto real = [&] { return CMG_REAL(cuMemAddressFree)(ptr, size); };
  Call c(Api::cuMemAddressFree, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  VmmVerdict v = s.vmm.begin_address_free(ptr, size, c.ev(), t_vmm);
  Args args;
  args.hex("ptr", ptr).u("size", size);
  return with_verdict(
      c, v, args, real,
      [&] {
        Call::Extra x;
        if (v.changed) {
          x.mem = MemKind::Va;
          x.delta = -static_cast<std::int64_t>(size);
        }
        return x;
      },
      [&] { s.vmm.rollback_address_free(v); });
}

CUresult vmm_map(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                 unsigned long long flags) {
  auto real = [&] { return CMG_REAL(cuMemMap)(ptr, size, offset, h, flags); };
  Call c(Api::cuMemMap, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  VmmVerdict v = s.vmm.check_map(ptr, size, offset, h, t_vmm);
  Args args;
  args.hex("ptr", ptr).u("size", size).u("offset", offset).hex("handle", h).u("flags", flags);
  return with_verdict(
      c, v, args, real,
      [&] {
        s.vmm.on_map_ok(ptr, size, offset, h, c.ev());
        return Call::Extra{};
      },
      [] {}, s.vmm.range_state(ptr, size));
}

CUresult vmm_unmap(CUdeviceptr ptr, size_t size) {
  auto real = [&] { return CMG_REAL(cuMemUnmap)(ptr, size); };
  Call c(Api::cuMemUnmap, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  const char *before = s.vmm.range_state(ptr, size);
  VmmVerdict v = s.vmm.begin_unmap(ptr, size, c.ev(), t_vmm);
  Args args;
  args.hex("ptr", ptr).u("size", size);
  return with_verdict(
      c, v, args, real, [&] { return freed_extra(s.vmm.commit_unmap(v)); },
      [&] { s.vmm.rollback_unmap(v); }, before);
}

CUresult vmm_set_access(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count) {
  auto real = [&] { return CMG_REAL(cuMemSetAccess)(ptr, size, desc, count); };
  Call c(Api::cuMemSetAccess, StackWhen::Never);
  if (!c.tracked()) return real();
  CUresult r = real();
  Args args;
  args.hex("ptr", ptr).u("size", size).u("count", count);
  if (desc && count) args.i("loc_type", desc[0].location.type).i("loc_id", desc[0].location.id)
                         .u("access", desc[0].flags);
  Call::Extra x;
  if (r == CUDA_SUCCESS)
    state().vmm.on_set_access(ptr, size);
  else
    x.va_state = state().vmm.range_state(ptr, size);
  c.log(r, args, x);
  return r;
}

CUresult vmm_retain(CUmemGenericAllocationHandle *h, void *addr) {
  auto real = [&] { return CMG_REAL(cuMemRetainAllocationHandle)(h, addr); };
  Call c(Api::cuMemRetainAllocationHandle, StackWhen::Always);
  if (!c.tracked() || !h) return real();
  CUresult r = real();
  Args args;
  args.hex("addr", reinterpret_cast<std::uintptr_t>(addr));
  if (r == CUDA_SUCCESS) {
    args.hex("handle", *h);
    state().vmm.on_retain(*h, reinterpret_cast<std::uintptr_t>(addr), c.ev());
    // A value issued on this thread: a release of it next is not the stale one of the pairing
    // rule (tests/integration case retain-pairing).
    VmmModel::break_pairing(t_vmm);
  }
  c.log(r, args);
  return r;
}

CUresult vmm_export(void *shareable, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                    unsigned long long flags) {
  auto real = [&] { return CMG_REAL(cuMemExportToShareableHandle)(shareable, h, type, flags); };
  Call c(Api::cuMemExportToShareableHandle, StackWhen::Never);
  if (!c.tracked()) return real();
  CUresult r = real();
  Args args;
  args.hex("handle", h).u("type", static_cast<std::uint64_t>(type)).u("flags", flags);
  if (r == CUDA_SUCCESS && shareable && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    args.i("fd", *static_cast<int *>(shareable));
  c.log(r, args);
  return r;
}

CUresult vmm_import(CUmemGenericAllocationHandle *h, void *os_handle,
                    CUmemAllocationHandleType type) {
  auto real = [&] { return CMG_REAL(cuMemImportFromShareableHandle)(h, os_handle, type); };
  Call c(Api::cuMemImportFromShareableHandle, StackWhen::Always);
  if (!c.tracked() || !h) return real();
  CUresult r = real();
  Args args;
  args.u("type", static_cast<std::uint64_t>(type));
  if (type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    args.i("fd", static_cast<int>(reinterpret_cast<std::intptr_t>(os_handle)));
  if (r == CUDA_SUCCESS) {
    args.hex("handle", *h);
    // The size of an imported allocation is not known from the handle; mappings carry it.
    state().vmm.on_create(*h, 0, Location::Other, -1, static_cast<unsigned>(type), true, c.ev());
    VmmModel::break_pairing(t_vmm);  // as for retain (case import-pairing)
  }
  c.log(r, args);
  return r;
}

CUresult pool_trim(Api api, CUmemoryPool pool, size_t keep) {
  auto real = [&] { return CMG_REAL(cuMemPoolTrimTo)(pool, keep); };
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  CUresult r = real();
  Args args;
  args.hex("pool", reinterpret_cast<std::uintptr_t>(pool)).u("keep", keep);
  c.log(r, args);
  return r;
}

// ---------------------------------------------------------------------------------------------
namespace {
// Legacy IPC imports are reference counted by the driver (real-driver.md section 2): the same
// handle opened twice gives the same pointer and needs two closes.
std::mutex g_ipc_mu;
std::unordered_map<std::uint64_t, unsigned> &ipc_refs() {
  static auto *m = new std::unordered_map<std::uint64_t, unsigned>;  // leaked: used until exit
  return *m;
}
}  // namespace

int ipc_get(Api api, std::uint64_t ptr, int deny_status, const std::function<int()> &real) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  State &s = state();
  Args args;
  args.hex("ptr", ptr);
  auto res = s.vmm.reservation_containing(ptr);
  if (!res) {
    int r = real();
    c.log(r, args);
    return r;
  }
  Finding f;
  f.cls = FindingClass::IpcVmm;
  std::uint64_t mapped = 0;
  unsigned types = 0;
  for (const auto &[o, m] : res->maps) {
    mapped += m.size;
    if (auto a = s.vmm.alloc_of_handle(m.handle)) types |= a->handle_types;
  }
  f.msg = std::string(api_name(api)) + " of " + hex(ptr) + ", which lies in the VMM reservation " +
          hex(res->base) + " (+" + std::to_string(res->size) + " bytes, " +
          std::to_string(res->maps.size()) + " mapping(s), " + std::to_string(mapped) +
          " bytes mapped): legacy CUDA IPC cannot export memory made with cuMemCreate and the "
          "driver answers invalid argument (real-driver.md section 2)";
  f.state_json = "{\"reservation\":\"" + hex(res->base) + "\",\"size\":" +
                 std::to_string(res->size) + ",\"mapped_bytes\":" + std::to_string(mapped) +
                 ",\"handle_types\":" + std::to_string(types) + "}";
  f.related.push_back({"reservation", res->reserved});
  const Action a = decide(f, false);
  if (s.opts.ipc == IpcMode::Deny) {
    // Answered here, without the driver: the finding says so (it said "forward").
    report_finding(c, std::move(f), a == Action::Abort ? a : Action::Skip, deny_status, args);
    Call::Extra x;
    x.skipped = true;
    c.log(deny_status, args, x);
    return deny_status;
  }
  int r = real();
  report_finding(c, std::move(f), a, r, args);
  c.log(r, args);
  return r;
}

int ipc_open(Api api, const std::function<int()> &real, const std::function<std::uint64_t()> &out) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  int r = real();
  Args args;
  if (r != 0) {
    c.log(r, args);
    return r;
  }
  const std::uint64_t p = out();
  args.hex("ptr", p);
  std::lock_guard lk(g_ipc_mu);
  unsigned &n = ipc_refs()[p];
  if (n++ == 0) state().linear.on_alloc(LinearRec{p, 0, current_device(), MemKind::Ipc, c.ev()});
  args.u("opens", n);
  c.log(r, args);
  return r;
}

int ipc_close(Api api, std::uint64_t ptr, const std::function<int()> &real) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  int r = real();
  Args args;
  args.hex("ptr", ptr);
  if (r == 0) {
    std::lock_guard lk(g_ipc_mu);
    auto it = ipc_refs().find(ptr);
    if (it != ipc_refs().end() && --it->second == 0) {
      ipc_refs().erase(it);
      FreeVerdict v = state().linear.begin_free(ptr, kind_bit(MemKind::Ipc), c.ev());
      (void)v;
    }
  }
  c.log(r, args);
  return r;
}

}  // namespace cmg::shim
