// SPDX-License-Identifier: Apache-2.0
// Stack capture (the cached walker of stackwalk.cpp, libgcc's unwinder linked into the shim where
// it gives up; no libunwind/libgcc_s needed in the host), deduplicated by content, and the module
// records the report needs to symbolize later.
#include "stacks.h"

#include <elf.h>
#include <link.h>
#include <unistd.h>
#include <unwind.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "crash_stack.h"
#include "loader.h"
#include "objects.h"
#include "stackwalk.h"
#include "state.h"

namespace cmg::shim {
namespace {

struct Frames {
  std::uintptr_t pc[64];
  int n = 0, max = 0;
  bool skipping = true;
};

_Unwind_Reason_Code on_frame(_Unwind_Context *uc, void *arg) {
  auto *f = static_cast<Frames *>(arg);
  std::uintptr_t pc = _Unwind_GetIP(uc);
  if (!pc) return _URC_END_OF_STACK;
  if (f->skipping && in_self(reinterpret_cast<void *>(pc))) return _URC_NO_REASON;
  f->skipping = false;
  f->pc[f->n++] = pc;
  return f->n >= f->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

bool shim_frame(std::uintptr_t pc) { return in_self(reinterpret_cast<void *>(pc)); }

struct Module {
  std::uintptr_t lo, hi;
};

// Known stacks, sharded by hash so that threads capturing stacks at once do not meet on one lock
// (with stacks on, every allocation and free looks its stack up here). A new stack takes an id
// and writes its records under `mu` of the table, with its shard still locked: no other thread
// can refer to the id before its record is in the log.
struct Table {
  struct Known {
    std::uint32_t id;
    std::vector<std::uintptr_t> pcs;
    std::vector<py::Frame> py;
    py::End py_end;
  };
  struct alignas(64) Shard {
    std::mutex mu;
    std::unordered_map<std::uint64_t, std::vector<Known>> by_hash;
  };
  static constexpr std::size_t kShards = 16;
  Shard shards[kShards];
  std::mutex mu;  // ids, modules and the records of new stacks
  std::uint32_t next_id = 0;
  std::vector<std::uint64_t> hash_of;  // by id - 1: where stack_frames finds a stack again
  std::vector<Module> modules;  // sorted by lo
  std::vector<std::uintptr_t> innermost;  // by id - 1: each stack's first return address
};

Table &table() {
  static Table *t = new Table;  // leaked on purpose: used until the last event at exit
  return *t;
}

std::uint64_t hash_stack(const Captured &c) {
  std::uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < c.n; ++i) {
    h ^= c.pc[i];
    h *= 1099511628211ull;
  }
  for (int i = 0; i < c.py.n; ++i) {
    h ^= (std::uint64_t{c.py.f[i].code} << 32) ^ static_cast<std::uint32_t>(c.py.f[i].line) ^
         (std::uint64_t{c.py.f[i].at} << 20);
    h *= 1099511628211ull;
  }
  return h ^ static_cast<std::uint64_t>(c.py.end);
}

bool same_py(const std::vector<py::Frame> &a, const py::Stack &b) {
  if (a.size() != static_cast<std::size_t>(b.n)) return false;
  for (int i = 0; i < b.n; ++i)
    if (a[i].code != b.f[i].code || a[i].line != b.f[i].line || a[i].at != b.f[i].at) return false;
  return true;
}

const char *end_name(py::End e) {
  switch (e) {
    case py::End::Complete: return nullptr;
    case py::End::Truncated: return "truncated";
    case py::End::Unreadable: return "unreadable";
  }
  return nullptr;
}

std::string build_id_of(const dl_phdr_info *info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto &ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_NOTE) continue;
    const char *p = reinterpret_cast<const char *>(info->dlpi_addr + ph.p_vaddr);
    const char *end = p + ph.p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const auto *nh = reinterpret_cast<const ElfW(Nhdr) *>(p);
      const char *name = p + sizeof(ElfW(Nhdr));
      const char *desc = name + ((nh->n_namesz + 3) & ~3u);
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
        static const char digits[] = "0123456789abcdef";
        std::string out;
        for (unsigned j = 0; j < nh->n_descsz; ++j) {
          auto b = static_cast<unsigned char>(desc[j]);
          out += digits[b >> 4];
          out += digits[b & 15];
        }
        return out;
      }
      p = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  return {};
}

// Writes the module record of the object containing pc (if not yet written). Table lock held.
void ensure_module_locked(Table &t, std::uintptr_t pc) {
  auto it = std::upper_bound(t.modules.begin(), t.modules.end(), pc,
                             [](std::uintptr_t v, const Module &m) { return v < m.lo; });
  if (it != t.modules.begin() && pc < std::prev(it)->hi) return;
  struct Ctx {
    std::uintptr_t pc;
    bool found = false;
    std::uintptr_t lo = 0, hi = 0, base = 0;
    std::string path, build_id;
  } ctx{pc};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t, void *data) -> int {
        auto *c = static_cast<Ctx *>(data);
        const auto [lo, hi] = load_range(info);
        if (c->pc < lo || c->pc >= hi) return 0;
        c->found = true;
        c->lo = lo;
        c->hi = hi;
        c->base = info->dlpi_addr;
        c->path = info->dlpi_name ? info->dlpi_name : "";
        c->build_id = build_id_of(info);
        return 1;
      },
      &ctx);
  if (!ctx.found) return;
  if (ctx.path.empty()) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) ctx.path.assign(exe, static_cast<std::size_t>(n));
  }
  t.modules.insert(std::upper_bound(t.modules.begin(), t.modules.end(), ctx.lo,
                                    [](std::uintptr_t v, const Module &m) { return v < m.lo; }),
                   Module{ctx.lo, ctx.hi});
  remember_module_written(ctx.lo, ctx.hi);  // the crash handler writes only the others
  char buf[4096 + 256];
  JsonLine j(buf, sizeof buf);
  j.str("k", "module").str("path", ctx.path).hex("base", ctx.base).unum("size", ctx.hi - ctx.lo);
  if (!ctx.build_id.empty()) j.str("build_id", ctx.build_id);
  state().log.write(j.finish(), now_ns());
}

}  // namespace

void capture_native(Captured &c, int max_frames) {
  Frames f;
  f.max = std::clamp(max_frames, 1, 64);
  const int n = cached_backtrace(f.pc, f.max, shim_frame);
  if (n >= 0)
    f.n = n;
  else
    _Unwind_Backtrace(on_frame, &f);  // something the cached walker does not model
  std::copy(f.pc, f.pc + f.n, c.pc);
  c.n = f.n;
  c.py.n = 0;
  c.py.end = py::End::Complete;
}

void capture_python(Captured &c) {
  if (state().opts.python_frames) py::capture(c.pc, c.n, c.py);
}

void capture(Captured &c, int max_frames) {
  capture_native(c, max_frames);
  capture_python(c);
}

std::uint32_t intern_stack(const Captured &c) {
  const int n = std::min(c.n, 64);
  if (n <= 0 && c.py.n == 0) return 0;
  Table &t = table();
  std::uint64_t h = hash_stack(c);
  Table::Shard &sh = t.shards[h % Table::kShards];
  std::lock_guard slk(sh.mu);
  auto &known = sh.by_hash[h];
  for (const Table::Known &k : known) {
    if (k.pcs.size() == static_cast<std::size_t>(n) && std::equal(k.pcs.begin(), k.pcs.end(), c.pc) &&
        k.py_end == c.py.end && same_py(k.py, c.py))
      return k.id;
  }
  std::lock_guard lk(t.mu);
  const std::uint32_t id = ++t.next_id;
  t.innermost.push_back(n > 0 ? c.pc[0] : 0);
  known.push_back(Table::Known{id, std::vector<std::uintptr_t>(c.pc, c.pc + n),
                               std::vector<py::Frame>(c.py.f, c.py.f + c.py.n), c.py.end});
  t.hash_of.push_back(h);
  if (state().log.is_open()) {
    for (int i = 0; i < n; ++i) ensure_module_locked(t, c.pc[i]);
    // 64 addresses of up to 21 bytes, 64 Python frames of up to 30 ([at,code,line]).
    char buf[64 * 24 + py::kMaxFrames * 32 + 96];
    JsonLine j(buf, sizeof buf);
    j.str("k", "stack").unum("id", id).begin_array("pcs");
    for (int i = 0; i < n; ++i) j.elem_hex(c.pc[i]);
    j.end_array();
    if (c.py.n) {
      j.begin_array("py");
      for (int i = 0; i < c.py.n; ++i) {
        char e[48];
        const int len = std::snprintf(e, sizeof e, "[%u,%u,%d]", unsigned{c.py.f[i].at},
                                      c.py.f[i].code, c.py.f[i].line);
        j.elem_raw(std::string_view(e, static_cast<std::size_t>(len)));
      }
      j.end_array();
    }
    if (const char *e = end_name(c.py.end)) j.ident("py_end", e);
    state().log.write(j.finish(), now_ns());
  }
  return id;
}

bool stack_frames(std::uint32_t id, Captured &out) {
  out.n = 0;
  out.py.n = 0;
  if (!id) return false;
  Table &t = table();
  std::uint64_t h;
  {
    std::lock_guard lk(t.mu);
    if (id > t.hash_of.size()) return false;
    h = t.hash_of[id - 1];
  }
  Table::Shard &sh = t.shards[h % Table::kShards];
  std::lock_guard slk(sh.mu);
  const auto it = sh.by_hash.find(h);
  if (it == sh.by_hash.end()) return false;
  for (const Table::Known &k : it->second)
    if (k.id == id) {
      out.n = static_cast<int>(std::min<std::size_t>(k.pcs.size(), std::size(out.pc)));
      std::copy(k.pcs.begin(), k.pcs.begin() + out.n, out.pc);
      out.py.n = static_cast<int>(std::min<std::size_t>(k.py.size(), py::kMaxFrames));
      std::copy(k.py.begin(), k.py.begin() + out.py.n, out.py.f);
      out.py.end = k.py_end;
      return true;
    }
  return false;
}

std::uint32_t capture_stack(int max_frames) {
  Captured c;
  capture(c, max_frames);
  return intern_stack(c);
}

std::uintptr_t stack_site(std::uint32_t id) {
  if (!id) return 0;
  Table &t = table();
  std::lock_guard lk(t.mu);
  return id <= t.innermost.size() ? t.innermost[id - 1] : 0;
}

void stacks_warm_up() {
  Frames f;
  f.max = 2;
  _Unwind_Backtrace(on_frame, &f);
  (void)cached_backtrace(f.pc, 2, shim_frame);
}

void stacks_fork_prepare() {
  Table &t = table();
  for (auto &s : t.shards) s.mu.lock();
  t.mu.lock();
  py::fork_prepare();
  stackwalk_fork_prepare();
}

void stacks_fork_parent() {
  Table &t = table();
  stackwalk_fork_parent();
  py::fork_parent();
  t.mu.unlock();
  for (auto &s : t.shards) s.mu.unlock();
}

void stacks_fork_child() {
  Table &t = table();
  stackwalk_fork_child();
  py::fork_child();
  t.mu.unlock();
  for (auto &s : t.shards) {
    s.mu.unlock();
    s.by_hash.clear();
  }
  t.next_id = 0;
  t.hash_of.clear();
  t.modules.clear();
  t.innermost.clear();
}

}  // namespace cmg::shim
