// SPDX-License-Identifier: Apache-2.0
// Process-wide state of the shim: two-stage init, activation, call records, findings, fork and
// exit handling. Nothing here throws across the C ABI and nothing exits except strict mode.
#include "state.h"

#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "bridge.h"
#include "clock.h"
#include "crash.h"
#include "diag.h"
#include "env_write.h"
#include "exiting.h"
#include "flush.h"
#include "handlers.h"
#include "held.h"
#include "interposers.h"
#include "loader.h"
#include "records.h"
#include "sanitizer_exit.h"
#include "resident.h"
#include "stacks.h"
#include "threads.h"
#include "status_channel.h"
#include "stderr_out.h"
#include "summary.h"
#include "suppress.h"
#include "cmg_config.h"
#include "device_cache.h"

extern char **environ;

namespace cmg::shim {

CMG_HOT_TLS int ReentryGuard::depth_ = 0;
CMG_HOT_TLS std::uint32_t t_tid = 0;
std::atomic<State *> g_state{nullptr};
std::atomic<bool> g_active{false};

std::size_t CallCounts::stripe_slow() {
  static std::atomic<std::size_t> next{0};
  // A thread's own stripe is never given to another (a thread that ends keeps it: its counts
  // stay, and no two threads ever write one stripe with plain stores).
  const std::size_t k = next.fetch_add(1, std::memory_order_relaxed);
  t_stripe = (k < kOwned ? k : kOwned + (k - kOwned) % kShared) + 1;
  return t_stripe - 1;
}

namespace {

std::atomic<int> g_options_state{0};  // 0 none, 1 parsing, 2 ready
const ParsedOptions *g_parsed = nullptr;  // the one reading of the environment; leaked on purpose
std::mutex g_activate_mu;
// The parent's log path, in a forked child: a pattern without %p must not make the child truncate
// its parent's log.
std::string *g_parent_log = nullptr;


// fork(): every lock of the shim but the linear shards' is held across it, taken in the one order
// the code nests them (routing table, IPC imports, the IPC bridge, held frees, flush sites and
// symbol cache, stack table, VMM model, capture model, NCCL holdings, pending notes, the log last:
// stack capture and leaks write to the log while holding their own lock), so the child never
// inherits a lock another thread held or a half-changed table. The linear model's child starts over
// on fresh shards (tracker.h).
void fork_prepare() {
  State &s = state();
  loader_fork_prepare();
  ipc_fork_prepare();
  bridge::fork_prepare();
  held().fork_prepare();
  flush_fork_prepare();
  stacks_fork_prepare();
  s.vmm.fork_prepare();
  s.capture.fork_prepare();
  s.nccl.fork_prepare();
  diag_fork_prepare();
  s.log.fork_prepare();
  threads_fork_prepare();  // last: waits for the shim's starting threads (threads.h)
}

void fork_parent() {
  threads_fork_parent();
  State &s = state();
  s.log.fork_parent();
  diag_fork_parent();
  s.nccl.fork_parent();
  s.capture.fork_parent();
  s.vmm.fork_parent();
  stacks_fork_parent();
  flush_fork_parent();
  held().fork_parent();
  bridge::fork_parent();
  ipc_fork_parent();
  loader_fork_parent();
}

void fork_child() {
  threads_fork_child();
  State &s = state();
  std::string parent_log = s.log.path();  // read before the log forgets it
  s.log.fork_child();
  diag_fork_child();
  s.linear.fork_child();
  // In the reverse order of fork_prepare: a model's fork_child takes its own lock again (clear),
  // which must not happen while a lock taken after it in fork_prepare is still held (ThreadSanitizer
  // saw the vmm-then-capture order inverted in every forked child).
  s.nccl.fork_child();
  s.capture.fork_child();
  s.vmm.fork_child();
  stacks_fork_child();
  flush_fork_child();
  held().fork_child();
  bridge::fork_child();
  ipc_fork_child();
  loader_fork_child();
  s.transport.reset();
  s.counters.reset();
  s.calls.reset();
  t_tid = 0;  // this thread has the child's id now
  forget_current_device_everywhere();  // the child has no context of the parent's
  for (auto &f : s.findings) f.store(0);
  s.warned.store(0);
  s.last_records.store(0);
  exiting_fork_child();
  crash_fork_child();
  status_fork_child();
  resident_fork_child();
  new (&g_activate_mu) std::mutex();
  // The child activates (and opens its own log) at its own first CUDA call.
  g_active.store(false);
  if (!parent_log.empty()) g_parent_log = new std::string(std::move(parent_log));
}

// The CUMEMGUARD_* problems, said once per process tree: every process of a job inherits the same
// misspelt name, and a script of ten children would print it ten times. The first process that
// says them leaves a digest of them in CUMEMGUARD_SAID, which its children inherit; a process whose
// problems have the same digest says nothing, one with others (its environment was changed) says
// its own. Fatal problems (CUMEMGUARD_STRICT_CONFIG) are said by each process, since each aborts.
// Runs in the constructor (or at the first use of the shim): the digest is left only while no
// other thread can read the environment (env_write.h); a dlopen'ed shim's children say them again.
void say_option_problems(const ParsedOptions &p) {
  if (p.problems.empty()) return;
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the lines, each ended by a newline
  for (const std::string &msg : p.problems)
    for (const char c : msg + "\n") h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(h));
  if (!p.fatal && p.options.said == digest) return;
  for (const auto &msg : p.problems) note(LogLevel::Warn, msg);
  if (environ_write_safe()) setenv("CUMEMGUARD_SAID", digest, 1);
}

}  // namespace

const ParsedOptions &parsed_options() {
  options_ready();
  // Never destroyed, like the rest of the state: no exit handler is registered for it (past 32
  // of them glibc frees a block of its list at exit, on the exiting thread: an allocator call
  // after exit began).
  static const ParsedOptions &none = *new ParsedOptions;
  return g_parsed ? *g_parsed : none;
}

State &state_slow() {
  // Never destroyed: static destructors of other libraries free CUDA memory after main() returns.
  static State *s = new State;
  g_state.store(s, std::memory_order_release);
  return *s;
}

std::uint64_t now_ns() { return mono_ns() - state().start_mono_ns; }

std::uint32_t thread_id_slow() {
  t_tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  return t_tid;
}

bool options_ready() {
  static thread_local bool parsing_here = false;
  int st = g_options_state.load(std::memory_order_acquire);
  if (st == 2) return true;
  if (parsing_here) return false;  // a note printed while this thread parses: defaults for now
  int expected = 0;
  if (!g_options_state.compare_exchange_strong(expected, 1)) {
    // Another thread is parsing (it takes microseconds): wait for it, so that no thread runs
    // with the defaults while the real options are being written.
    while (g_options_state.load(std::memory_order_acquire) != 2) sched_yield();
    return true;
  }
  parsing_here = true;
  State &s = state();
  s.start_mono_ns = mono_ns();
  s.start_unix_ns = unix_ns();
  s.rank = rank_from_env();
  // The environment is read here once; everything after uses this snapshot.
  auto *parsed = new ParsedOptions(parse_options(environ));
  const ParsedOptions &p = *parsed;
  g_parsed = parsed;
  s.opts = p.options;
  g_options_state.store(2, std::memory_order_release);
  parsing_here = false;
  if (s.opts.disable) return true;
  // Before the first diagnostic: the stderr the shim writes to is the one the process started
  // with, whatever the host puts at descriptor 2 later (stderr_out.h).
  stderr_take();
  say_option_problems(p);
  if (p.fatal) {
    note(LogLevel::Error, "CUMEMGUARD_STRICT_CONFIG is set and the options above are invalid; "
                          "aborting");
    std::abort();
  }
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  return true;
}

void activate_slow() {
  if (g_active.load(std::memory_order_acquire)) return;
  options_ready();
  std::lock_guard lk(g_activate_mu);
  if (g_active.load(std::memory_order_relaxed)) return;
  State &s = state();
  const std::vector<Interposer> before = interposers_before();
  status_open();
  if (!s.opts.log.empty()) {
    const std::string path = log_path_for(s.opts.log, s.rank);
    // A name another process of the run holds or wrote (docs/log-format.md, "Log names"): the
    // next candidate, NAME.<pid>. A forked child starts there: its parent may be gone, but the
    // file is still the parent's.
    std::string err;
    bool taken = true;
    for (int k = g_parent_log && path == *g_parent_log ? 1 : 0; taken && k < kLogNameCandidates;
         ++k)
      err = s.log.open(log_name_candidate(path, getpid(), k), s.opts.run_id, &taken);
    if (!err.empty()) {
      note(LogLevel::Warn, err + "; continuing without an event log");
    } else {
      write_header_record(before);
    }
    status_log(s.log.is_open() ? s.log.path() : path, s.log.is_open());
  }
  for (const Interposer &i : before) note(LogLevel::Warn, interposer_note(i));
  if (s.opts.stacks > 0) stacks_warm_up();
  suppressions_load();
  // What the exit path reads is made now: after exit begins nothing is allocated.
  held();
  flush_reserve();
  bridge::exports();
  g_active.store(true, std::memory_order_release);
  release_load_abort_handler();
  if (s.opts.crash_summary) install_crash_handlers();
  snapshot_signal_start();
  flush_pending_notes();
  on_first_cuda_call();
}

namespace {
DeviceEpoch g_device_epoch;
thread_local __attribute__((tls_model("initial-exec"))) CachedDevice t_device;

int ask_current_device() {
  static std::atomic<void *> slot{nullptr};
  // The 2000 ABI: cuCtxGetDevice(CUdevice *) of the context current on this thread.
  auto f = driver_fn<PFN_cuCtxGetDevice_v2000>(slot, "cuCtxGetDevice");
  CUdevice d = -1;
  if (!f || f(&d) != CUDA_SUCCESS) return -1;
  return d;
}
}  // namespace

int current_device() { return t_device.get(g_device_epoch, ask_current_device); }

void forget_current_device() { t_device.forget(); }

void forget_current_device_everywhere() { g_device_epoch.advance(); }

// ---------------------------------------------------------------------------------------------
void Call::observe(State &s, StackWhen stack) {
  // Times are read only where they are written: in the event log. Without one, a call's event is
  // identified by its seq alone (the clock read is one of the larger costs of a call whose
  // caches the driver has just evicted, docs/performance.md).
  if (s.log.is_open()) {
    t0_ = now_ns();
    ev_.ts = t0_;
  }
  // Stacks are shown from the log (findings, leaks, the report) and under live finding messages
  // (CUMEMGUARD_WARN_FRAMES): with neither they are not captured at all.
  if (s.opts.stacks > 0 && stack != StackWhen::Never) {
    bool take = stack == StackWhen::Always || s.opts.stack_sample <= 1 ||
                ev_.seq % static_cast<std::uint64_t>(s.opts.stack_sample) == 0;
    if (take) ev_.stack = capture_stack(static_cast<int>(s.opts.stacks));
  }
}

void Call::write_record(int res, const Args &args, const Extra &x) {
  State &s = state();
  std::uint64_t end = now_ns();
  char buf[2048];
  JsonLine j(buf, sizeof buf);
  const std::string_view api = api_name_view(api_);
  const std::string_view mem = x.mem ? mem_kind_name(*x.mem) : std::string_view();
  // The members other than strings: numbers, the API's and the kind's names, flags. One room
  // check for all of them when their largest size fits (always, in this buffer: a string
  // argument aside), members checked one by one otherwise; the same bytes either way.
  auto members = [&](auto &w) {
    w.ident("k", "call").unum("seq", ev_.seq).unum("ts", ev_.ts).unum("tid", ev_.tid)
        .ident("api", api).num("res", res).unum("dur", end - t0_);
    put_args(w, args);
    if (x.mem) {
      w.num("dev", x.dev).ident("mem", mem);
      if (x.delta) w.num("delta", x.delta);
    }
    if (x.skipped) w.boolean("skipped", true);
    if (x.deferred) w.boolean("deferred", true);
  };
  constexpr std::size_t kNum = 4 + JsonLine::kNumMax;  // a short key's bytes and a number
  const std::size_t bound = (1 + 4 + 6) + 6 * (3 + kNum) + (3 + 4 + 2 + api.size()) +
                            args_bound(args) + (3 + kNum) + (3 + 4 + 2 + mem.size()) + (5 + kNum) +
                            2 * (8 + 4 + 5);
  if (j.fits(bound)) {
    JsonLine::Unchecked u(j);
    members(u);
  } else {
    members(j);
  }
  if (x.va_state) j.str("va_state", x.va_state);
  if (ev_.stack) j.unum("stack", ev_.stack);
  s.log.write(j.finish(), end);
}

// ---------------------------------------------------------------------------------------------
void report_finding(const Call &c, Finding f, Action action, int res, const Args &args) {
  State &s = state();
  // Suppressed (CUMEMGUARD_SUPPRESSIONS): logged with the rule, not counted, not printed, and
  // never the reason to abort. Strict mode's hooks report a finding before the driver call (to
  // abort there) and again after it; for a suppressed one the process goes on, and the second
  // report of the same call is the same finding.
  static CMG_HOT_TLS struct {
    std::uint64_t seq;
    FindingClass cls;
  } t_suppressed_abort{0, FindingClass::Leak};
  if (action == Action::Abort && t_suppressed_abort.seq == c.ev().seq && c.ev().seq &&
      t_suppressed_abort.cls == f.cls)
    return;
  const SuppressHit sup = suppression_for(f.cls, /*count=*/true);
  if (sup && action == Action::Abort) {
    t_suppressed_abort = {c.ev().seq, f.cls};
    action = Action::Forward;
  }
  if (!sup) {
    s.findings[static_cast<std::size_t>(f.cls)].fetch_add(1, std::memory_order_relaxed);
    status_findings();
  }
  std::uint64_t seq = s.seq.fetch_add(1, std::memory_order_relaxed) + 1;
  std::uint64_t ts = now_ns();
  // A finding always has the stack of its call, stacks on or not: it is the first thing a user
  // reads, in the log and under the live message (findings are rare; the capture costs
  // microseconds once).
  std::uint32_t stack = 0;
  if (s.log.is_open() || (!sup && s.opts.warn_frames > 0)) {
    stack = c.ev().stack ? c.ev().stack
                         : capture_stack(s.opts.stacks > 0 ? static_cast<int>(s.opts.stacks)
                                                           : kFindingFrames);
    if (!stack) stack = sup.stack;
  }
  if (s.log.is_open())
    write_finding_record(c, f, action, res, args, seq, ts, stack, sup ? sup.text.c_str() : nullptr);
  if (!sup) print_finding(f, action, res, api_name(c.api()), true, stack);
  if (action == Action::Abort) {
    diag_line(LogLevel::Error, "strict mode: aborting at the first finding (CUMEMGUARD_MODE=strict)");
    exit_summary(ExitHow::Abort);
    std::abort();
  }
}

void report_finding_without_call(Finding f, const char *where, bool print, std::uint32_t stack) {
  State &s = state();
  s.findings[static_cast<std::size_t>(f.cls)].fetch_add(1, std::memory_order_relaxed);
  status_findings();
  const std::uint64_t seq = s.seq.fetch_add(1, std::memory_order_relaxed) + 1;
  write_finding_without_call(f, where, seq, now_ns(), stack);
  if (print) print_finding(f, Action::Forward, 0, where, /*from_call=*/false);
}

}  // namespace cmg::shim

// Stage 1 at load: parse the options early (cheap, no files), so that a bad value is reported
// once even if the program never calls CUDA, and policies that act on the environment at load
// (the PyTorch allocator variable) run before any library reads it.
extern "C" __attribute__((visibility("hidden"))) int cmg_dlsym_ready;
extern "C" int __cxa_atexit(void (*fn)(void *), void *arg, void *dso_handle);

namespace {

void final_summary(void *) {
  cmg::shim::say_load_findings_at_exit();
  cmg::shim::exit_summary(cmg::shim::ExitHow::Exit);
}

// Whether the shim was loaded with the program (LD_PRELOAD, or a library it links), not by a later
// dlopen: such objects come before libc in the loader's list, those dlopen'ed after it.
bool loaded_with_program() {
  struct Find {
    std::uintptr_t self;
    int at = 0, self_at = -1, libc_at = -1;
  } find{reinterpret_cast<std::uintptr_t>(&final_summary)};
  dl_iterate_phdr(
      [](dl_phdr_info *info, std::size_t, void *p) {
        auto &f = *static_cast<Find *>(p);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto &ph = info->dlpi_phdr[i];
          const std::uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && f.self >= lo && f.self < lo + ph.p_memsz) f.self_at = f.at;
        }
        const char *name = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
        if (f.libc_at < 0 && name && std::strncmp(name, "/libc.so", 8) == 0) f.libc_at = f.at;
        ++f.at;
        return 0;
      },
      &find);
  return find.self_at >= 0 && find.libc_at >= 0 && find.self_at < find.libc_at;
}

bool g_summary_at_exit = false;

}  // namespace

__attribute__((constructor)) static void cmg_load() {
  __atomic_store_n(&cmg_dlsym_ready, 1, __ATOMIC_RELEASE);  // loader.cpp: instrumented code may run
  if (cmg::shim::disabled()) return;
  // The exit summary must come after every library's destructor: a preloaded library is finalised
  // early (right after the program), and the program's libraries free CUDA memory from their
  // destructors after it (tests/reliability life-library-dtor). Exit handlers run last-registered
  // first, and __libc_start_main registers the loader's finaliser (every destructor) only after
  // the constructors of the libraries loaded with the program ran: a handler registered here, tied
  // to no library, runs after all destructors. What it uses was leaked on purpose and is still
  // there. A shim dlopen'ed later would register after the finaliser (its handler would run before
  // every destructor): it writes the summary from its destructor instead, as a library must.
  if (loaded_with_program()) {
    __cxa_atexit(final_summary, nullptr, nullptr);
    g_summary_at_exit = true;
  }
  cmg::shim::exiting_at_load();
  cmg::shim::options_ready();
  cmg::shim::status_loaded();
  cmg::shim::on_load();
  cmg::shim::sanitizer_exit_install();
  // Before any CUDA call: the signal must never end the program, whenever it comes.
  cmg::shim::snapshot_signal_install();
}

// The program's destructors ran, its libraries' have not yet (a preloaded library is finalised
// early): the held frees are closed now, so that those destructors' frees go to the driver (what
// was held stays held and goes back with the process). The log's buffered lines are written now,
// in case a later destructor crashes or hangs. No exit handler is registered for this (only the
// summary's): past 32 of them glibc frees a block of its list at exit, on the exiting thread.
__attribute__((destructor)) static void cmg_unload() {
  // A process that never called CUDA has nothing to close or write (and nothing may be created
  // now: the exit path allocates nothing).
  if (cmg::shim::disabled() || !cmg::shim::active()) return;
  cmg::shim::exit_begun();
  cmg::shim::held().close();
  if (!g_summary_at_exit) {
    cmg::shim::exit_summary(cmg::shim::ExitHow::Exit);
  } else {
    cmg::shim::state().log.flush();
  }
}
