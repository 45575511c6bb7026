// SPDX-License-Identifier: Apache-2.0
// The shim's process-wide state and the pieces every hook uses: two-stage init, the re-entry
// guard, event stamping (seq, time, thread, stack), call records, findings and decisions.
// Hooks stay thin: they call into this and into policy/.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "boundaries.h"
#include "capture_model.h"
#include "cuda_api.h"
#include "device_use.h"
#include "errors.h"
#include "event.h"
#include "eventlog.h"
#include "loader.h"
#include "nccl_holds.h"
#include "options.h"
#include "tracker.h"
#include "transport.h"

namespace cmg::shim {

// Thread-local variables read on every intercepted call use the initial-exec TLS model: the shim
// is loaded by LD_PRELOAD (so its TLS is part of the static block anyway), and the default model
// for a shared library calls __tls_get_addr on each access (measured: about 130 instructions per
// cuMemAlloc/cuMemFree pair, docs/performance.md). This marks the library STATIC_TLS: loaded later
// with dlopen() instead, its whole TLS block (under 600 bytes) comes from glibc's static TLS
// reserve, which has room for it unless other such libraries took it.
#define CMG_HOT_TLS thread_local __attribute__((tls_model("initial-exec")))

// Calls per API, counted on every intercepted call. One counter per API shared by all threads
// would be a cache line that every allocating thread writes; each thread counts in one of
// kStripes stripes instead (its own cache lines), and readers add the stripes up.
class CallCounts {
 public:
  // The first kOwned threads each get a stripe of their own, which only they write: a plain
  // load and store, no locked read-modify-write on the call path (a `lock add` costs about as
  // much as the rest of the count). Later threads share the last kShared stripes.
  void add(Api a) {
    const std::size_t i = stripe();
    auto &n = stripes_[i].n[static_cast<std::size_t>(a)];
    if (i < kOwned)
      n.store(n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    else
      n.fetch_add(1, std::memory_order_relaxed);
  }
  std::uint64_t get(std::size_t api) const {
    std::uint64_t sum = 0;
    for (const Stripe &s : stripes_) sum += s.n[api].load(std::memory_order_relaxed);
    return sum;
  }
  void reset() {
    for (Stripe &s : stripes_)
      for (auto &n : s.n) n.store(0, std::memory_order_relaxed);
  }

 private:
  static constexpr std::size_t kOwned = 128, kShared = 16, kStripes = kOwned + kShared;
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> n[kApiCount]{};
  };
  // The thread's stripe + 1 (0 until its first call): initial-exec TLS, read inline.
  static CMG_HOT_TLS inline std::size_t t_stripe = 0;
  static std::size_t stripe_slow();
  static std::size_t stripe() {
    const std::size_t m = t_stripe;
    return m ? m - 1 : stripe_slow();
  }
  Stripe stripes_[kStripes];
};

struct State {
  Options opts;
  ByteCounters counters;
  LinearModel linear;
  VmmModel vmm{counters};
  CaptureModel capture;
  Transport transport;
  NcclHolds nccl;  // registrations, windows, multicast bindings, suspended and imported ranges
  Boundaries boundaries;  // sleeps and wake-ups in progress (resident.h)
  DeviceUse devices;      // the devices this process uses (resident.h)
  EventLog log;
  std::atomic<std::uint64_t> seq{0};
  CallCounts calls;
  std::atomic<std::uint64_t> findings[kFindingClassCount]{};
  std::atomic<std::int64_t> warned{0};
  std::uint64_t start_mono_ns = 0;
  std::uint64_t start_unix_ns = 0;
  int rank = -1;
  // Who writes the last records (the summary and `end`): claimed once by the exit path or the
  // crash handler (exiting.h, LastRecords).
  std::atomic<int> last_records{0};
};

// The state, created on first use and never destroyed (frees from static destructors after main()
// returns must still be understood). Inline: every hook reaches it several times per call.
extern std::atomic<State *> g_state;
State &state_slow();
inline State &state() {
  State *s = g_state.load(std::memory_order_acquire);
  return s ? *s : state_slow();
}

// Stage 1: options parsed (constructor or first use). Cheap; never opens files.
bool options_ready();
// The options as parsed from the environment at stage 1 (values, sources, problems).
const ParsedOptions &parsed_options();

// Stage 2 ("active"): the first intercepted CUDA/NCCL call. Opens the log. A process that never
// calls CUDA stays silent and writes nothing.
extern std::atomic<bool> g_active;
void activate_slow();
inline bool active() { return g_active.load(std::memory_order_acquire); }
inline void activate() {
  if (!active()) activate_slow();
}

std::uint64_t now_ns();  // since the log started
extern CMG_HOT_TLS std::uint32_t t_tid;
std::uint32_t thread_id_slow();
inline std::uint32_t thread_id() { return t_tid ? t_tid : thread_id_slow(); }

// Re-entry guard: a runtime call that reaches the driver underneath is recorded once, under the
// name the program called (the runtime hook), not again by the driver wrapper.
class ReentryGuard {
 public:
  // hold=false: only asks whether this is an outermost call, without hiding what runs inside it
  // (NCCL's own driver calls during communicator init are the program's memory traffic too).
  explicit ReentryGuard(bool hold = true) : held_(hold), outermost_(depth_ == 0) {
    if (held_) ++depth_;
  }
  ~ReentryGuard() {
    if (held_) --depth_;
  }
  bool outermost() const { return outermost_; }
  static bool inside() { return depth_ > 0; }

 private:
  static CMG_HOT_TLS int depth_;
  bool held_;
  bool outermost_;
};

// Arguments of a call record, without allocation. Keys are the hooks' literals: their length is
// kept with them, so the record copies them without measuring each one (strlen per argument).
struct Args {
  enum class T : std::uint8_t { Hex, U, I, S };
  struct A {
    const char *k;
    T t;
    std::uint8_t kn;  // the key's length
    std::uint64_t v;
    const char *s;
  };
  A a[8];
  int n = 0;
  template <std::size_t N>
  Args &hex(const char (&k)[N], std::uint64_t v) {
    return add(k, N - 1, T::Hex, v, nullptr);
  }
  template <std::size_t N>
  Args &u(const char (&k)[N], std::uint64_t v) {
    return add(k, N - 1, T::U, v, nullptr);
  }
  template <std::size_t N>
  Args &i(const char (&k)[N], std::int64_t v) {
    return add(k, N - 1, T::I, static_cast<std::uint64_t>(v), nullptr);
  }
  template <std::size_t N>
  Args &s(const char (&k)[N], const char *v) {
    return add(k, N - 1, T::S, 0, v);
  }

 private:
  Args &add(const char *k, std::size_t kn, T t, std::uint64_t v, const char *s) {
    if (n < 8) a[n++] = A{k, t, static_cast<std::uint8_t>(kn), v, s};
    return *this;
  }
};

enum class StackWhen : std::uint8_t { Never, Sampled, Always };
// How a hooked call relates to the calls around it:
//  Hidden:   what runs underneath is not recorded again (a runtime call's driver calls), and the
//            call itself is recorded only when it is the outermost one;
//  Recorded: what runs underneath is recorded on its own (NCCL's allocations inside
//            ncclCommInitRank*);
//  Always:   recorded even inside another hooked call. VMM calls: the model must see every issue
//            of a handle value, or a later release of a re-issued value looks like a double release
//            (an allocator whose cudaMalloc returns VMM memory calls cuMemCreate inside cudaMalloc).
enum class Nested : std::uint8_t { Hidden, Recorded, Always };

// Prints a line on stderr at the given level (and logs it); defined in state.cpp.
void note(LogLevel level, std::string_view msg);

class Call;
// The first memory this process made on device `dev` (resident.cpp).
void device_first_memory(const Call &c, int dev);
// A tracked call begins on thread `tid`: the sleep or wake-up it ends, if one is open (resident.cpp).
void boundary_call_slow(Api api, std::uint32_t tid);

// One intercepted call: guard, activation, event stamp and timing.
class Call {
 public:
  // Inline, with what only a log or live stacks need out of line (observe): the common call (no
  // log) runs this in the hook itself, without a call's register saves (docs/performance.md).
  __attribute__((always_inline)) Call(Api api, StackWhen stack, Nested nested = Nested::Hidden)
      : guard_(nested != Nested::Recorded), api_(api) {
    if ((!guard_.outermost() && nested != Nested::Always) || disabled()) return;
    activate();
    State &s = state();
    if (s.opts.disable) return;
    tracked_ = true;
    s_ = &s;
    s.calls.add(api);
    // A sleep or wake-up this call ends is closed before the call is applied (its snapshot shows
    // the memory as the run left it).
    if (s.boundaries.open()) [[unlikely]] boundary_call_slow(api, thread_id());
    ev_.seq = s.seq.fetch_add(1, std::memory_order_relaxed) + 1;
    ev_.tid = thread_id();
    ev_.api = api_name(api);
    if (s.log.is_open() || s.opts.warn_frames > 0) [[unlikely]] observe(s, stack);
  }
  ~Call() = default;
  Call(const Call &) = delete;
  Call &operator=(const Call &) = delete;
  // Outermost call in an enabled shim: track it. Otherwise the hook just forwards.
  bool tracked() const { return tracked_; }
  // The state, read once by the constructor (a tracked call only).
  State &st() const { return *s_; }
  const EventRef &ev() const { return ev_; }
  Api api() const { return api_; }
  // A stack captured for the call after all (the flush policy captures one when stacks are off).
  void set_stack(std::uint32_t id) {
    if (!ev_.stack) ev_.stack = id;
  }

  struct Extra {
    int dev = -1;
    std::optional<MemKind> mem;
    std::int64_t delta = 0;
    bool skipped = false;
    bool deferred = false;
    const char *va_state = nullptr;  // VMM calls the driver refused: what the model knows of the range
  };
  // Writes the call record when there is an event log (checked inline: without a log this costs
  // three loads).
  __attribute__((always_inline)) void log(int res, const Args &args, const Extra &x) {
    if (!tracked_) return;
    if (res != 0) [[unlikely]] note_cuda_error(api_, res, ev_);
    if (x.delta > 0 && !s_->devices.seen(x.dev)) [[unlikely]] device_first_memory(*this, x.dev);
    // Said here, after the forwarded call, never inside the lookup that noticed it.
    if (const char *n = take_origin_note()) note(LogLevel::Warn, n);
    if (s_->log.is_open()) write_record(res, args, x);
  }
  __attribute__((always_inline)) void log(int res, const Args &args) { log(res, args, Extra{}); }

 private:
  void write_record(int res, const Args &args, const Extra &x);
  // The clock and the stack, for a log or a live finding's stack.
  __attribute__((noinline)) void observe(State &s, StackWhen stack);
  ReentryGuard guard_;
  Api api_;
  bool tracked_ = false;
  State *s_ = nullptr;
  EventRef ev_;
  std::uint64_t t0_ = 0;
};

// Return addresses captured at a finding when CUMEMGUARD_STACKS is 0.
inline constexpr int kFindingFrames = 16;

// Writes the finding record, counts it, prints it (rate-limited) and, for Action::Abort, aborts
// after flushing the log. `res` is what the caller gets.
void report_finding(const Call &c, Finding f, Action action, int res, const Args &args);

// A finding that belongs to no call (the environment at load, leaks): counted, printed when it is
// an error, and written to the log (kept until the log opens).
void report_finding_without_call(Finding f, const char *where, bool print,
                                 std::uint32_t stack = 0);

// A one-line diagnostic on stderr ("cumemguard: warning: …") and a `note` record in the log.
void note(LogLevel level, std::string_view msg);

// The current context's device, or -1 (no context on this thread, driver not loaded: P27). Asked
// of the driver once per thread and remembered (policy/device_cache.h) until one of the calls below.
int current_device();
// This thread's current context may have changed (cuCtxSetCurrent, Push, Pop, Create: the hooks of
// hooks_context.cpp, and the shim's own borrowing of a primary context).
void forget_current_device();
// Any thread's may have (cuCtxDestroy, a primary context released or reset; a forked child).
void forget_current_device_everywhere();

}  // namespace cmg::shim
