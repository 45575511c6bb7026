// SPDX-License-Identifier: Apache-2.0
// Exit summary and leak records (see summary.h).
#include "summary.h"

#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bridge.h"
#include "diag.h"
#include "flush.h"
#include "held.h"
#include "loader.h"
#include "lock_within.h"
#include "state.h"
#include "status_channel.h"
#include "suppress.h"

namespace cmg::shim {
namespace {

// What the model holds at exit, read once for the leak records, the summary record and the
// stderr summary. Every lock is taken with a bounded wait (lock_within.h): a part whose lock a
// thread kept (a signal handler interrupted it there and called exit()) is left out and said so.
struct Live {
  std::map<std::string, std::pair<std::size_t, std::uint64_t>> linear;  // kind -> count, bytes
  VmmCounts vmm;
  std::size_t shards_skipped = 0;
  bool vmm_skipped = false;
};

Live read_live_and_write_leaks(State &s, bool log) {
  Live live;
  char buf[1024];
  auto emit = [&](JsonLine &j) { s.log.write(j.finish(), now_ns()); };
  live.shards_skipped = s.linear.for_each_live_within(
      [&](const LinearRec &r) {
        auto &e = live.linear[std::string(mem_kind_name(r.kind))];
        ++e.first;
        e.second += r.size;
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak").str("what", mem_kind_name(r.kind))
            .str("api", r.alloc.api ? r.alloc.api : "").hex("ptr", r.ptr).unum("size", r.size)
            .num("dev", r.dev).unum("seq", r.alloc.seq);
        if (r.alloc.stack) j.unum("stack", r.alloc.stack);
        emit(j);
      },
      kExitPatienceNs);
  live.vmm_skipped = !s.vmm.visit_within(
      kExitPatienceNs,
      [&](const PhysAlloc &a) {
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak").str("what", "vmm").str("api", a.created.api ? a.created.api : "")
            .unum("size", a.size).num("dev", a.dev()).unum("seq", a.created.seq)
            .unum("handle_refs", a.handle_refs).unum("mappings", a.map_count);
        if (a.created.stack) j.unum("stack", a.created.stack);
        emit(j);
      },
      [&](const Reservation &r) {
        if (!log) return;
        JsonLine j(buf, sizeof buf);
        j.str("k", "leak").str("what", "va").str("api", r.reserved.api ? r.reserved.api : "")
            .hex("ptr", r.base).unum("size", r.size).num("dev", -1).unum("seq", r.reserved.seq);
        if (r.reserved.stack) j.unum("stack", r.reserved.stack);
        emit(j);
      },
      live.vmm);
  if (live.shards_skipped || live.vmm_skipped)
    note(LogLevel::Warn,
         "exit: " +
             (live.shards_skipped
                  ? std::to_string(live.shards_skipped) + " of " +
                        std::to_string(LinearModel::kShards) + " parts of the linear model"
                  : std::string()) +
             (live.shards_skipped && live.vmm_skipped ? " and " : "") +
             (live.vmm_skipped ? std::string("the VMM model") : std::string()) +
             " stayed locked by a thread that did not come back (a signal handler that called "
             "exit() interrupted it); what they hold is not in the leak report");
  return live;
}

// One leak per allocation, handle and reservation live at exit: the leak records of the log, the
// summary's "leak N" and the launcher's --fail-on-leaks count the same things.
std::size_t leaked_count(const Live &live) {
  std::size_t n = live.vmm.phys + live.vmm.reservations;
  for (const auto &[k, e] : live.linear) n += e.first;
  return n;
}

void write_summary_record(State &s, const Live &live) {
  LogLine j(s.log);
  j.str("k", "summary").unum("ts", now_ns()).begin_object("calls");
  for (std::size_t i = 0; i < kApiCount; ++i)
    if (auto n = s.calls.get(i)) j.unum(kApis[i].name, n);
  j.end_object().begin_array("bytes");
  s.counters.visit([&](const ByteCounters::Row &r) {
    j.elem_object().num("dev", r.dev).str("mem", mem_kind_name(r.kind)).num("current", r.current)
        .num("peak", r.peak).num("total", r.total).end_object();
  });
  j.end_array();
  j.begin_object("live");
  for (const auto &[k, n] : live.linear) j.unum(k, n.first);
  j.unum("vmm", live.vmm.phys).unum("va", live.vmm.reservations).unum("handles", live.vmm.handles);
  j.end_object();
  if (live.shards_skipped || live.vmm_skipped) j.boolean("live_incomplete", true);
  j.begin_object("findings");
  for (std::size_t i = 0; i < kFindingClassCount; ++i)
    if (auto n = s.findings[i].load()) j.unum(finding_id(static_cast<FindingClass>(i)), n);
  j.end_object();
  if (const std::string sup = suppressed_json(); !sup.empty()) j.raw("suppressed", sup);
  j.raw("transport", transport_summary_json());
  if (const std::string b = bridge::unrequested_summary_json(); !b.empty()) j.raw("bridge", b);
  j.commit(now_ns());
}

void print_summary(State &s, const Live &live) {
  std::string out = fmt::format("cumemguard: summary for pid {} (mode {})\n", getpid(),
                                s.opts.mode == Mode::Guard    ? "guard"
                                : s.opts.mode == Mode::Report ? "report"
                                                              : "strict");
  std::vector<std::pair<std::string, std::uint64_t>> calls;
  for (std::size_t i = 0; i < kApiCount; ++i)
    if (auto n = s.calls.get(i)) calls.emplace_back(kApis[i].name, n);
  std::sort(calls.begin(), calls.end(), [](auto &a, auto &b) { return a.second > b.second; });
  out += "  calls:";
  if (calls.empty()) out += " none";
  std::size_t col = 9;
  for (const auto &[n, c] : calls) {
    std::string item = fmt::format(" {} {}", n, c);
    if (col + item.size() > 100) {
      out += "\n        ";
      col = 8;
    }
    out += item;
    col += item.size();
  }
  out += "\n";
  auto rows = s.counters.snapshot();
  if (!rows.empty()) {
    out += fmt::format("  {:<6} {:<8} {:>12} {:>12} {:>12}\n", "device", "memory", "current",
                       "peak", "total");
    for (const auto &r : rows)
      out += fmt::format("  {:<6} {:<8} {:>12} {:>12} {:>12}\n",
                         r.kind == MemKind::Va ? std::string("-")
                         : r.dev < 0           ? std::string("host")
                                               : std::to_string(r.dev),
                         mem_kind_name(r.kind), human_bytes(r.current), human_bytes(r.peak), human_bytes(r.total));
  }
  const VmmCounts &vc = live.vmm;
  out += "  live at exit:";
  for (const auto &[k, e] : live.linear)
    out += fmt::format(" {} {} ({}),", k, e.first, human_bytes(static_cast<std::int64_t>(e.second)));
  out += fmt::format(" vmm {} ({}), reservations {} ({}), handles {}\n", vc.phys,
                     human_bytes(static_cast<std::int64_t>(vc.phys_bytes)), vc.reservations,
                     human_bytes(static_cast<std::int64_t>(vc.va_bytes)), vc.handles);
  if (live.shards_skipped || live.vmm_skipped)
    out += "  (incomplete: parts of the model stayed locked at exit; see the note above)\n";
  out += "  findings:";
  bool any = false;
  for (std::size_t i = 0; i < kFindingClassCount; ++i)
    if (auto n = s.findings[i].load()) {
      out += fmt::format("{} {} {}", any ? "," : "", finding_id(static_cast<FindingClass>(i)), n);
      any = true;
    }
  // Leaks are findings of class leak: counted here from what is live at exit (they are leak
  // records in the log, not finding records), so a leaking run never says "findings: none".
  const std::size_t leaked = leaked_count(live);
  if (leaked) {
    out += fmt::format("{} leak {} (live at exit)", any ? "," : "", leaked);
    any = true;
  }
  out += any ? "\n" : " none\n";
  if (s.opts.quarantine) {
    // What the quarantine was in this run: a stale free is caught only while its address is held.
    const std::uint64_t q = quarantine_limit(-1);
    out += fmt::format("  quarantine: {}{}, {} of frees released from it\n", human_bytes(static_cast<std::int64_t>(q)),
                       s.opts.quarantine == kAutoSize ? " (auto: 1/256 of the device's memory, 64 MiB to 1 GiB)" : "",
                       human_bytes(static_cast<std::int64_t>(held().released_bytes(HoldReason::Quarantine))));
  }
  out += suppressed_text();
  out += transport_summary_text();
  out += bridge::unrequested_summary_text();
  if (s.log.is_open())
    out += fmt::format("  log: {} (cumemguard report {})\n", s.log.path(), s.log.path());
  // The program's own output first: exit() flushes stdio only after every exit handler, this one
  // included, so on a pipe (fully buffered) the summary came before the program's last lines.
  // Only if the stream is free: a thread still printing while exit() runs must not hang it.
  if (ftrylockfile(stdout) == 0) {
    fflush_unlocked(stdout);
    funlockfile(stdout);
  }
  ssize_t n = ::write(2, out.data(), out.size());
  (void)n;
}

}  // namespace

void exit_begun() {
  if (!g_state.load(std::memory_order_acquire)) return;
  state().log.exit_begin();
}

void exit_summary(bool from_abort) {
  State &s = state();
  // exit() from one thread can race a second exit path (strict mode's abort, a late destructor):
  // exactly one of them writes the last records.
  if (!active() || s.summary_printed.exchange(true)) return;
  exit_begun();
  diag_exit_begun();
  // Held frees go back to the driver now (nothing held is ever dropped).
  if (!from_abort) held().release_all_at_exit();
  ReentryGuard guard;  // nothing below calls CUDA, but be sure nothing is recorded twice
  const Live live = read_live_and_write_leaks(s, s.log.is_open());
  status_exit(leaked_count(live));
  if (s.log.is_open()) {
    write_summary_record(s, live);
    char buf[128];
    JsonLine j(buf, sizeof buf);
    j.str("k", "end").unum("ts", now_ns());
    if (from_abort) j.boolean("aborted", true);
    s.log.write_last(j.finish());
  }
  if (s.opts.summary) print_summary(s, live);
  flush_exit_line();
}

}  // namespace cmg::shim
