// SPDX-License-Identifier: Apache-2.0
// The Python frame reader (see pyframes.h).
//
// Finding the calling thread's PyThreadState: with ctypes the GIL is released during the foreign
// call, so the interpreter's "current thread state" is another thread's or nobody's. The thread
// list (_PyRuntime.interpreters.head -> threads.head -> next) is matched on pthread_self(), as
// py-spy matches it on thread ids; the list can change under us (other threads start and end
// without the GIL we do not hold), so it is read through the kernel node by node, bounded. Once a
// thread state has been found that way, the interpreter's own thread-specific key (the Py_tss_t
// in _PyRuntime whose value on this thread is that thread state: autoTSSkey, which CPython clears
// when it deletes a thread state) is found once, and later captures ask pthread_getspecific().
// Py_FinalizeEx deletes that key and a later Py_Initialize creates another (a host that embeds
// the interpreter twice); the old key may by then be the program's own. So a thread that had a
// state before and finds none under the key looks through the list again, and a state found
// there means the key is no longer the interpreter's: it is looked up anew.
//
// The frames themselves cannot change while this thread is inside the C call, GIL or not, and
// each keeps its code object alive, which keeps its names and location table alive.
#include "pyframes.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <vector>

#include "loader.h"
#include "pyframes_code.h"
#include "state.h"
#include "stackwalk.h"

namespace cmg::shim::py {
namespace {

enum class Found : std::uint8_t { Unknown, None, Ready, Unsupported };

std::atomic<Found> g_found{Found::Unknown};
std::atomic<std::uint64_t> g_checked_gen{0};  // objects generation of the last "none" answer
std::mutex g_detect_mu;
Interp g_interp;                  // written once, before g_found becomes Ready
std::atomic<long> g_tss_key{-1};  // the interpreter's autoTSSkey, once found
// This thread had a state of the interpreter: a thread that never ran Python and finds nothing
// under the key pays no look-up.
thread_local __attribute__((tls_model("initial-exec"))) bool t_had_state = false;

std::uintptr_t sym(const char *name) {
  return reinterpret_cast<std::uintptr_t>(real_dlsym(RTLD_DEFAULT, name));
}

// The symbol's size from the dynamic symbol table (.dynsym survives stripping).
std::uintptr_t sym_size(std::uintptr_t addr) {
  Dl_info info;
  void *entry = nullptr;
  if (!addr || !dladdr1(reinterpret_cast<void *>(addr), &info, &entry, RTLD_DL_SYMENT) || !entry)
    return 0;
  return static_cast<const ElfW(Sym) *>(entry)->st_size;
}

void detect() {
  std::lock_guard lk(g_detect_mu);
  const Found f = g_found.load(std::memory_order_acquire);
  if (f == Found::Ready || f == Found::Unsupported) return;
  g_checked_gen.store(objects_generation(), std::memory_order_relaxed);
  Interp in;
  in.runtime = sym("_PyRuntime");
  if (!in.runtime) {
    if (sym("PyPyGILState_Ensure")) {
      g_found.store(Found::Unsupported, std::memory_order_release);
      note(LogLevel::Info, "PyPy: its frames are not read; stacks show native frames only");
      return;
    }
    g_found.store(Found::None, std::memory_order_release);
    return;
  }
  std::uint32_t hex = 0;
  const std::uintptr_t version = sym("Py_Version");  // 3.11+: const unsigned long
  std::string why;
  bool ok = true;
  if (!checked_reads_available()) {  // first: every read below is one of them
    ok = false;
    why = "the kernel refuses process_vm_readv, so no read could be checked";
  } else if (version) {
    unsigned long v = 0;
    ok = read_as(version, v);
    hex = static_cast<std::uint32_t>(v);
    if (!ok) why = "Py_Version cannot be read";
  } else if (!sym("Py_IsNone")) {  // 3.10 added Py_IsNone; 3.11 added Py_Version
    ok = false;
    why = "older than 3.10";
  }
  if (ok) ok = layout_for(in.runtime, hex, in.l, why);
  if (ok) {
    in.runtime_size = sym_size(in.runtime);
    in.code_type = sym("PyCode_Type");
    in.str_type = sym("PyUnicode_Type");
    in.bytes_type = sym("PyBytes_Type");
    in.frame_type = sym("PyFrame_Type");
    in.eval_lo = sym("_PyEval_EvalFrameDefault");
    in.eval_hi = in.eval_lo + sym_size(in.eval_lo);
    if (!in.code_type || !in.str_type || !in.bytes_type ||
        (in.l.model == FrameModel::Objects && !in.frame_type)) {
      ok = false;
      why = "its type objects are not exported";
    }
  }
  if (!ok) {
    g_found.store(Found::Unsupported, std::memory_order_release);
    char v[40] = "";
    if (hex)
      std::snprintf(v, sizeof v, " %u.%u.%u", hex >> 24, (hex >> 16) & 0xff, (hex >> 8) & 0xff);
    else if (!version && checked_reads_available())
      std::snprintf(v, sizeof v, " (no Py_Version)");
    note(LogLevel::Info, std::string("CPython") + v + ": its frames are not read (" + why +
                             "); stacks show native frames only");
    return;
  }
  g_interp = in;
  g_found.store(Found::Ready, std::memory_order_release);
}

const Interp *interp() {
  Found f = g_found.load(std::memory_order_acquire);
  if (f == Found::Ready) return &g_interp;
  if (f == Found::Unsupported) return nullptr;
  // No CPython when last looked: look again only when the loader's objects changed (a library
  // that embeds the interpreter can be loaded later).
  if (f == Found::None && g_checked_gen.load(std::memory_order_relaxed) == objects_generation())
    return nullptr;
  detect();
  return g_found.load(std::memory_order_acquire) == Found::Ready ? &g_interp : nullptr;
}

// The thread list, matched on pthread_self(); every node read through the kernel. The first
// state of this thread found, or with `stack` (lo, hi: this thread's stack) the one whose
// _PyCFrame lies deepest in it: a thread that runs a sub-interpreter has a state in each
// interpreter it entered, and the eval loop running innermost is the running state's.
std::uintptr_t walk_threads(const Interp &in, const std::uintptr_t *stack = nullptr) {
  const auto self = static_cast<unsigned long>(pthread_self());
  std::uintptr_t is = 0, first = 0, deepest = 0, deepest_cframe = 0;
  if (!field(in.runtime, in.l.rt_interpreters_head, is)) return 0;
  for (int interps = 0; is && interps < 64; ++interps) {
    std::uintptr_t ts = 0;
    if (!field(is, in.l.is_threads_head, ts, false)) break;
    for (int n = 0; ts && n < 65536; ++n) {
      unsigned long tid = 0;
      std::uintptr_t owner = 0, next = 0;
      if (!field(ts, in.l.ts_thread_id, tid, false) || !field(ts, in.l.ts_interp, owner, false) ||
          !field(ts, in.l.ts_next, next, false) || owner != is)
        break;  // a node being freed, or not a thread state: this interpreter's list ends here
      if (tid == self) {
        if (!stack) return ts;
        if (!first) first = ts;
        std::uintptr_t cf = 0;
        if (field(ts, static_cast<std::uint32_t>(in.l.ts_cframe), cf, false) && cf >= stack[0] &&
            cf < stack[1] && (!deepest || cf < deepest_cframe)) {
          deepest = ts;
          deepest_cframe = cf;
        }
      }
      ts = next;
    }
    std::uintptr_t next_is = 0;
    if (!field(is, in.l.is_next, next_is, false)) break;
    is = next_is;
  }
  return deepest ? deepest : first;
}

// 3.10/3.11 with a sub-interpreter alive (the newest interpreter is not the main one): the
// thread-specific key may name a state of another interpreter than the one running here.
bool several_interpreters(const Interp &in) {
  if (in.l.rt_interpreters_main < 0) return false;  // 3.12+: the key follows the running state
  std::uintptr_t head = 0, main = 0;
  return field(in.runtime, in.l.rt_interpreters_head, head) &&
         field(in.runtime, static_cast<std::uint32_t>(in.l.rt_interpreters_main), main) &&
         head != main;
}

// The Py_tss_t {int initialized; pthread_key_t key} in _PyRuntime whose value here is ts.
void find_tss_key(const Interp &in, std::uintptr_t ts) {
  if (g_tss_key.load(std::memory_order_relaxed) >= 0 || !in.runtime_size) return;
  long found = -1;
  int matches = 0;
  for (std::uintptr_t off = 0; off + 8 <= in.runtime_size; off += 4) {
    std::uint32_t pair[2];
    if (!read(in.runtime + off, pair, sizeof pair)) return;
    if (pair[0] != 1 || pair[1] >= PTHREAD_KEYS_MAX) continue;
    if (reinterpret_cast<std::uintptr_t>(pthread_getspecific(pair[1])) != ts) continue;
    if (found != static_cast<long>(pair[1])) ++matches;
    found = pair[1];
  }
  if (matches == 1) g_tss_key.store(found, std::memory_order_relaxed);
}

// `learn`: a state found in the list may teach the key (not from a signal handler).
std::uintptr_t thread_state(const Interp &in, bool learn) {
  if (several_interpreters(in)) {
    std::uintptr_t stack[2];
    return walk_threads(in, this_thread_stack(stack[0], stack[1]) ? stack : nullptr);
  }
  long key = g_tss_key.load(std::memory_order_relaxed);
  std::uintptr_t ts = 0;
  if (key >= 0) {
    ts = reinterpret_cast<std::uintptr_t>(pthread_getspecific(static_cast<pthread_key_t>(key)));
    unsigned long tid = 0;
    if (ts && field(ts, in.l.ts_thread_id, tid) &&
        tid == static_cast<unsigned long>(pthread_self())) {
      t_had_state = true;
      return ts;
    }
    // Nothing of the interpreter's under the key: a thread that never ran Python has no state;
    // another (the key's value is not its state, or it had one) looks in the list.
    if (!ts && !t_had_state) return 0;
  }
  ts = walk_threads(in);
  if (!ts) return 0;
  t_had_state = true;
  if (learn) {
    if (key >= 0) g_tss_key.compare_exchange_strong(key, -1, std::memory_order_relaxed);
    find_tss_key(in, ts);
  }
  return ts;
}

// What this thread resolved lately, by (code object, instruction): a repeated site skips the
// interning and the line look-up. A hit is taken only when the code object's fields are still the
// entry's: a code object freed and another made at its address (the same function exec'd again, a
// generated __init__) runs at the same instruction addresses, and pymalloc hands a freed block of
// the same size out again first.
struct Memo {
  std::uintptr_t code, instr;
  const Code *entry;
  std::int32_t line;
};
constexpr int kMemo = 64;
thread_local __attribute__((tls_model("initial-exec"))) Memo t_memo[kMemo];
thread_local __attribute__((tls_model("initial-exec"))) std::uint32_t t_memo_gen = 0;
std::atomic<std::uint32_t> g_memo_gen{1};  // bumped at fork: entries of the parent's table go

// ---- the walk ---------------------------------------------------------------------------------
struct Raw {
  std::uintptr_t code, instr;
  int addr;           // byte offset of the instruction
  bool last_of_eval;  // the first frame the eval call it belongs to ran
};

// The frames, innermost first; returns the count, with `end` set when the walk stopped early.
int walk_frames(const Interp &in, std::uintptr_t ts, Raw *out, int max, End &end) {
  const Layout &l = in.l;
  std::uintptr_t fr = 0;
  if (!field(ts, l.ts_frame, fr)) return end = End::Unreadable, 0;
  if (l.cframe_current_frame >= 0 && fr &&
      !field(fr, static_cast<std::uint32_t>(l.cframe_current_frame), fr))
    return end = End::Unreadable, 0;
  int n = 0;
  Window w;
  for (int steps = 0; fr; ++steps) {
    if (steps > 100000 || (fr & 7) || !w.load(fr, l.fr_lo, l.fr_len))
      return end = End::Unreadable, n;
    const std::uintptr_t code = w.get<std::uintptr_t>(l.fr_code) & l.fr_code_mask;
    const std::uintptr_t prev = w.get<std::uintptr_t>(l.fr_previous);
    bool entry = false;
    if (l.model == FrameModel::Objects) {
      if (w.get<std::uintptr_t>(l.ob_type) != in.frame_type) return end = End::Unreadable, n;
      entry = true;  // 3.10: one eval call per frame
    } else {
      const auto owner = w.get<std::uint8_t>(l.fr_owner);
      if (owner == l.owner_cstack || owner == l.owner_interpreter) {
        // 3.12+: the entry frame an eval call pushes on the C stack ends that call's frames.
        if (owner == l.owner_cstack && n > 0) out[n - 1].last_of_eval = true;
        fr = prev;
        continue;
      }
      if (l.fr_is_entry >= 0)
        entry = w.get<std::uint8_t>(static_cast<std::uint32_t>(l.fr_is_entry)) != 0;
    }
    int addr = -1;
    std::uintptr_t instr = 0;
    if (l.fr_instr_is_int) {
      const auto lasti = w.get<std::int32_t>(l.fr_instr);
      addr = lasti < 0 ? -1 : lasti * 2;
      instr = static_cast<std::uintptr_t>(static_cast<std::uint32_t>(addr + 1));
    } else {
      instr = w.get<std::uintptr_t>(l.fr_instr);
      const std::intptr_t d = static_cast<std::intptr_t>(instr - (code + l.co_code_adaptive));
      if (d > (1 << 28)) return end = End::Unreadable, n;
      addr = d < 0 ? -1 : static_cast<int>(d & ~std::intptr_t{1});
    }
    if (n == max) return end = End::Truncated, n;
    out[n++] = Raw{code, instr, addr, entry};
    fr = prev;
  }
  return n;
}

}  // namespace

namespace {

void capture_impl(const Interp *in, const std::uintptr_t *pcs, int npcs, bool in_handler,
                  Stack &out, CodeSink *sink = nullptr) {
  out.n = 0;
  out.end = End::Complete;
  if (!in) return;
  std::uintptr_t fin = 0;
  if (!field(in->runtime, in->l.rt_finalizing, fin) || fin) return;  // shutting down
  const std::uintptr_t ts = thread_state(*in, !in_handler);
  if (!ts) return;
  Raw raw[kMaxFrames];
  End end = End::Complete;
  const int n = walk_frames(*in, ts, raw, kMaxFrames, end);
  // Eval frames among the return addresses, innermost first: the k-th runs the k-th group.
  int native = 0;
  auto next_eval = [&]() -> int {
    while (native < npcs && !(pcs[native] >= in->eval_lo && pcs[native] < in->eval_hi)) ++native;
    return native < npcs ? native++ : npcs;
  };
  int at = next_eval();
  const std::uint32_t gen = g_memo_gen.load(std::memory_order_relaxed);
  if (t_memo_gen != gen) {
    for (Memo &e : t_memo) e = Memo{};
    t_memo_gen = gen;
  }
  for (int i = 0; i < n; ++i) {
    Memo &memo = t_memo[((raw[i].code ^ raw[i].instr) * 0x9E3779B97F4A7C15ull) >> 58];
    const Code *c = nullptr;
    int line = 0;
    CodeFields f;
    if (!code_fields(*in, raw[i].code, f)) {
      end = End::Unreadable;
      break;
    }
    if (memo.code == raw[i].code && memo.instr == raw[i].instr && memo.entry &&
        same_code(*memo.entry, raw[i].code, f)) {
      c = memo.entry;
      line = memo.line;
    } else {
      c = in_handler ? find_code(raw[i].code, f) : intern(*in, raw[i].code, f);
      if (!c && in_handler) c = describe_in_handler(*in, raw[i].code, f, sink);
      if (!c) {
        end = End::Unreadable;
        break;
      }
      line = line_of(*in, *c, raw[i].addr, !in_handler);
      if (!in_handler) memo = Memo{raw[i].code, raw[i].instr, c, line};
    }
    out.f[out.n++] = Frame{c->id, line, static_cast<std::uint16_t>(at)};
    if (raw[i].last_of_eval) at = next_eval();
  }
  out.end = end;
}

}  // namespace

void capture(const std::uintptr_t *pcs, int npcs, Stack &out) {
  capture_impl(interp(), pcs, npcs, false, out);
}

void capture_in_handler(const std::uintptr_t *pcs, int npcs, bool enabled, Stack &out,
                        CodeSink *sink) {
  out.n = 0;
  out.end = End::Complete;
  // Only an interpreter found before: the look-up itself may allocate.
  if (!enabled || g_found.load(std::memory_order_acquire) != Found::Ready) return;
  capture_impl(&g_interp, pcs, npcs, true, out, sink);
}

void fork_prepare() {
  code_fork_prepare();
}

void fork_parent() {
  code_fork_parent();
}

void fork_child() {
  // One thread left: the child's log starts empty, so every code object is written again, and
  // this thread's memo of the parent's entries goes. A thread of the parent may have been inside
  // the interpreter look-up (detect()): its lock is not held across fork(), since that look-up
  // calls the loader and writes notes, whose locks other threads can be waiting on; the child,
  // where that thread does not exist, gets the lock free (left held, the child's first captured
  // stack waited for it forever) and looks again if the parent had not finished.
  new (&g_detect_mu) std::mutex();
  g_memo_gen.fetch_add(1, std::memory_order_relaxed);
  code_fork_child();
}

}  // namespace cmg::shim::py
