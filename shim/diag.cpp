// SPDX-License-Identifier: Apache-2.0
// Diagnostics on stderr: spdlog made once and deliberately leaked, raw write(2) after exit began;
// either way each line is built in a fixed buffer and goes only to the verified stderr
// (stderr_out.h), never to whatever the host put at descriptor 2.
#include "diag.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "live_stacks.h"
#include "state.h"
#include "stderr_out.h"
#include "textbuf.h"

namespace cmg::shim {
namespace {

std::atomic<bool> g_exit_begun{false};  // raw write(2) from now on: exit began, or a forked child
std::atomic<bool> g_exiting{false};     // exit began
std::mutex g_pending_mu;
std::vector<std::pair<LogLevel, std::string>> *g_pending = nullptr;
std::vector<std::string> *g_pending_lines = nullptr;

// spdlog's stderr sinks write to the FILE behind descriptor 2: this one writes to the verified one.
class VerifiedStderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg &msg) override {
    spdlog::memory_buf_t out;
    formatter_->format(msg, out);
    stderr_write(std::string_view(out.data(), out.size()));
  }
  void flush_() override {}
};

spdlog::logger *logger() {
  static spdlog::logger *l = [] {
    // Not registered and never destroyed: it must outlive every static destructor.
    auto sink = std::make_shared<VerifiedStderrSink>();
    auto *lg = new spdlog::logger("cumemguard", sink);
    lg->set_pattern("%v");  // the prefix names the process: see prefix()
    lg->set_level(spdlog::level::trace);
    lg->flush_on(spdlog::level::trace);
    return lg;
  }();
  return l;
}

const char *level_word(LogLevel l) {
  switch (l) {
    case LogLevel::Error: return "error";
    case LogLevel::Warn: return "warning";
    case LogLevel::Info: return "info";
    case LogLevel::Debug: return "debug";
  }
  return "";
}

void write_note_record(LogLevel level, std::string_view msg) {
  char buf[4096];
  JsonLine j(buf, sizeof buf);
  j.str("k", "note").unum("ts", now_ns()).str("level", level_word(level)).str("msg", msg);
  state().log.write(j.finish(), now_ns());
}

// Messages quote what the program or its environment handed over (values, paths, allocator
// strings): on the host's stderr they stay one line, with control characters escaped (a newline
// must not forge a second line, an escape sequence must not drive the terminal) and at most
// kMaxLine bytes. The event log keeps the full text, JSON-escaped.
constexpr std::size_t kMaxLine = 2000;

// "cumemguard[4242]: " or, when the rank is known, "cumemguard[4242 rank 1]: ": lines of many
// processes (torchrun ranks, a forked importer) interleaved on one terminal can be told apart, as
// ASan's ==PID== lines can. getpid() each time: a forked child writes its own.
void prefix(TextBuf &t) {
  const int rank = options_ready() ? state().rank : -1;
  t.s("cumemguard[").i(getpid());
  if (rank >= 0) t.s(" rank ").i(rank);
  t.s("]: ");
}

}  // namespace

bool enabled(LogLevel l) {
  if (!options_ready()) return l <= LogLevel::Warn;
  return static_cast<int>(l) <= static_cast<int>(state().opts.log_level);
}

void diag_line(LogLevel level, std::string_view msg, std::string_view more) {
  if (!enabled(level)) return;
  // Built on the stack: after exit began nothing may allocate, and before it a line costs no heap.
  char line[kMaxLine + 160];
  TextBuf t(line, sizeof line);
  prefix(t);
  t.s(level_word(level)).s(": ");
  char esc[kMaxLine + 8];
  std::size_t used = 0;
  t.s(std::string_view(esc, escape_controls_to(msg, kMaxLine, esc, sizeof esc, used)));
  if (used < msg.size()) t.s("... (").u(msg.size() - used).s(" more bytes)");
  if (g_exit_begun.load(std::memory_order_acquire)) {
    t.c('\n');
    stderr_write(t.view());
    if (!more.empty()) stderr_write(more);  // none once exit began (print_finding): a view, no copy
    return;
  }
  try {
    if (more.empty()) {
      logger()->info(std::string_view(t.view()));
    } else {
      // The stacks in the same write as their line, so other processes' lines cannot split them.
      std::string full(t.view());
      full += '\n';
      full.append(more.substr(0, more.size() - (more.back() == '\n')));
      logger()->info(full);
    }
  } catch (...) {
    // Never let a diagnostic take the host down.
  }
}

void note(LogLevel level, std::string_view msg) {
  diag_line(level, msg);
  if (state().log.is_open()) {
    write_note_record(level, msg);
    return;
  }
  if (active()) return;  // active without a log: nothing to keep
  std::lock_guard lk(g_pending_mu);
  if (!g_pending) g_pending = new std::vector<std::pair<LogLevel, std::string>>;
  if (g_pending->size() < 64) g_pending->emplace_back(level, std::string(msg));
}

void flush_pending_notes() {
  std::lock_guard lk(g_pending_mu);
  if (g_pending) {
    if (state().log.is_open())
      for (const auto &[l, m] : *g_pending) write_note_record(l, m);
    g_pending->clear();
  }
  if (g_pending_lines) {
    if (state().log.is_open())
      for (const auto &line : *g_pending_lines) state().log.write(line, now_ns());
    g_pending_lines->clear();
  }
}

void write_or_keep(std::string line) {
  if (state().log.is_open()) {
    state().log.write(line, now_ns());
    return;
  }
  if (active()) return;
  std::lock_guard lk(g_pending_mu);
  if (!g_pending_lines) g_pending_lines = new std::vector<std::string>;
  if (g_pending_lines->size() < 256) g_pending_lines->push_back(std::move(line));
}

void print_finding(const Finding &f, Action action, int res, const char *api, bool from_call,
                   std::uint32_t stack) {
  State &s = state();
  if (!enabled(LogLevel::Warn)) return;
  std::int64_t n = s.warned.fetch_add(1, std::memory_order_relaxed);
  if (n > s.opts.warn_limit) return;
  if (n == s.opts.warn_limit) {
    diag_line(LogLevel::Warn, "further findings go only to the log and the exit summary "
                              "(CUMEMGUARD_WARN_LIMIT)");
    return;
  }
  // One stack buffer: a finding printed while exit runs (a destructor's double free) allocates
  // nothing here either.
  char line[kMaxLine + 200];
  TextBuf t(line, sizeof line);
  t.s(finding_id(f.cls)).s(" in ").s(api).s(": ").s(f.msg);
  // A finding without a call (the environment at load) was not forwarded anywhere: saying "the
  // driver returned 0" there would be false.
  if (from_call) {
    switch (action) {
      case Action::Skip:
        t.s(" [skipped: returned ").i(res).s(" without calling the driver]");
        break;
      case Action::Forward: t.s(" [forwarded: the driver returned ").i(res).s("]"); break;
      case Action::Defer: t.s(" [deferred]"); break;
      case Action::Abort: t.s(" [strict mode]"); break;
    }
  }
  // The stacks under the line: not once exit began, since the symbolizer takes its cache's lock,
  // which the thread a signal handler interrupted to call exit() may hold.
  std::string more;
  if (!g_exiting.load(std::memory_order_acquire)) {
    char pb[64];
    TextBuf pt(pb, sizeof pb);
    prefix(pt);
    more = finding_stack_lines(f, stack, static_cast<int>(s.opts.warn_frames), pt.view());
  }
  diag_line(LogLevel::Warn, t.view(), more);
}

void diag_exit_begun() {
  g_exiting.store(true, std::memory_order_release);
  g_exit_begun.store(true, std::memory_order_release);
}

void diag_fork_prepare() { g_pending_mu.lock(); }
void diag_fork_parent() { g_pending_mu.unlock(); }
void diag_fork_child() {
  g_pending_mu.unlock();
  // Another thread may have held spdlog's sink lock at fork(): the child writes raw lines.
  g_exit_begun.store(true, std::memory_order_release);
}

}  // namespace cmg::shim
