// SPDX-License-Identifier: Apache-2.0
// Opportunistic flushes: classification of a free's stack in process, findings, the call-site
// table and the summary (see flush.h).
#include "flush.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "diag.h"
#include "held.h"
#include "lock_within.h"
#include "program_frame.h"
#include "stacks.h"
#include "symtab.h"

namespace cmg::shim {
namespace {

// Deep enough for PyTorch's paths: cudaFree <- release_block <- release_blocks <-
// release_cached_blocks <- emptyCache <- THCPModule_emptyCache, and the OOM retry below malloc
// (nccl-and-cleanup.md 4.2, 4.3), with room for the frames above them.
constexpr int kFrames = 32;


struct Site {
  std::string text;   // "flush function <- caller frame"
  std::string flush;  // the flush function
  std::uint32_t stack = 0;
  std::uint64_t count = 0, bytes = 0, blocked_ns = 0, max_blocked_ns = 0;
  std::uint64_t deferred = 0, deferred_bytes = 0, trims = 0, skipped = 0;
};

struct Sites {
  MarkedMutex mu;  // its holder is known (exit paths, lock_within.h)
  std::map<std::pair<std::uintptr_t, std::uintptr_t>, int> index;  // (flush start, caller pc)
  std::vector<Site> rows;
  std::uint64_t findings = 0, blocked_ns = 0, bytes = 0;
  bool limit_warned = false;
};

Sites &sites() {
  static Sites *s = new Sites;  // leaked: counted until the summary at exit
  return *s;
}

// The call site of a flush: the first frame above the flush frames that lies outside the
// flush's own library (the program's call into it, not the library's entry point wrapping it:
// fakecache_empty_cache, or PyTorch's THCPModule_emptyCache whose caller is Python itself).
// The program's Python frame that asked for the flush (torch.cuda.empty_cache() called from a
// training loop): the innermost Python frame of the program's own files, else the innermost one.
int python_caller(const py::Stack &st) {
  for (int i = 0; i < st.n; ++i) {
    py::CodeInfo ci;
    if (py::code_info(st.f[i].code, ci) && python_program_file(ci.file)) return i;
  }
  return st.n ? 0 : -1;
}

int site_for(const FrameSym *const *fs, const Captured &stack_of, const FlushVerdict &v,
             std::uint32_t stack) {
  const std::uintptr_t *pc = stack_of.pc;
  const int n = stack_of.n;
  const FrameSym &flush = *fs[v.flush_frame];
  int caller = v.caller_frame;
  while (caller >= 0 && caller < n && fs[caller]->module == flush.module) ++caller;
  if (caller >= n) caller = v.caller_frame;
  const std::uintptr_t flush_key = flush.start ? flush.start : pc[v.flush_frame];
  // A Python caller is keyed by its code and line (high bit set: never a return address).
  const int py_at = python_caller(stack_of.py);
  const std::uintptr_t caller_pc =
      py_at >= 0 ? (std::uintptr_t{1} << 63) | (std::uintptr_t{stack_of.py.f[py_at].code} << 24) |
                       static_cast<std::uint32_t>(stack_of.py.f[py_at].line & 0xffffff)
      : caller >= 0 ? pc[caller]
                    : 0;
  Sites &s = sites();
  std::lock_guard lk(s.mu);
  auto [it, fresh] = s.index.try_emplace({flush_key, caller_pc}, static_cast<int>(s.rows.size()));
  if (fresh) {
    // Bounded: template-heavy names can run to kilobytes, and the summary record has one buffer.
    auto cap = [](std::string t) { return t.size() > 300 ? t.substr(0, 297) + "..." : t; };
    Site row;
    row.flush =
        cap(flush.demangled.empty() ? frame_text(flush, pc[v.flush_frame]) : flush.demangled);
    // The caller's text is the frame the key names: a Python caller by its function, file and
    // line (caller_pc is then a key, not an address), a native one by its symbol and offset.
    std::string caller_text("?");
    py::CodeInfo ci;
    if (py_at >= 0)
      caller_text = py::code_info(stack_of.py.f[py_at].code, ci)
                        ? ci.name + " (" + ci.file + ":" + std::to_string(stack_of.py.f[py_at].line) + ")"
                        : "<python code " + std::to_string(stack_of.py.f[py_at].code) + ">";
    else if (caller >= 0)
      caller_text = frame_text(*fs[caller], caller_pc);
    row.text = row.flush + " <- " + cap(std::move(caller_text));
    row.stack = stack;
    s.rows.push_back(std::move(row));
  }
  return it->second;
}

// The rows most blocked first, visited in place (the exit summary allocates nothing): the row
// after `prev` in the order of blocked time, longest first, ties in the order the sites were
// seen; -1 for the first, and returned when there is none after. Lock held.
int next_most_blocked(const Sites &st, int prev) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(st.rows.size()); ++i) {
    const std::uint64_t b = st.rows[static_cast<std::size_t>(i)].blocked_ns;
    if (prev >= 0) {
      const std::uint64_t pb = st.rows[static_cast<std::size_t>(prev)].blocked_ns;
      if (b > pb || (b == pb && i <= prev)) continue;  // at or before prev in the order
    }
    if (best < 0 || b > st.rows[static_cast<std::size_t>(best)].blocked_ns) best = i;
  }
  return best;
}

const char *policy_name(FlushPolicy p) {
  switch (p) {
    case FlushPolicy::Allow:
      return "allow";
    case FlushPolicy::Report:
      return "report";
    case FlushPolicy::Defer:
      return "defer";
  }
  return "?";
}

std::string_view bytes_text(char (&b)[kHumanMax], std::uint64_t v) {
  return std::string_view(b, human_bytes_to(b, sizeof b, static_cast<std::int64_t>(v)));
}
std::string_view ns_text(char (&b)[kHumanMax], std::uint64_t v) {
  return std::string_view(b, human_ns_to(b, sizeof b, v));
}

}  // namespace

const FlushPatterns &patterns() {
  static const FlushPatterns *p =
      new FlushPatterns(FlushPatterns::from_option(state().opts.flush_frames));
  return *p;
}

FlushCheck flush_check_slow(Call &c, FlushTarget target) {
  FlushCheck fc;
  fc.target = target;
  State &s = state();
  if (s.opts.opportunistic == FlushPolicy::Allow || !s.transport.suppressed() ||
      s.transport.flushing_here())
    return fc;
  Captured cap;
  capture_native(cap, kFrames);  // the Python frames only for a flush kept below
  const std::uintptr_t *pc = cap.pc;
  const int n = cap.n;
  const FrameSym *fs[kFrames];
  frame_syms(pc, n, patterns(), fs);
  FrameKind kinds[kFrames];
  for (int i = 0; i < n; ++i) kinds[i] = fs[i]->kind;
  const FlushVerdict v =
      classify_stack(std::span<const FrameKind>(kinds, static_cast<std::size_t>(n)));
  if (!v.opportunistic()) return fc;
  fc.opportunistic = true;
  fc.action = decide_flush(s.opts, target);
  capture_python(cap);
  if (!c.ev().stack) c.set_stack(intern_stack(cap));
  fc.site = site_for(fs, cap, v, c.ev().stack);
  return fc;
}

void flush_report(const Call &c, const FlushCheck &fc, const Args &args, int res,
                  std::uint64_t bytes, std::uint64_t blocked_ns) {
  const Action action = fc.action;
  const bool over_limit = fc.over_limit;
  State &s = state();
  Sites &st = sites();
  FlushEvent e;
  e.api = api_name(c.api());
  e.target = fc.target;
  e.action = action;
  e.over_limit = over_limit;
  e.bytes = bytes;
  e.blocked_ns = blocked_ns;
  e.held_bytes = held().bytes(HoldReason::Deferred);
  e.defer_limit = s.opts.defer_limit;
  e.live = s.transport.live();
  e.suppressed_by = s.transport.suppressed_by();
  std::string flush, site;
  bool warn_limit = false;
  {
    std::lock_guard lk(st.mu);
    Site &row = st.rows[static_cast<std::size_t>(fc.site)];
    flush = row.flush;
    site = row.text;
    ++row.count;
    row.bytes += bytes;
    row.blocked_ns += blocked_ns;
    row.max_blocked_ns = std::max(row.max_blocked_ns, blocked_ns);
    if (action == Action::Defer) {
      ++row.deferred;
      row.deferred_bytes += bytes;
    }
    if (fc.target == FlushTarget::Trim) ++row.trims;
    if (action == Action::Skip) ++row.skipped;
    ++st.findings;
    st.blocked_ns += blocked_ns;
    st.bytes += bytes;
    if (over_limit && !st.limit_warned) warn_limit = st.limit_warned = true;
  }
  e.flush_frame = flush;
  e.site = site;
  if (warn_limit)
    note(LogLevel::Warn, "CUMEMGUARD_DEFER_LIMIT (" + human_bytes(s.opts.defer_limit) +
                             ") reached: further opportunistic frees go to the driver (and block) "
                             "until held ones are released");
  report_finding(c, flush_finding(e), action, res, args);
}

void flush_reserve() { (void)sites(); }

void transport_summary_json(JsonLine &j) {
  State &s = state();
  const Transport &t = s.transport;
  j.begin_object("transport").boolean("suppressed", t.suppressed());
  if (EventRef by = t.suppressed_by(); by.known())
    j.begin_object("suppressed_by").str("api", by.api ? by.api : "").unum("seq", by.seq)
        .unum("ts", by.ts).end_object();
  j.num("live", t.live()).begin_array("live_by_device");
  for (int dev = 0; dev <= Transport::kMaxDevices; ++dev) {
    const int d = dev == Transport::kMaxDevices ? -1 : dev;
    if (const int n = t.live_on(d)) j.elem_object().num("dev", d).num("live", n).end_object();
  }
  j.end_array().unum("communicators_created", t.created_total()).begin_object("flush_requests")
      .unum("ran", t.flushes_run()).unum("declined", t.flushes_declined()).end_object()
      .str("policy", policy_name(s.opts.opportunistic))
      .unum("deferred_released_bytes", held().released_bytes(HoldReason::Deferred));
  Sites &st = sites();
  if (lock_within(st.mu)) {  // exit: a thread kept the lock otherwise (lock_within.h)
    std::lock_guard lk(st.mu, std::adopt_lock);
    j.unum("flushes", st.findings).unum("bytes", st.bytes).unum("blocked_ns", st.blocked_ns)
        .begin_array("sites");
    // The log has every finding; the summary the 64 most blocked sites.
    int i = -1;
    for (int k = 0; k < 64 && (i = next_most_blocked(st, i)) >= 0; ++k) {
      const Site &r = st.rows[static_cast<std::size_t>(i)];
      j.elem_object().str("site", r.text).str("flush", r.flush).unum("count", r.count)
          .unum("bytes", r.bytes).unum("blocked_ns", r.blocked_ns)
          .unum("max_blocked_ns", r.max_blocked_ns).unum("deferred", r.deferred)
          .unum("deferred_bytes", r.deferred_bytes).unum("trims", r.trims)
          .unum("skipped", r.skipped);
      if (r.stack) j.unum("stack", r.stack);
      j.end_object();
    }
    j.end_array();
  }
  j.end_object();
}

void transport_summary_text(TextBuf &out) {
  State &s = state();
  const Transport &t = s.transport;
  Sites &st = sites();
  if (!lock_within(st.mu)) return;  // exit: a thread kept the lock (lock_within.h)
  std::lock_guard lk(st.mu, std::adopt_lock);
  if (!t.suppressed() && t.created_total() == 0 && st.rows.empty() && t.flushes_run() == 0)
    return;
  out.s("  transport: ");
  if (t.suppressed()) {
    EventRef by = t.suppressed_by();
    out.s("opportunistic cleanup suppressed");
    if (by.known()) out.s(" from ").s(by.api ? by.api : "?").s(" (seq ").u(by.seq).s(")");
  } else {
    out.s("opportunistic cleanup never suppressed");
  }
  out.s("; ").u(t.created_total())
      .s(t.created_total() == 1 ? " communicator created, " : " communicators created, ")
      .i(t.live()).s(" live at exit");
  if (t.flushes_run() || t.flushes_declined())
    out.s("; cumemguard_maybe_empty_cache ran ").u(t.flushes_run()).s(", declined ")
        .u(t.flushes_declined());
  out.s("\n");
  if (st.rows.empty()) return;
  char b[kHumanMax], n[kHumanMax];
  out.s("  opportunistic flushes (CUMEMGUARD_OPPORTUNISTIC=").s(policy_name(s.opts.opportunistic))
      .s("): ").u(st.findings).s(" calls, ").s(bytes_text(b, st.bytes)).s(", blocked ")
      .s(ns_text(n, st.blocked_ns)).s(", at ").u(st.rows.size()).s(" call sites\n");
  // "    %7s %12s %12s %9s  %s"
  out.s("    ").right("count", 7).c(' ').right("bytes", 12).c(' ').right("blocked", 12).c(' ')
      .right("deferred", 9).s("  site (flush <- caller)\n");
  char c[24], d[24];
  for (int i = -1; (i = next_most_blocked(st, i)) >= 0;) {
    const Site &r = st.rows[static_cast<std::size_t>(i)];
    out.s("    ").right(TextBuf::digits(r.count, c), 7).c(' ').right(bytes_text(b, r.bytes), 12)
        .c(' ').right(ns_text(n, r.blocked_ns), 12).c(' ').right(TextBuf::digits(r.deferred, d), 9)
        .s("  ").s(r.text).s("\n");
  }
}

void flush_exit_line() {
  State &s = state();
  Sites &st = sites();
  char msg[1024];
  TextBuf t(msg, sizeof msg);
  {
    if (!lock_within(st.mu)) return;  // exit: a thread kept the lock (lock_within.h)
    std::lock_guard lk(st.mu, std::adopt_lock);
    if (st.findings == 0 || s.opts.summary) return;
    std::uint64_t held_back = 0;
    for (const Site &r : st.rows) held_back += r.deferred + r.skipped;
    char b[kHumanMax], n[kHumanMax];
    t.u(st.findings).s(" opportunistic cache flushes after NCCL or another transport started (")
        .s(bytes_text(b, st.bytes)).s("; ").u(held_back).s(" held back, ")
        .s(ns_text(n, st.blocked_ns)).s(" blocked in the driver) at ").u(st.rows.size())
        .s(" call sites; CUMEMGUARD_SUMMARY=1");
  }
  if (s.log.is_open()) t.s(" or 'cumemguard report ").s(s.log.path()).s("'");
  t.s(" lists them by call site");
  diag_line(LogLevel::Warn, t.view());
}

void capi_call_record(const char *api, const EventRef &ev, int res, std::uint64_t dur,
                      const char *arg_key, std::uint64_t arg) {
  State &s = state();
  if (!s.log.is_open()) return;
  char buf[512];
  JsonLine j(buf, sizeof buf);
  j.str("k", "call")
      .unum("seq", ev.seq)
      .unum("ts", ev.ts)
      .unum("tid", ev.tid)
      .str("api", api)
      .num("res", res)
      .unum("dur", dur)
      .begin_object("args")
      .unum(arg_key, arg)
      .end_object();
  s.log.write(j.finish(), ev.ts + dur);
}

void capi_suppress_record(const EventRef &ev, bool turned_on) {
  State &s = state();
  char buf[512];
  JsonLine j(buf, sizeof buf);
  j.str("k", "nccl")
      .unum("seq", ev.seq)
      .unum("ts", ev.ts)
      .unum("tid", ev.tid)
      .str("event", "suppress")
      .str("api", ev.api)
      .num("dev", -1)
      .num("res", 0)
      .num("live", s.transport.live());
  if (turned_on) j.boolean("suppressed", true);
  write_or_keep(std::string(j.finish()));
}

void flush_fork_prepare() {
  sites().mu.lock();
  symtab_fork_prepare();
}

void flush_fork_parent() {
  symtab_fork_parent();
  sites().mu.unlock();
}

void flush_fork_child() {
  symtab_fork_child();
  Sites &s = sites();
  s.mu.unlock();
  // The child's log starts empty: its findings and sites are its own.
  s.index.clear();
  s.rows.clear();
  s.findings = s.blocked_ns = s.bytes = 0;
  s.limit_warned = false;
}

}  // namespace cmg::shim
