// SPDX-License-Identifier: Apache-2.0
// Crash context and summary (see crash.h). Everything reachable from the handler is
// async-signal-safe: atomic loads, clock_gettime, write(2), sigaction, raise, nanosleep, the log's
// try-lock (a single compare-and-swap in glibc; when another thread or the crashing one holds the
// log, the crashing one's unwritten bytes are finished or the buffered lines given up, and the
// crash lines are written directly), JsonLine and the stack walk of crash_stack.cpp. No
// allocation, no stdio, no locale, no waiting on a lock. The models are not read (their locks may
// be held by the thread that crashed), so the crash summary has counters and findings but no leak
// records.
#include "clock.h"
#include "crash.h"

#include <errno.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>

#include "crash_stack.h"
#include "errors.h"
#include "exiting.h"
#include "state.h"
#include "status_channel.h"
#include "stderr_out.h"
#include "textbuf.h"

namespace cmg::shim {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// 0: nothing written; 1: a thread is writing; 2: written.
std::atomic<int> g_written{0};

const char *signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
  }
  return "signal";
}

bool has_address(int sig) {
  return sig == SIGSEGV || sig == SIGBUS || sig == SIGILL || sig == SIGFPE;
}

// The `crash` record (docs/log-format.md), after the module and stack records of the faulting
// thread, into buf[used, cap).
void crash_record(int sig, const siginfo_t *info, const void *uc, std::uint64_t ts, char *buf,
                  std::size_t cap, std::size_t &used) {
  const int frames = write_crash_stack(uc, buf, cap, used, state().opts.python_frames);
  char line[256];
  JsonLine j(line, sizeof line);
  j.str("k", "crash").unum("ts", ts).num("tid", static_cast<std::int64_t>(syscall(SYS_gettid)))
      .num("signal", sig).str("signal_name", signal_name(sig));
  if (info && has_address(sig)) j.hex("addr", reinterpret_cast<std::uintptr_t>(info->si_addr));
  if (frames) j.unum("stack", kCrashStackId);
  const std::string_view rec = j.finish();
  if (used + rec.size() > cap) return;
  std::memcpy(buf + used, rec.data(), rec.size());
  used += rec.size();
}

// sig 0: the process ends by _exit() or _Exit() (quick_exit_records below), maybe from a signal
// handler of the program's: the same records without the crash context, marked "_exit".
void write_crash_summary(int sig, const siginfo_t *info, const void *uc) {
  State &s = state();
  if (!active()) return;
  if (sig) status_signalled();  // the launcher's record counts the signal whoever writes them
  // The last records are the crash handler's unless the exit path has them: written already (the
  // log is complete), or being written (this crash may be in the exit path itself, or on another
  // thread while exit runs): then the crash record and an `end` naming the signal still go in,
  // without a second summary, if the log is not sealed yet.
  int claimed = kRecordsNone;
  const bool ours = s.last_records.compare_exchange_strong(claimed, kRecordsCrash,
                                                           std::memory_order_acq_rel);
  if (!ours && claimed == kRecordsDone) return;
  // _exit: the process got to its end (the leaks are not known: the models are not read); only
  // when these are its last records, never over the count an exit path stored.
  if (!sig && ours) status_quick_exit();
  const std::uint64_t ts = mono_ns() - s.start_mono_ns;
  // Static buffers, since the crashing thread's stack may be nearly spent: the crash context
  // (modules, the stack, the crash record) first, then the counters, large enough for every API
  // and finding class.
  static char ctx[48 * 1024];
  std::size_t ctx_used = 0;
  if (s.log.is_open() && sig) crash_record(sig, info, uc, ts, ctx, sizeof ctx, ctx_used);
  static char buf[64 * 1024];
  std::memcpy(buf, ctx, ctx_used);
  TextBuf l(buf + ctx_used, sizeof buf - ctx_used);
  std::uint64_t findings = 0;
  for (std::size_t i = 0; i < kFindingClassCount; ++i)
    findings += s.findings[i].load(std::memory_order_relaxed);
  if (ours) {
    l.s("{\"k\":\"summary\",\"ts\":").u(ts).s(",\"calls\":{");
    bool first = true;
    for (std::size_t i = 0; i < kApiCount; ++i) {
      const std::uint64_t n = s.calls.get(i);
      if (!n) continue;
      l.s(first ? "\"" : ",\"").s(kApis[i].name).s("\":").u(n);
      first = false;
    }
    l.s("},\"bytes\":[");
    first = true;
    s.counters.visit([&](const ByteCounters::Row &r) {
      l.s(first ? "{\"dev\":" : ",{\"dev\":").i(r.dev).s(",\"mem\":\"").s(mem_kind_name(r.kind))
          .s("\",\"current\":").i(r.current).s(",\"peak\":").i(r.peak).s(",\"total\":").i(r.total)
          .s("}");
      first = false;
    });
    l.s("],\"findings\":{");
    first = true;
    for (std::size_t i = 0; i < kFindingClassCount; ++i) {
      const std::uint64_t n = s.findings[i].load(std::memory_order_relaxed);
      if (!n) continue;
      l.s(first ? "\"" : ",\"").s(finding_id(static_cast<FindingClass>(i))).s("\":").u(n);
      first = false;
    }
    if (sig)
      l.s("},\"signal\":").i(sig).s("}\n");
    else
      l.s("},\"_exit\":true}\n");
    if (l.full()) l.truncate(0);  // a cut line would not parse: drop it
  }
  if (sig)
    l.s("{\"k\":\"end\",\"ts\":").u(ts).s(",\"signal\":").i(sig).s(",\"signal_name\":\"")
        .s(signal_name(sig)).s("\"}\n");
  else
    l.s("{\"k\":\"end\",\"ts\":").u(ts).s(",\"_exit\":true}\n");
  s.log.write_from_signal(std::string_view(buf, ctx_used + l.size()), sig ? 0 : 200'000'000);
  if (s.opts.summary) {
    char msg[1024];
    TextBuf m(msg, sizeof msg - 1);
    std::uint64_t calls = 0;
    for (std::size_t i = 0; i < kApiCount; ++i) calls += s.calls.get(i);
    m.s("cumemguard: pid ")
        .i(static_cast<std::int64_t>(syscall(SYS_getpid)))
        .s(sig ? " killed by " : " ended by _exit")
        .s(sig ? signal_name(sig) : "")
        .s(" after ")
        .u(calls)
        .s(calls == 1 ? " call, " : " calls, ")
        .u(findings)
        .s(findings == 1 ? " finding" : " findings");  // "1 call", not "1 calls"
    if (s.log.is_open())
      m.s("; log: ").s(s.log.path()).s(sig ? " (counters up to the signal)"
                                          : " (counters; no leak check at _exit)");
    msg[m.size()] = '\n';
    stderr_write(std::string_view(msg, m.size() + 1));
  }
  if (ours) exit_records_done();
}

void on_fatal(int sig, siginfo_t *info, void *uc) {
  if (crash_stack_fault_in_walk()) return;  // not reached when it was: it jumps back to the walk
  const int saved = errno;
  int expected = 0;
  if (g_written.compare_exchange_strong(expected, 1)) {
    write_crash_summary(sig, info, uc);
    g_written.store(2);
  } else {
    // Another thread is writing the summary: give it a moment before this signal ends the process.
    for (int i = 0; i < 200 && g_written.load() == 1; ++i) {
      timespec t{0, 5000000};
      nanosleep(&t, nullptr);
    }
  }
  // Back to the default action, then the same signal again: it is delivered when this handler
  // returns (a fault re-executes the instruction, raise() covers a signal sent by kill), and the
  // process ends as it would have without the shim: same signal, same core dump.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);
  errno = saved;
}

}  // namespace

void quick_exit_records() {
  int expected = 0;
  if (g_written.compare_exchange_strong(expected, 1)) {
    write_crash_summary(0, nullptr, nullptr);
    g_written.store(2);
    return;
  }
  // A crash summary is being written on another thread: _exit would cut it off. A moment, as a
  // second fatal signal gives it (on_fatal).
  for (int i = 0; i < 200 && g_written.load() == 1; ++i) {
    timespec t{0, 5000000};
    nanosleep(&t, nullptr);
  }
}

void install_crash_handlers() {
  for (int sig : kSignals) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0) continue;
    // Only where nobody handles the signal: a runtime's or a framework's handler (the JVM's, a
    // sanitizer's, Python's faulthandler) is never replaced or run in their place.
    if ((old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
  crash_stack_warm_up();
}

void crash_fork_child() {
  g_written.store(0);
  forget_modules_written();
  errors_fork_child();
}

}  // namespace cmg::shim
