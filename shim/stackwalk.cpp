// SPDX-License-Identifier: Apache-2.0
// The cached stack walker (see stackwalk.h). Rules are read from the FDE libgcc's own lookup returns
// (_Unwind_Find_FDE, from the static libgcc the shim links), by a small interpreter of the DWARF
// call-frame instructions compilers emit for x86-64, and kept per thread by return address.
#include "stackwalk.h"

#include <link.h>
#include <pthread.h>
#include <time.h>
#include <unwind.h>

#include <atomic>
#include <cstring>
#include <mutex>

extern "C" {
// libgcc's FDE lookup (unwind-dw2-fde.h, not installed): the FDE covering pc, or NULL.
struct dwarf_eh_bases {
  void *tbase;
  void *dbase;
  void *func;
};
const void *_Unwind_Find_FDE(void *pc, struct dwarf_eh_bases *bases);
}

namespace cmg::shim {
namespace {

constexpr int kRsp = 7, kRbp = 6, kRa = 16;  // DWARF register numbers on x86-64

enum class Kind : std::uint8_t { Empty, Ok, End, Unsupported };

// How to get from a frame to its caller: CFA = (rsp or rbp) + cfa_off; the return address is at
// CFA + ra_off; the caller's rbp at CFA + rbp_off (0: rbp is unchanged).
struct Rule {
  std::int32_t cfa_off = 0;
  std::int16_t ra_off = 0;
  std::int16_t rbp_off = 0;
  std::uint8_t cfa_reg = 0;
  Kind kind = Kind::Empty;
};

struct Entry {
  std::uintptr_t pc = 0;
  Rule rule;
};

constexpr std::size_t kEntries = 2048;  // per thread; distinct return addresses seen in stacks

struct ThreadCache {
  std::uintptr_t lo = 0, hi = 0;  // this thread's stack
  std::uint64_t gen = 0;
  ThreadCache *prev = nullptr, *next = nullptr;  // every thread's cache (g_caches)
  Entry e[kEntries];
};

// Every live cache, so that a forked child can free those of the threads that stayed in the parent
// (their only references were in those threads' TLS: a leak in every child otherwise). Taken once
// per thread, when its cache is made or freed, and around fork; it nests no other lock.
std::mutex g_caches_mu;
ThreadCache *g_caches = nullptr;

thread_local __attribute__((tls_model("initial-exec"))) ThreadCache *t_cache = nullptr;
pthread_key_t g_key;
pthread_once_t g_key_once = PTHREAD_ONCE_INIT;

// Unloading a library can put other code at the same addresses: the loader's counts of objects
// added and removed are read at most once a second, and a change drops every thread's rules.
std::atomic<std::uint64_t> g_gen{1};
std::atomic<std::int64_t> g_checked_s{0};
std::atomic<unsigned long long> g_objects_seen{0};

void free_cache(void *p) {
  auto *c = static_cast<ThreadCache *>(p);
  std::lock_guard lk(g_caches_mu);  // deleted under the lock: a fork sees it listed or gone
  if (c->prev) c->prev->next = c->next;
  else g_caches = c->next;
  if (c->next) c->next->prev = c->prev;
  delete c;
  t_cache = nullptr;
}

void maybe_new_generation() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  std::int64_t last = g_checked_s.load(std::memory_order_relaxed);
  if (ts.tv_sec == last || !g_checked_s.compare_exchange_strong(last, ts.tv_sec)) return;
  unsigned long long objects = 0;
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t size, void *data) -> int {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
          *static_cast<unsigned long long *>(data) = info->dlpi_adds * 1000003ull + info->dlpi_subs;
        return 1;  // the counts are process-wide: the first object has them
      },
      &objects);
  if (g_objects_seen.exchange(objects) != objects) g_gen.fetch_add(1);
}

ThreadCache *cache() {
  ThreadCache *c = t_cache;
  if (!c) {
    pthread_attr_t a;
    if (pthread_getattr_np(pthread_self(), &a) != 0) return nullptr;
    void *addr = nullptr;
    std::size_t size = 0;
    const int rc = pthread_attr_getstack(&a, &addr, &size);
    pthread_attr_destroy(&a);
    if (rc != 0 || !addr || !size) return nullptr;
    pthread_once(&g_key_once, [] { pthread_key_create(&g_key, free_cache); });
    c = new ThreadCache;
    c->lo = reinterpret_cast<std::uintptr_t>(addr);
    c->hi = c->lo + size;
    {
      std::lock_guard lk(g_caches_mu);
      c->next = g_caches;
      if (g_caches) g_caches->prev = c;
      g_caches = c;
    }
    t_cache = c;
    pthread_setspecific(g_key, c);
  }
  maybe_new_generation();
  const std::uint64_t gen = g_gen.load(std::memory_order_relaxed);
  if (c->gen != gen) {
    for (Entry &e : c->e) e = Entry{};
    c->gen = gen;
  }
  return c;
}

// ---- reading .eh_frame ---------------------------------------------------------------------------
struct Reader {
  const std::uint8_t *p, *end;
  bool ok = true;
  std::uint8_t u8() {
    if (p >= end) return ok = false, 0;
    return *p++;
  }
  std::uint64_t uleb() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      std::uint8_t b = u8();
      v |= static_cast<std::uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    return ok = false, 0;
  }
  std::int64_t sleb() {
    std::int64_t v = 0;
    int shift = 0;
    std::uint8_t b;
    do {
      b = u8();
      v |= static_cast<std::int64_t>(b & 0x7f) << shift;
      shift += 7;
    } while ((b & 0x80) && shift < 64 && ok);
    if (shift < 64 && (b & 0x40)) v |= -(std::int64_t{1} << shift);
    return v;
  }
  template <class T>
  T fixed() {
    T v{};
    if (end - p < static_cast<std::ptrdiff_t>(sizeof v)) return ok = false, v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  void skip(std::uint64_t n) {
    if (static_cast<std::uint64_t>(end - p) < n) ok = false, p = end;
    else p += n;
  }
};

// Bytes of an encoded pointer with fixed size (DW_EH_PE_*); 0 for what is not handled here.
std::size_t encoded_size(std::uint8_t enc) {
  if (enc == 0xff || (enc & 0x70) == 0x50) return 0;  // omitted; aligned
  switch (enc & 0x0f) {
    case 0x00: case 0x04: case 0x0c: return 8;
    case 0x02: case 0x0a: return 2;
    case 0x03: case 0x0b: return 4;
    default: return 0;  // (u|s)leb128: not used for code addresses by GCC or LLVM
  }
}

struct RegRule {
  enum How : std::uint8_t { Same, Offset, Undefined, Other } how = Same;
  std::int64_t off = 0;
};

struct State {
  int cfa_reg = kRsp;
  std::int64_t cfa_off = 8;
  bool cfa_expr = false;
  RegRule rbp, ra;
};

struct Cie {
  std::uint64_t caf = 1;
  std::int64_t daf = -8;
  std::uint8_t fde_enc = 0;
  bool has_z = false;
  bool signal = false;
  const std::uint8_t *insns = nullptr, *end = nullptr;
};

bool parse_cie(const std::uint8_t *cie, Cie &out) {
  std::uint32_t len;
  std::memcpy(&len, cie, 4);
  if (len == 0 || len == 0xffffffffu) return false;  // 64-bit DWARF: not emitted for .eh_frame
  Reader r{cie + 4, cie + 4 + len};
  if (r.fixed<std::uint32_t>() != 0) return false;  // not a CIE
  const std::uint8_t version = r.u8();
  if (version != 1 && version != 3 && version != 4) return false;
  const char *aug = reinterpret_cast<const char *>(r.p);
  const std::size_t aug_len = strnlen(aug, static_cast<std::size_t>(r.end - r.p));
  r.skip(aug_len + 1);
  if (version == 4) r.skip(2);  // address and segment selector sizes
  out.caf = r.uleb();
  out.daf = r.sleb();
  const std::uint64_t ra_reg = version == 1 ? r.u8() : r.uleb();
  if (!r.ok || ra_reg != kRa) return false;
  if (aug[0] == 'z') {
    out.has_z = true;
    const std::uint64_t n = r.uleb();
    const std::uint8_t *data_end = r.p + n;
    if (!r.ok || data_end > r.end) return false;
    for (const char *c = aug + 1; *c; ++c) {
      if (*c == 'R') {
        out.fde_enc = r.u8();
      } else if (*c == 'L') {
        r.u8();
      } else if (*c == 'P') {
        const std::size_t sz = encoded_size(r.u8());
        if (!sz) return false;
        r.skip(sz);
      } else if (*c == 'S') {
        out.signal = true;
      } else {
        break;  // unknown letters: the augmentation length still says where the data ends
      }
    }
    r.p = data_end;
  } else if (aug[0] != '\0') {
    return false;
  }
  out.insns = r.p;
  out.end = r.end;
  return r.ok;
}

void set_reg(State &s, std::uint64_t reg, RegRule rule) {
  if (reg == kRbp) s.rbp = rule;
  else if (reg == kRa) s.ra = rule;
}

// Executes call-frame instructions while the location is below target (libgcc's condition for a
// frame that is not a signal frame: rows at or above the return address do not apply).
bool run(Reader r, const Cie &cie, std::uintptr_t loc, std::uintptr_t target, State &s,
         const State &initial) {
  State saved[8];
  int depth = 0;
  auto advance = [&](std::uint64_t delta) {
    loc += delta * cie.caf;
    return loc < target;
  };
  while (r.p < r.end && r.ok) {
    const std::uint8_t op = r.u8();
    const std::uint8_t low = op & 0x3f;
    switch (op & 0xc0) {
      case 0x40:
        if (!advance(low)) return true;
        continue;
      case 0x80:
        set_reg(s, low, {RegRule::Offset, static_cast<std::int64_t>(r.uleb()) * cie.daf});
        continue;
      case 0xc0:
        set_reg(s, low, low == kRbp ? initial.rbp : low == kRa ? initial.ra : RegRule{});
        continue;
      default: break;
    }
    switch (op) {
      case 0x00: break;                                               // nop
      case 0x02: if (!advance(r.u8())) return true; break;            // advance_loc1
      case 0x03: if (!advance(r.fixed<std::uint16_t>())) return true; break;
      case 0x04: if (!advance(r.fixed<std::uint32_t>())) return true; break;
      case 0x05: {                                                    // offset_extended
        const std::uint64_t reg = r.uleb();
        set_reg(s, reg, {RegRule::Offset, static_cast<std::int64_t>(r.uleb()) * cie.daf});
        break;
      }
      case 0x06: {                                                    // restore_extended
        const std::uint64_t reg = r.uleb();
        set_reg(s, reg, reg == kRbp ? initial.rbp : reg == kRa ? initial.ra : RegRule{});
        break;
      }
      case 0x07: set_reg(s, r.uleb(), {RegRule::Undefined, 0}); break;
      case 0x08: set_reg(s, r.uleb(), {RegRule::Same, 0}); break;
      case 0x09: {                                                    // register
        const std::uint64_t reg = r.uleb();
        r.uleb();
        set_reg(s, reg, {RegRule::Other, 0});
        break;
      }
      case 0x0a:                                                      // remember_state
        if (depth == 8) return false;
        saved[depth++] = s;
        break;
      case 0x0b:                                                      // restore_state
        if (depth == 0) return false;
        s = saved[--depth];
        break;
      case 0x0c:                                                      // def_cfa
        s.cfa_reg = static_cast<int>(r.uleb());
        s.cfa_off = static_cast<std::int64_t>(r.uleb());
        s.cfa_expr = false;
        break;
      case 0x0d: s.cfa_reg = static_cast<int>(r.uleb()); s.cfa_expr = false; break;
      case 0x0e: s.cfa_off = static_cast<std::int64_t>(r.uleb()); s.cfa_expr = false; break;
      case 0x0f: r.skip(r.uleb()); s.cfa_expr = true; break;          // def_cfa_expression
      case 0x10: {                                                    // expression
        const std::uint64_t reg = r.uleb();
        r.skip(r.uleb());
        set_reg(s, reg, {RegRule::Other, 0});
        break;
      }
      case 0x11: {                                                    // offset_extended_sf
        const std::uint64_t reg = r.uleb();
        set_reg(s, reg, {RegRule::Offset, r.sleb() * cie.daf});
        break;
      }
      case 0x12:                                                      // def_cfa_sf
        s.cfa_reg = static_cast<int>(r.uleb());
        s.cfa_off = r.sleb() * cie.daf;
        s.cfa_expr = false;
        break;
      case 0x13: s.cfa_off = r.sleb() * cie.daf; s.cfa_expr = false; break;
      case 0x14: case 0x15: {                                         // val_offset(_sf)
        const std::uint64_t reg = r.uleb();
        if (op == 0x14) r.uleb(); else r.sleb();
        set_reg(s, reg, {RegRule::Other, 0});
        break;
      }
      case 0x16: {                                                    // val_expression
        const std::uint64_t reg = r.uleb();
        r.skip(r.uleb());
        set_reg(s, reg, {RegRule::Other, 0});
        break;
      }
      case 0x2e: r.uleb(); break;                                     // GNU_args_size
      case 0x2f: {                                                    // GNU_negative_offset_ext
        const std::uint64_t reg = r.uleb();
        set_reg(s, reg, {RegRule::Offset, -static_cast<std::int64_t>(r.uleb()) * cie.daf});
        break;
      }
      default: return false;  // set_loc and anything newer: not modelled
    }
  }
  return r.ok;
}

Rule compute_rule(std::uintptr_t pc) {
  Rule out;
  out.kind = Kind::Unsupported;
  dwarf_eh_bases bases{};
  const auto *fde = static_cast<const std::uint8_t *>(
      _Unwind_Find_FDE(reinterpret_cast<void *>(pc - 1), &bases));
  if (!fde) return out;  // no unwind data (JIT code) or a signal trampoline: libgcc decides
  std::uint32_t len;
  std::memcpy(&len, fde, 4);
  if (len == 0 || len == 0xffffffffu) return out;
  Reader r{fde + 4, fde + 4 + len};
  const std::uint8_t *cie_ptr_at = r.p;
  const auto cie_off = r.fixed<std::uint32_t>();
  Cie cie;
  if (!r.ok || !parse_cie(cie_ptr_at - cie_off, cie) || cie.signal) return out;
  const std::size_t sz = encoded_size(cie.fde_enc);
  if (!sz) return out;
  r.skip(2 * sz);  // pc_begin and pc_range: the start is bases.func
  if (cie.has_z) r.skip(r.uleb());
  if (!r.ok) return out;
  State initial;
  if (!run(Reader{cie.insns, cie.end}, cie, 0, ~std::uintptr_t{0}, initial, initial)) return out;
  State s = initial;
  if (!run(r, cie, reinterpret_cast<std::uintptr_t>(bases.func), pc, s, initial)) return out;
  if (s.cfa_expr || (s.cfa_reg != kRsp && s.cfa_reg != kRbp)) return out;
  if (s.cfa_off < INT32_MIN || s.cfa_off > INT32_MAX) return out;
  if (s.ra.how == RegRule::Undefined) {
    out.kind = Kind::End;  // the outermost frame (_start, a thread's start routine)
    return out;
  }
  if (s.ra.how != RegRule::Offset || s.ra.off < INT16_MIN || s.ra.off > INT16_MAX) return out;
  if (s.rbp.how == RegRule::Offset) {
    if (s.rbp.off == 0 || s.rbp.off < INT16_MIN || s.rbp.off > INT16_MAX) return out;
    out.rbp_off = static_cast<std::int16_t>(s.rbp.off);
  } else if (s.rbp.how != RegRule::Same) {
    return out;
  }
  out.cfa_reg = static_cast<std::uint8_t>(s.cfa_reg);
  out.cfa_off = static_cast<std::int32_t>(s.cfa_off);
  out.ra_off = static_cast<std::int16_t>(s.ra.off);
  out.kind = Kind::Ok;
  return out;
}

const Rule &rule_for(ThreadCache &c, std::uintptr_t pc) {
  Entry &e = c.e[(pc * 0x9E3779B97F4A7C15ull) >> 53];  // 2^11 = kEntries
  if (e.pc != pc || e.rule.kind == Kind::Empty) {
    e.pc = pc;
    e.rule = compute_rule(pc);
  }
  return e.rule;
}

static_assert(kEntries == 2048);

struct Frames {
  std::uintptr_t *pcs;
  int n = 0, max = 0;
  bool (*skip)(std::uintptr_t);
  bool skipping = true, first = true;
};

_Unwind_Reason_Code on_frame(_Unwind_Context *uc, void *arg) {
  auto *f = static_cast<Frames *>(arg);
  const std::uintptr_t pc = _Unwind_GetIP(uc);
  if (f->first) {  // libgcc_backtrace's own frame
    f->first = false;
    return _URC_NO_REASON;
  }
  if (!pc) return _URC_END_OF_STACK;
  if (f->skipping && f->skip && f->skip(pc)) return _URC_NO_REASON;
  f->skipping = false;
  f->pcs[f->n++] = pc;
  return f->n >= f->max ? _URC_END_OF_STACK : _URC_NO_REASON;
}

}  // namespace

__attribute__((noinline)) int libgcc_backtrace(std::uintptr_t *pcs, int max,
                                               bool (*skip)(std::uintptr_t)) {
  if (max <= 0) return 0;
  Frames f{pcs, 0, max, skip};
  _Unwind_Backtrace(on_frame, &f);
  return f.n;
}

__attribute__((noinline)) int cached_backtrace(std::uintptr_t *pcs, int max,
                                               bool (*skip)(std::uintptr_t)) {
  if (max <= 0) return 0;
  ThreadCache *c = cache();
  if (!c) return -1;
  std::uintptr_t pc, sp, fp;
  // This frame's registers at the label: its rule there leads to the caller like any other.
  asm volatile("lea 0f(%%rip), %0\n0:\n\tmov %%rsp, %1\n\tmov %%rbp, %2"
               : "=r"(pc), "=r"(sp), "=r"(fp));
  pc += 1;  // looked up like a return address: the row of the instruction at the label
  bool first = true, skipping = true;
  int n = 0;
  for (int frames = 0; frames < 1024; ++frames) {
    if (!first) {
      if (pc == 0) return n;  // libgcc's end of stack
      if (!(skipping && skip && skip(pc))) {
        skipping = false;
        pcs[n++] = pc;
        if (n >= max) return n;
      }
    }
    first = false;
    const Rule &r = rule_for(*c, pc);
    if (r.kind == Kind::End) return n;
    if (r.kind != Kind::Ok) return -1;
    const std::uintptr_t cfa = (r.cfa_reg == kRsp ? sp : fp) + static_cast<std::intptr_t>(r.cfa_off);
    // Every read stays on this thread's stack, above the frame being left.
    auto on_stack = [&](std::uintptr_t a) { return a >= sp && a + 8 <= c->hi && !(a & 7); };
    if (cfa <= sp || cfa > c->hi) return -1;
    const std::uintptr_t ra_at = cfa + static_cast<std::intptr_t>(r.ra_off);
    if (!on_stack(ra_at)) return -1;
    if (r.rbp_off) {
      const std::uintptr_t rbp_at = cfa + static_cast<std::intptr_t>(r.rbp_off);
      if (!on_stack(rbp_at)) return -1;
      fp = *reinterpret_cast<const std::uintptr_t *>(rbp_at);
    }
    pc = *reinterpret_cast<const std::uintptr_t *>(ra_at);
    sp = cfa;
  }
  return -1;
}

std::uint64_t objects_generation() { return g_gen.load(std::memory_order_relaxed); }

bool this_thread_stack(std::uintptr_t &lo, std::uintptr_t &hi) {
  const ThreadCache *c = t_cache;
  if (!c) return false;
  lo = c->lo;
  hi = c->hi;
  return true;
}

void stackwalk_fork_prepare() { g_caches_mu.lock(); }

void stackwalk_fork_parent() { g_caches_mu.unlock(); }

void stackwalk_fork_child() {
  // Only the forking thread exists in the child: the other threads' caches go.
  for (ThreadCache *c = g_caches, *next = nullptr; c; c = next) {
    next = c->next;
    if (c != t_cache) delete c;
  }
  g_caches = t_cache;
  if (t_cache) t_cache->prev = t_cache->next = nullptr;
  g_caches_mu.unlock();
}

}  // namespace cmg::shim
