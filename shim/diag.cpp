// SPDX-License-Identifier: Apache-2.0
// Diagnostics on stderr: spdlog made once and deliberately leaked, raw write(2) after exit began.
#include "diag.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include "live_stacks.h"
#include "state.h"

namespace cmg::shim {
namespace {

std::atomic<bool> g_exit_begun{false};  // raw write(2) from now on: exit began, or a forked child
std::atomic<bool> g_exiting{false};     // exit began
std::mutex g_pending_mu;
std::vector<std::pair<LogLevel, std::string>> *g_pending = nullptr;
std::vector<std::string> *g_pending_lines = nullptr;

spdlog::logger *logger() {
  static spdlog::logger *l = [] {
    // Not registered and never destroyed: it must outlive every static destructor.
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
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

bool enabled(LogLevel l) {
  if (!options_ready()) return l <= LogLevel::Warn;
  return static_cast<int>(l) <= static_cast<int>(state().opts.log_level);
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

std::string one_line(std::string_view msg) {
  std::size_t used = 0;
  std::string out = escape_controls(msg, kMaxLine, used);
  if (used < msg.size()) out += "... (" + std::to_string(msg.size() - used) + " more bytes)";
  return out;
}

// "cumemguard[4242]: " or, when the rank is known, "cumemguard[4242 rank 1]: ": lines of many
// processes (torchrun ranks, a forked importer) interleaved on one terminal can be told apart, as
// ASan's ==PID== lines can. getpid() each time: a forked child writes its own.
std::string prefix() {
  const int rank = options_ready() ? state().rank : -1;
  return "cumemguard[" + std::to_string(getpid()) +
         (rank >= 0 ? " rank " + std::to_string(rank) : std::string()) + "]: ";
}

}  // namespace

void diag_line(LogLevel level, std::string_view msg, std::string_view more) {
  if (!enabled(level)) return;
  std::string line = prefix() + level_word(level) + ": " + one_line(msg);
  if (!more.empty()) {
    line += '\n';
    line.append(more.substr(0, more.size() - (more.back() == '\n')));
  }
  if (g_exit_begun.load(std::memory_order_acquire)) {
    std::string raw = line + "\n";
    ssize_t n = ::write(2, raw.data(), raw.size());
    (void)n;
    return;
  }
  try {
    logger()->info(line);
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
  std::string what;
  switch (action) {
    case Action::Skip: what = "skipped: returned " + std::to_string(res) + " without calling the driver"; break;
    case Action::Forward: what = "forwarded: the driver returned " + std::to_string(res); break;
    case Action::Defer: what = "deferred"; break;
    case Action::Abort: what = "strict mode"; break;
  }
  // A finding without a call (the environment at load) was not forwarded anywhere: saying "the
  // driver returned 0" there would be false.
  diag_line(LogLevel::Warn,
            std::string(finding_id(f.cls)) + " in " + api + ": " + f.msg +
                (from_call ? " [" + what + "]" : std::string()),
            // Not once exit began: the symbolizer takes its cache's lock, which the thread a
            // signal handler interrupted to call exit() may hold.
            g_exiting.load(std::memory_order_acquire)
                ? std::string()
                : finding_stack_lines(f, stack, static_cast<int>(s.opts.warn_frames), prefix()));
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
