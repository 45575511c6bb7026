// SPDX-License-Identifier: Apache-2.0
// Legacy IPC hook bodies: cudaIpcGetMemHandle / cuIpcGetMemHandle on VMM memory (diagnosis, deny,
// or a bridge export), and the opens and closes of bridge handles (docs/ipc-bridge.md). Handles
// that are not the bridge's go to the driver untouched.
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "env_hooks.h"
#include "handlers.h"
#include "ipc_bridge.h"
#include "torch_conf.h"
#include "torch_host.h"

namespace cmg::shim {
namespace {

// The reservation containing ptr as the diagnosis and the exporter see it.
struct VmmSubject {
  ipc::Subject s;
  std::vector<ipc::ExportPage> pages;
  int dev = -1;
};

std::optional<VmmSubject> vmm_subject(Api api, std::uint64_t ptr) {
  auto rp = state().vmm.pages_of(ptr);
  if (!rp) return std::nullopt;
  VmmSubject v;
  v.s = ipc::Subject{api_name(api), ptr, rp->base, rp->size, rp->reserved, {}};
  for (const PageView &p : rp->pages) {
    const bool device = p.loc == Location::Device;
    v.s.pages.push_back({p.off, p.size, p.handle_types, device});
    v.pages.push_back({p.off, p.size, p.alloc_id, p.map_seq});
    if (v.dev < 0 && device) v.dev = p.loc_id;
  }
  return v;
}

// PyTorch's allocator setting as it stands now (the variables may have changed since load), from
// the shim's snapshot: never from `environ` while another thread's setenv rewrites it.
ipc::TorchHint torch_now() {
  try {
    // As the loaded release reads it (a key of its own is no error), 2.11 when none is found.
    const std::optional<torchconf::FoundVersion> found = torch_loaded_version();
    return ipc::torch_hint(
        torch_env_now(),
        found ? torchconf::grammar_for(found->version) : torchconf::default_grammar());
  } catch (abi::__forced_unwind &) {
    throw;
  } catch (...) {
    return {};
  }
}

// The IPC calls the shim answers itself are recorded as answered without the driver ("skip"),
// unless strict mode aborts.
Action answered(const Finding &f) {
  const Action a = decide(state().opts, f.cls, false).action;
  return a == Action::Abort ? a : Action::Skip;
}

int answer_error(Call &c, Finding f, int status, Args &args) {
  const Action a = answered(f);
  report_finding(c, std::move(f), a, status, args);
  Call::Extra x;
  x.skipped = true;
  c.log(status, args, x);
  return status;
}

// Legacy imports are reference counted by the driver (real-driver.md section 2): the same handle
// opened twice gives the same pointer and needs two closes.
std::mutex g_legacy_mu;
std::unordered_map<std::uint64_t, unsigned> &legacy_refs() {
  static auto *m = new std::unordered_map<std::uint64_t, unsigned>;  // leaked: used until exit
  return *m;
}

}  // namespace

void ipc_fork_prepare() { g_legacy_mu.lock(); }
void ipc_fork_parent() { g_legacy_mu.unlock(); }
void ipc_fork_child() { g_legacy_mu.unlock(); }

int ipc_get(const IpcApi &k, void *handle, std::uint64_t ptr, FnRef<int()> real) {
  return shielded<int>(k.api, real, [&](auto &fwd) -> int {
    Call c(k.api, StackWhen::Always);
    if (!c.tracked()) return fwd();
    State &s = state();
    Args args;
    args.hex("ptr", ptr);
    auto v = vmm_subject(k.api, ptr);
    if (!v) {  // not VMM memory: legacy IPC works, the driver decides
      int r = fwd();
      c.log(r, args);
      return r;
    }
    args.hex("reservation", v->s.res_base).u("pages", v->s.pages.size());
    ipc::ExportPlan plan = ipc::plan_export(s.opts.ipc, v->s, handle != nullptr);
    if (plan.what == ipc::ExportPlan::What::Bridge) {
      bridge::Exported x =
          bridge::export_pages(v->s.res_base, v->s.res_size, v->pages, v->dev, c.ev());
      if (x.ok) {
        std::memcpy(handle, x.handle.data(), x.handle.size());
        args.u("export", x.id)
            .u("bytes", x.bytes)
            .s("bridge", x.reused ? "same export" : "new export");
        Call::Extra e;
        e.skipped = true;  // answered by the shim; the driver would refuse VMM memory
        c.log(k.codes.success, args, e);
        return k.codes.success;
      }
      plan = {ipc::ExportPlan::What::BridgeImpossible, x.blocker};
    }
    Finding f = ipc::ipc_vmm_finding(v->s, torch_now(), plan);
    if (plan.what == ipc::ExportPlan::What::Deny)
      return answer_error(c, std::move(f), k.codes.invalid_value, args);
    const Action a = decide(state().opts, f.cls, false).action;
    int r = fwd();
    // The finding stands only if the driver refuses (real-driver.md section 2); a driver that
    // accepts the call proves the model wrong, not the program.
    if (r != k.codes.success) report_finding(c, std::move(f), a, r, args);
    c.log(r, args);
    return r;
  });
}

int ipc_open(const IpcApi &k, const void *handle, unsigned flags, bool out_ok,
             FnRef<int()> real, FnRef<std::uint64_t()> out, FnRef<void(std::uint64_t)> set_out) {
  return shielded<int>(k.api, real, [&](auto &fwd) -> int {
    Call c(k.api, StackWhen::Always);
    if (!c.tracked()) return fwd();
    ipc::Handle h;
    const auto st =
        ipc::decode_handle({static_cast<const std::uint8_t *>(handle), ipc::kHandleSize}, h);
    Args args;
    if (st == ipc::HandleStatus::NotOurs) {
      int r = fwd();
      if (r != k.codes.success) {
        c.log(r, args);
        return r;
      }
      const std::uint64_t p = out();
      args.hex("ptr", p);
      std::lock_guard lk(g_legacy_mu);
      unsigned &n = legacy_refs()[p];
      if (n++ == 0) state().linear.on_alloc(LinearRec{p, 0, current_device(), MemKind::Ipc, c.ev()});
      args.u("opens", n);
      c.log(r, args);
      return r;
    }
    if (st != ipc::HandleStatus::Ok)
      return answer_error(c,
                          ipc::open_failure_finding(ipc::OpenFailure::CorruptHandle, api_name(k.api),
                                                    h, ipc::handle_status_text(st)),
                          k.codes.invalid_value, args);
    args.u("exporter_pid", h.pid).u("export", h.export_id).hex("exporter_base", h.res_base);
    if (!out_ok || (flags & ~static_cast<unsigned>(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))) {
      c.log(k.codes.invalid_value, args);
      return k.codes.invalid_value;
    }
    bridge::Opened o = bridge::open(api_name(k.api), h, k.codes, k.runtime, c.ev());
    if (o.finding) return answer_error(c, std::move(*o.finding), o.status, args);
    set_out(o.ptr);
    args.hex("ptr", o.ptr).hex("span", o.span_va).u("bytes", o.bytes).u("opens", o.refs);
    Call::Extra x;
    x.skipped = true;
    if (o.refs == 1) {
      State &s = state();
      s.linear.on_alloc(LinearRec{o.ptr, o.bytes, o.dev, MemKind::Ipc, c.ev()});
      s.counters.add(o.dev, MemKind::Ipc, static_cast<std::int64_t>(o.bytes));
      x.mem = MemKind::Ipc;
      x.dev = o.dev;
      x.delta = static_cast<std::int64_t>(o.bytes);
    }
    c.log(k.codes.success, args, x);
    return k.codes.success;
  });
}

int ipc_close(const IpcApi &k, std::uint64_t ptr, FnRef<int()> real) {
  return shielded<int>(k.api, real, [&](auto &fwd) -> int {
    Call c(k.api, StackWhen::Always);
    if (!c.tracked()) return fwd();
    Args args;
    args.hex("ptr", ptr);
    const bridge::Closed cl = bridge::close(ptr, k.codes);
    if (!cl.ours) {
      int r = fwd();
      if (r == k.codes.success) {
        std::lock_guard lk(g_legacy_mu);
        auto it = legacy_refs().find(ptr);
        if (it != legacy_refs().end() && --it->second == 0) {
          legacy_refs().erase(it);
          (void)state().linear.begin_free(ptr, kind_bit(MemKind::Ipc), c.ev());
        }
      }
      c.log(r, args);
      return r;
    }
    args.u("opens", cl.refs_left);
    Call::Extra x;
    x.skipped = true;
    if (cl.refs_left == 0) {
      State &s = state();
      (void)s.linear.begin_free(ptr, kind_bit(MemKind::Ipc), c.ev());
      s.counters.add(cl.dev, MemKind::Ipc, -static_cast<std::int64_t>(cl.bytes));
      x.mem = MemKind::Ipc;
      x.dev = cl.dev;
      x.delta = -static_cast<std::int64_t>(cl.bytes);
    }
    c.log(cl.status, args, x);
    return cl.status;
  });
}

}  // namespace cmg::shim
