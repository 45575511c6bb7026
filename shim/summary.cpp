// SPDX-License-Identifier: Apache-2.0
// Exit summary and leak records (see summary.h). Nothing here allocates: the models are visited
// in place, records are built in fixed buffers (LogLine), the stderr text in a static buffer that
// is written out whenever it fills, and every lock is taken with a bounded wait (lock_within.h).
#include "summary.h"

#include <stdio.h>
#include <unistd.h>

#include "bridge.h"
#include "diag.h"
#include "errors.h"
#include "flush.h"
#include "held.h"
#include "lock_within.h"
#include "state.h"
#include "status_channel.h"
#include "stderr_out.h"
#include "suppress.h"
#include "textbuf.h"
#include "units.h"

namespace cmg::shim {
namespace {

// The kinds of the linear model in the order of their names, as the summary lists them.
constexpr MemKind kLinearKinds[] = {MemKind::Async, MemKind::Graph,  MemKind::Host,
                                    MemKind::Ipc,   MemKind::Linear, MemKind::Managed};

// What the model holds at exit, read once for the leak records, the summary record and the
// stderr summary. A part whose lock a thread kept (a signal handler interrupted it there and
// called exit()) is left out and said so.
struct Live {
  std::size_t n[kMemKinds] = {};
  std::uint64_t bytes[kMemKinds] = {};
  VmmCounts vmm;
  std::size_t shards_skipped = 0;
  bool vmm_skipped = false;
  std::size_t linear() const {
    std::size_t t = 0;
    for (std::size_t k : n) t += k;
    return t;
  }
};

std::string_view human(char (&b)[kHumanMax], std::uint64_t v) {
  return std::string_view(b, human_bytes_to(b, sizeof b, static_cast<std::int64_t>(v)));
}

Live read_live_and_write_leaks(State &s, bool log) {
  Live live;
  char buf[1024];
  auto emit = [&](JsonLine &j) { s.log.write(j.finish(), now_ns()); };
  live.shards_skipped = s.linear.for_each_live_within(
      [&](const LinearRec &r) {
        ++live.n[static_cast<std::size_t>(r.kind)];
        live.bytes[static_cast<std::size_t>(r.kind)] += r.size;
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak")
            .str("what", mem_kind_name(r.kind))
            .str("api", r.alloc.api ? r.alloc.api : "")
            .hex("ptr", r.ptr)
            .unum("size", r.size)
            .num("dev", r.dev)
            .unum("seq", r.alloc.seq);
        if (r.capture) j.unum("capture", r.capture);  // made for a CUDA graph (its private pool)
        if (r.alloc.stack) j.unum("stack", r.alloc.stack);
        emit(j);
      },
      kExitPatienceNs);
  // Graph allocations a launch made and nothing freed (capture_model.h).
  const bool graphs_read = s.capture.for_each_live_within(
      [&](const GraphAlloc &a) {
        ++live.n[static_cast<std::size_t>(MemKind::Graph)];
        live.bytes[static_cast<std::size_t>(MemKind::Graph)] += a.size;
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak")
            .str("what", "graph")
            .str("api", a.node.api ? a.node.api : "")
            .hex("ptr", a.ptr)
            .unum("size", a.size)
            .num("dev", a.dev)
            .unum("seq", a.node.seq)
            .hex("graph", a.graph);
        if (a.capture) j.unum("capture", a.capture);
        if (a.node.stack) j.unum("stack", a.node.stack);
        emit(j);
      },
      kExitPatienceNs);
  if (!graphs_read)
    note(LogLevel::Warn,
         "exit: the graph model stayed locked by a thread that did not come back "
         "(a signal handler that called exit() interrupted it); its live graph "
         "allocations are not in the leak report");
  live.vmm_skipped = !s.vmm.visit_within(
      kExitPatienceNs,
      [&](const PhysAlloc &a) {
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak")
            .str("what", "vmm")
            .str("api", a.created.api ? a.created.api : "")
            .unum("size", a.size)
            .num("dev", a.dev())
            .unum("seq", a.created.seq)
            .unum("handle_refs", a.handle_refs)
            .unum("mappings", a.map_count);
        if (a.created.stack) j.unum("stack", a.created.stack);
        emit(j);
      },
      [&](const Reservation &r) {
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak")
            .str("what", "va")
            .str("api", r.reserved.api ? r.reserved.api : "")
            .hex("ptr", r.base)
            .unum("size", r.size)
            .num("dev", -1)
            .unum("seq", r.reserved.seq);
        if (r.reserved.stack) j.unum("stack", r.reserved.stack);
        emit(j);
      },
      live.vmm);
  if (live.shards_skipped || live.vmm_skipped) {
    char msg[512];
    TextBuf t(msg, sizeof msg);
    t.s("exit: ");
    if (live.shards_skipped)
      t.u(live.shards_skipped).s(" of ").u(LinearModel::kShards).s(" parts of the linear model");
    if (live.shards_skipped && live.vmm_skipped) t.s(" and ");
    if (live.vmm_skipped) t.s("the VMM model");
    t.s(" stayed locked by a thread that did not come back (a signal handler that called exit() "
        "interrupted it); what they hold is not in the leak report");
    note(LogLevel::Warn, t.view());
  }
  return live;
}

// One leak per allocation, handle and reservation live at exit: the leak records of the log, the
// summary's "leak N" and the launcher's --fail-on-leaks count the same things.
std::size_t leaked_count(const Live &live) {
  return live.vmm.phys + live.vmm.reservations + live.linear();
}

const char *reason_name(HoldReason why) {
  return why == HoldReason::Quarantine ? "quarantine" : "deferred";
}

std::uint64_t calls_made(const State &s) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < kApiCount; ++i) n += s.calls.get(i);
  return n;
}

void write_summary_record(State &s, const Live &live, const HeldFrees::AtExit &held_now,
                          const AllFailed &failed) {
  LogLine j(s.log);
  j.str("k", "summary").unum("ts", now_ns()).begin_object("calls");
  for (std::size_t i = 0; i < kApiCount; ++i)
    if (auto n = s.calls.get(i)) j.unum(kApis[i].name, n);
  j.end_object().begin_array("bytes");
  s.counters.visit([&](const ByteCounters::Row &r) {
    j.elem_object()
        .num("dev", r.dev)
        .str("mem", mem_kind_name(r.kind))
        .num("current", r.current)
        .num("peak", r.peak)
        .num("total", r.total)
        .end_object();
  });
  j.end_array();
  j.begin_object("live");
  for (MemKind k : kLinearKinds)
    if (const std::size_t n = live.n[static_cast<std::size_t>(k)]) j.unum(mem_kind_name(k), n);
  j.unum("vmm", live.vmm.phys).unum("va", live.vmm.reservations).unum("handles", live.vmm.handles);
  j.end_object();
  if (live.shards_skipped || live.vmm_skipped) j.boolean("live_incomplete", true);
  j.begin_object("findings");
  for (std::size_t i = 0; i < kFindingClassCount; ++i)
    if (auto n = s.findings[i].load()) j.unum(finding_id(static_cast<FindingClass>(i)), n);
  j.end_object();
  suppressed_json(j);
  transport_summary_json(j);
  bridge::unrequested_summary_json(j);
  if (held_now.count[0] || held_now.count[1]) {
    j.begin_object("held_at_exit");
    for (HoldReason why : {HoldReason::Quarantine, HoldReason::Deferred})
      if (const std::uint64_t n = held_now.count[static_cast<int>(why)])
        j.begin_object(reason_name(why))
            .unum("frees", n)
            .unum("bytes", held_now.bytes[static_cast<int>(why)])
            .end_object();
    j.end_object();
  }
  if (failed.calls) {
    j.begin_object("every_call_failed").unum("calls", failed.calls).num("res", failed.res);
    if (failed.name) j.str("name", failed.name);
    if (failed.cause) j.str("cause", failed.cause);
    if (failed.fake) j.str("fake_cuda", failed.fake);
    j.end_object();
  }
  j.commit(now_ns());
}

// The calls by count, most first (ties in the order of the API table), visited in place: the one
// after `prev`, or -1.
int next_by_count(const State &s, int prev) {
  int best = -1;
  std::uint64_t best_n = 0;
  const std::uint64_t pn = prev >= 0 ? s.calls.get(static_cast<std::size_t>(prev)) : 0;
  for (std::size_t i = 0; i < kApiCount; ++i) {
    const std::uint64_t n = s.calls.get(i);
    if (!n) continue;
    if (prev >= 0 && (n > pn || (n == pn && static_cast<int>(i) <= prev))) continue;
    if (best < 0 || n > best_n) {
      best = static_cast<int>(i);
      best_n = n;
    }
  }
  return best;
}

// The stderr summary, built in this buffer and written out whenever it fills (one summary per
// process, claimed first: no second writer).
char g_text[16 * 1024];

// `at`: "exit", or "the abort" for strict mode's (the report's words: "live at the abort").
void print_summary(State &s, const Live &live, const HeldFrees::AtExit &held_now,
                   const AllFailed &failed, const char *at) {
  // The program's own output first: exit() flushes stdio only after every exit handler, this one
  // included, so on a pipe (fully buffered) the summary came before the program's last lines.
  // Only if the stream is free: a thread still printing while exit() runs must not hang it.
  if (ftrylockfile(stdout) == 0) {
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  TextBuf t(g_text, sizeof g_text, [](std::string_view v) { stderr_write(v); });
  char b1[kHumanMax], b2[kHumanMax], b3[kHumanMax];
  t.s("cumemguard: summary for pid ")
      .i(getpid())
      .s(" (mode ")
      .s(s.opts.mode == Mode::Guard    ? "guard"
         : s.opts.mode == Mode::Report ? "report"
                                       : "strict")
      .s(")\n");
  t.s("  calls:");
  std::size_t col = 9;
  char d[24];
  int i = next_by_count(s, -1);
  if (i < 0) t.s(" none");
  for (; i >= 0; i = next_by_count(s, i)) {
    const std::string_view name = kApis[static_cast<std::size_t>(i)].name;
    const std::string_view n = TextBuf::digits(s.calls.get(static_cast<std::size_t>(i)), d);
    const std::size_t item = 1 + name.size() + 1 + n.size();
    if (col + item > 100) {
      t.s("\n        ");
      col = 8;
    }
    t.c(' ').s(name).c(' ').s(n);
    col += item;
  }
  t.s("\n");
  if (failed.calls) {
    // Nothing below describes a device: none ever answered.
    t.s("  cuda: every call failed (")
        .u(failed.calls)
        .s(failed.calls == 1 ? " call" : " calls")
        .s(") with ")
        .i(failed.res);
    if (failed.name) t.s(" (").s(failed.name).s(")");
    if (failed.cause) t.s(": ").s(failed.cause);
    if (failed.fake)
      t.s("; on a machine without a GPU, run with the fake CUDA stack of this build: "
          "LD_LIBRARY_PATH=")
          .s(failed.fake);
    t.s("\n");
  }
  bool header = false;
  s.counters.visit([&](const ByteCounters::Row &r) {
    if (!header) {
      t.s("  ")
          .left("device", 6)
          .c(' ')
          .left("memory", 8)
          .c(' ')
          .right("current", 12)
          .c(' ')
          .right("peak", 12)
          .c(' ')
          .right("total", 12)
          .s("\n");
      header = true;
    }
    char dev[24];
    t.s("  ")
        .left(r.kind == MemKind::Va ? std::string_view("-")
              : r.dev < 0           ? std::string_view("host")
                                    : TextBuf::digits(static_cast<std::uint64_t>(r.dev), dev),
              6)
        .c(' ')
        .left(mem_kind_name(r.kind), 8)
        .c(' ')
        .right(std::string_view(b1, human_bytes_to(b1, sizeof b1, r.current)), 12)
        .c(' ')
        .right(std::string_view(b2, human_bytes_to(b2, sizeof b2, r.peak)), 12)
        .c(' ')
        .right(std::string_view(b3, human_bytes_to(b3, sizeof b3, r.total)), 12)
        .s("\n");
  });
  const VmmCounts &vc = live.vmm;
  t.s("  live at ").s(at).s(":");
  for (MemKind k : kLinearKinds)
    if (const std::size_t n = live.n[static_cast<std::size_t>(k)])
      t.c(' ')
          .s(mem_kind_name(k))
          .c(' ')
          .u(n)
          .s(" (")
          .s(human(b1, live.bytes[static_cast<std::size_t>(k)]))
          .s("),");
  t.s(" vmm ")
      .u(vc.phys)
      .s(" (")
      .s(human(b1, vc.phys_bytes))
      .s("), reservations ")
      .u(vc.reservations)
      .s(" (")
      .s(human(b2, vc.va_bytes))
      .s("), handles ")
      .u(vc.handles)
      .s("\n");
  if (live.shards_skipped || live.vmm_skipped)
    t.s("  (incomplete: parts of the model stayed locked at ").s(at).s("; see the note above)\n");
  t.s("  findings:");
  bool any = false;
  for (std::size_t k = 0; k < kFindingClassCount; ++k)
    if (auto n = s.findings[k].load()) {
      t.s(any ? ", " : " ").s(finding_id(static_cast<FindingClass>(k))).c(' ').u(n);
      any = true;
    }
  t.s(any ? "\n" : " none\n");
  // Leaks apart, as the report, its JSON, the summary record and the exit status count them
  // (they are leak records in the log, not finding records): a leaking run says so on its own line.
  if (const std::size_t leaked = leaked_count(live))
    t.s("  leaks: ").u(leaked).s(" (live at ").s(at).s(")\n");
  if (s.opts.quarantine) {
    // What the quarantine was in this run: a stale free is caught only while its address is held.
    // Said without asking the driver (no CUDA call at exit), and without a size for a device whose
    // memory was never read.
    const QuarantineSize q = quarantine_size();
    t.s("  quarantine: ");
    if (q.how == QuarantineSize::How::NeverSized) {
      t.s("auto, never sized (nothing was held)");
    } else {
      t.s(human(b1, q.bytes));
      if (q.how == QuarantineSize::How::Auto)
        t.s(" (auto: 1/256 of the device's memory, 64 MiB to 1 GiB)");
      if (q.how == QuarantineSize::How::AutoDeviceUnknown)
        t.s(" (auto: the device's memory could not be read, so the smallest size)");
      t.s(", ")
          .s(human(b2, held().released_bytes(HoldReason::Quarantine)))
          .s(" of frees released from it");
    }
    if (const std::uint64_t n = held_now.count[static_cast<int>(HoldReason::Quarantine)])
      t.s("; ")
          .u(n)
          .s(n == 1 ? " free (" : " frees (")
          .s(human(b3, held_now.bytes[static_cast<int>(HoldReason::Quarantine)]))
          .s(") held at ")
          .s(at)
          .s(", returned to the driver with the process");
    t.s("\n");
  }
  if (const std::uint64_t n = held_now.count[static_cast<int>(HoldReason::Deferred)])
    t.s("  deferred frees: ")
        .u(n)
        .s(" (")
        .s(human(b1, held_now.bytes[static_cast<int>(HoldReason::Deferred)]))
        .s(") held at ")
        .s(at)
        .s(", returned to the driver with the process\n");
  suppressed_text(t);
  transport_summary_text(t);
  bridge::unrequested_summary_text(t);
  // Under `cumemguard run` the launcher's last line says how to read every log of the run (with
  // the launcher's own path when `cumemguard` on PATH is not it).
  if (s.log.is_open() && !s.opts.status_dir.empty())
    t.s("  log: ").s(s.log.path()).s("\n");
  else if (s.log.is_open())
    t.s("  log: ").s(s.log.path()).s(" (cumemguard report ").s(s.log.path()).s(")\n");
  t.flush();
}

}  // namespace

void exit_summary(ExitHow how) {
  State &s = state();
  // exit() from one thread can race a second exit path (strict mode's abort, a late destructor,
  // a second exit(), the crash handler): exactly one of them writes the last records, and a
  // second one on another thread waits (bounded) for them (exiting.h).
  if (!active() || !claim_exit_records()) return;
  exit_begun();
  diag_exit_begun();
  ReentryGuard guard;  // nothing below calls CUDA, but be sure nothing is recorded twice
  // Nothing more is held back; what is held stays held and goes back with the process.
  held().close();
  const HeldFrees::AtExit held_now = held().at_exit();
  const Live live = read_live_and_write_leaks(s, s.log.is_open());
  status_exit(leaked_count(live));
  const AllFailed failed = every_call_failed(calls_made(s));
  if (s.log.is_open()) {
    write_summary_record(s, live, held_now, failed);
    char buf[128];
    JsonLine j(buf, sizeof buf);
    j.str("k", "end").unum("ts", now_ns());
    if (how == ExitHow::Abort) j.boolean("aborted", true);
    if (how == ExitHow::Sanitizer) j.boolean("sanitizer", true);
    s.log.write_last(j.finish());
  }
  if (s.opts.summary)
    print_summary(s, live, held_now, failed, how == ExitHow::Abort ? "the abort" : "exit");
  flush_exit_line();
  exit_records_done();
}

}  // namespace cmg::shim
