// SPDX-License-Identifier: Apache-2.0
// Snapshots of what is resident (docs/log-format.md, `snapshot`), and CUMEMGUARD_SNAPSHOT_SIGNAL.
//
// A snapshot visits the models in place: each linear shard and then the VMM model under its own
// lock, adding every object to a table of fixed size allocated once (policy/resident_table.h), so
// nothing is allocated under a model's lock however many objects are live. When the table fills,
// its rows are written out as one record (a part) and the visit goes on: the report adds the parts
// of a snapshot up. Records are written under the model's lock, as the leak records at exit are
// (the log's lock nests inside the models'). A snapshot is not one instant across the models: each
// shard and the VMM model are read consistently, one after the other, while other threads go on.
//
// The signal handler only counts the signal and writes one byte to a pipe (async-signal-safe);
// the shim's snapshot thread, started at the first CUDA call, reads it and takes the snapshot.
// Signals that arrive while one is written are taken together by the next.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

#include "exiting.h"
#include "lock_within.h"
#include "owned_fd.h"
#include "resident.h"
#include "resident_table.h"
#include "stacks.h"
#include "threads.h"

extern "C" void __tsan_init() __attribute__((weak));

namespace cmg::shim {
namespace {

// Rows per record: a row is at most about 60 bytes, so a part is a line of about 60 KB.
constexpr std::size_t kChunkRows = 1024;
// A snapshot asked for at run time waits this long at most for the VMM model's lock.
constexpr std::uint64_t kSnapshotPatienceNs = 5'000'000'000;

std::mutex g_snap_mu;  // one snapshot at a time; reinitialised in a forked child
std::atomic<std::uint64_t> g_ids{0};
std::atomic<std::int64_t> g_automatic{0};
std::atomic<bool> g_limit_said{false};

const char *trigger_name(SnapshotTrigger t) {
  switch (t) {
    case SnapshotTrigger::Sleep:
      return "sleep";
    case SnapshotTrigger::Wake:
      return "wake-up";
    case SnapshotTrigger::Boundary:
      return "boundary";
    case SnapshotTrigger::Suspend:
      return "suspend";
    case SnapshotTrigger::Destroy:
      return "destroy";
    case SnapshotTrigger::Signal:
      return "signal";
    case SnapshotTrigger::Api:
      return "api";
  }
  return "?";
}

// One row as a JSON array in a fixed buffer: [dev,"kind","state",stack,graph,count,bytes]. The
// kind and state are the shim's own words (no escaping needed).
class RowText {
 public:
  template <class T>
  RowText &num(T v) {
    sep();
    const auto r = std::to_chars(buf_ + len_, buf_ + kCap - 1, v);
    if (r.ec == std::errc()) len_ = static_cast<std::size_t>(r.ptr - buf_);
    return *this;
  }
  RowText &text(std::string_view s) {
    sep();
    if (len_ + s.size() + 3 < kCap) {
      buf_[len_++] = '"';
      std::memcpy(buf_ + len_, s.data(), s.size());
      len_ += s.size();
      buf_[len_++] = '"';
    }
    return *this;
  }
  std::string_view done() {
    if (len_ < kCap) buf_[len_++] = ']';
    return std::string_view(buf_, len_);
  }

 private:
  static constexpr std::size_t kCap = 192;  // 5 numbers of at most 20 digits, two short words
  void sep() {
    const char c = len_ == 0 ? '[' : ',';
    if (len_ < kCap - 1) buf_[len_++] = c;
  }
  char buf_[kCap];
  std::size_t len_ = 0;
};

void put_row(JsonLine &j, const ResidentRow &r) {
  RowText t;
  t.num(r.key.dev)
      .text(mem_kind_name(r.key.kind))
      .text(residence_name(r.key.state))
      .num(r.key.stack)
      .num(r.key.graph)
      .num(r.count)
      .num(r.bytes);
  j.elem_raw(t.done());
}

// ---- the signal --------------------------------------------------------------------------

struct SignalPipe {
  OwnedFd rd, wr;
};
SignalPipe g_pipe;  // set before the handler is installed; the handler only reads it
std::atomic<bool> g_thread_started{false};
std::atomic<std::uint64_t> g_signals{0};
// A forked child whose parent took snapshots: its thread runs from the fork on, before the child's
// first CUDA call (a data-loader worker may never make one), and the signal is taken there too.
std::atomic<bool> g_forked_thread{false};

int signal_number(SnapshotSignal s) {
  switch (s) {
    case SnapshotSignal::Off:
      return 0;
    case SnapshotSignal::Usr1:
      return SIGUSR1;
    case SnapshotSignal::Usr2:
      return SIGUSR2;
    case SnapshotSignal::Urg:
      return SIGURG;
    case SnapshotSignal::Winch:
      return SIGWINCH;
    case SnapshotSignal::Pwr:
      return SIGPWR;
    case SnapshotSignal::Hup:
      return SIGHUP;
  }
  return 0;
}

const char *signal_label(SnapshotSignal s) {
  switch (s) {
    case SnapshotSignal::Off:
      return "";
    case SnapshotSignal::Usr1:
      return "SIGUSR1";
    case SnapshotSignal::Usr2:
      return "SIGUSR2";
    case SnapshotSignal::Urg:
      return "SIGURG";
    case SnapshotSignal::Winch:
      return "SIGWINCH";
    case SnapshotSignal::Pwr:
      return "SIGPWR";
    case SnapshotSignal::Hup:
      return "SIGHUP";
  }
  return "";
}

// Async-signal-safe: an atomic add, fstat and write on a non-blocking pipe (a full pipe already
// has a snapshot coming).
void on_snapshot_signal(int) {
  const int saved = errno;
  g_signals.fetch_add(1, std::memory_order_relaxed);
  // Before the first CUDA call there is no log and nothing to snapshot; a forked child of a
  // process that had them opens its own log at the snapshot.
  if (!active() && !g_forked_thread.load(std::memory_order_relaxed)) {
    errno = saved;
    return;
  }
  const OwnedFd &w = g_pipe.wr;
  if (w.valid() && w.still_ours()) {
    const char c = 1;
    const ssize_t n = ::write(w.fd, &c, 1);
    (void)n;
  }
  errno = saved;
}

bool make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
  // The thread blocks on the read end; the handler never blocks on the write end.
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) & ~O_NONBLOCK);
  g_pipe.rd = OwnedFd::adopt(fds[0]);
  g_pipe.wr = OwnedFd::adopt(fds[1]);
  if (g_pipe.rd.valid() && g_pipe.wr.valid()) return true;
  g_pipe.rd.close();
  g_pipe.wr.close();
  return false;
}

void *snapshot_thread(void *) {
  const char *label = signal_label(state().opts.snapshot_signal);
  for (;;) {
    char b[64];
    if (!g_pipe.rd.still_ours()) return nullptr;  // the host closed or reused the number
    const ssize_t n = ::read(g_pipe.rd.fd, b, sizeof b);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return nullptr;
    // A forked child's first use of the shim: its own log (NAME.<pid>), as at a first CUDA call.
    if (!active()) activate();
    snapshot_requested(label, SnapshotTrigger::Signal);
  }
}

}  // namespace

std::uint64_t take_snapshot(const char *label, SnapshotTrigger trigger, bool automatic,
                            const SnapshotRun *run) {
  // Never once exit began: the exit path allocates nothing and waits on nothing without a bound.
  if (disabled() || !active() || exit_in_progress()) return 0;
  State &s = state();
  if (s.opts.disable || !s.log.is_open()) return 0;
  if (automatic) {
    if (s.opts.snapshots <= 0) return 0;
    if (g_automatic.fetch_add(1, std::memory_order_relaxed) >= s.opts.snapshots) {
      if (!g_limit_said.exchange(true))
        note(LogLevel::Info, "snapshots: " + std::to_string(s.opts.snapshots) +
                                 " taken at boundaries (CUMEMGUARD_SNAPSHOTS); later boundaries "
                                 "are still checked, without a snapshot");
      return 0;
    }
  }
  ReentryGuard guard;  // nothing below calls CUDA; nothing is recorded as the program's
  // The caller of cumemguard_snapshot (or of cumemguard.snapshot in Python): where it was asked.
  const std::uint32_t stack =
      trigger == SnapshotTrigger::Api
          ? capture_stack(s.opts.stacks > 0 ? static_cast<int>(s.opts.stacks) : kFindingFrames)
          : 0;
  std::lock_guard lk(g_snap_mu);
  static ResidentTable *table = new ResidentTable(kChunkRows);  // allocated once, kept
  const std::uint64_t id = g_ids.fetch_add(1, std::memory_order_relaxed) + 1;
  // Placed among the events by the last seq issued before it (it takes none of its own: the
  // report releases events in seq order, and a seq no event has would hold them back).
  const std::uint64_t after_seq = s.seq.load(std::memory_order_relaxed);
  const std::uint64_t t0 = now_ns();
  std::uint64_t part = 0, objects = 0;
  bool incomplete = false;
  auto write = [&](bool last) {
    LogLine j(s.log);
    j.ident("k", "snapshot").unum("id", id).unum("part", part);
    if (part == 0) {
      j.unum("after_seq", after_seq)
          .unum("ts", t0)
          .unum("tid", thread_id())
          .str("label", label ? label : "")
          .ident("trigger", trigger_name(trigger));
      if (stack) j.unum("stack", stack);
      if (run) {
        j.begin_object("run")
            .ident("what", run->what)
            .unum("seq", run->first.seq)
            .unum("tid", run->first.tid)
            .unum("ranges", run->ranges)
            .unum("bytes", run->bytes);
        if (run->failed) j.boolean("failed", true);
        j.end_object();
      }
    }
    j.begin_array("rows");
    table->drain([&](const ResidentRow &r) { put_row(j, r); });
    j.end_array();
    if (last) {
      j.boolean("end", true).unum("objects", objects).unum("dur", now_ns() - t0);
      if (incomplete) j.boolean("incomplete", true);
    }
    j.commit(now_ns());
    ++part;
  };
  auto add = [&](const ResidentKey &k, std::uint64_t bytes) {
    ++objects;
    if (table->add(k, bytes)) return;
    write(false);
    table->add(k, bytes);
  };
  // Memory made on a thread while its capture was open is that capture's graph's (PyTorch's graph
  // private pools: cudaMalloc in relaxed mode, capture_model.h); `graph` names the capture.
  s.linear.for_each_live([&](const LinearRec &r) {
    add(ResidentKey{r.dev, r.kind, Residence::Live, r.alloc.stack, r.capture}, r.size);
  });
  // Graph allocations a launch made and nothing freed since (allocation nodes: a captured
  // cudaMallocAsync, cudaGraphAddMemAllocNode), owned by the graph's memory pool; the linear model
  // never holds them. `graph` is the capture that made the node (0 for an explicit node: the kind
  // `graph` tells it).
  incomplete |= !s.capture.for_each_live_within(
      [&](const GraphAlloc &a) {
        add(ResidentKey{a.dev, MemKind::Graph, Residence::Live, a.node.stack, a.capture}, a.size);
      },
      kSnapshotPatienceNs);
  VmmCounts counts;
  incomplete |= !s.vmm.visit_within(
      kSnapshotPatienceNs,
      [&](const PhysAlloc &a) {
        add(ResidentKey{a.dev(), MemKind::Vmm, a.map_count ? Residence::Mapped : Residence::Held,
                        a.created.stack, 0},
            a.size);
      },
      [&](const Reservation &r) {
        for (const auto &[off, sl] : r.asleep)
          add(ResidentKey{-1, MemKind::Vmm, Residence::Asleep, sl.unmapped.stack, 0}, sl.size);
      },
      counts);
  write(true);
  return id;
}

void snapshot_signal_install() {
  if (disabled()) return;
  State &s = state();
  const int sig = signal_number(s.opts.snapshot_signal);
  if (s.opts.disable || !sig) return;
  if (!make_pipe()) {
    note(LogLevel::Warn, std::string("CUMEMGUARD_SNAPSHOT_SIGNAL: no pipe for the snapshot "
                                     "thread (") +
                             std::strerror(errno) + "); the signal is left as it was");
    return;
  }
  struct sigaction sa {
  }, old{};
  sa.sa_handler = on_snapshot_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(sig, &sa, &old);
  if (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN)
    note(LogLevel::Warn, std::string("CUMEMGUARD_SNAPSHOT_SIGNAL: ") +
                             signal_label(s.opts.snapshot_signal) +
                             " had a handler already; it now takes snapshots instead");
}

void snapshot_signal_start() {
  if (!g_pipe.rd.valid() || g_thread_started.exchange(true)) return;
  const int rc = start_detached_quiet(snapshot_thread, nullptr, "cmg-snapshot");
  if (rc != 0)
    note(LogLevel::Warn, std::string("CUMEMGUARD_SNAPSHOT_SIGNAL: no snapshot thread (") +
                             std::strerror(rc) + "); the signal is counted, no snapshot taken");
}

void resident_fork_child() {
  new (&g_snap_mu) std::mutex();
  g_ids.store(0);
  g_automatic.store(0);
  g_limit_said.store(false);
  boundaries().fork_child();
  device_use().fork_child();
  // The parent's pipe and thread are the parent's: the child gets its own pipe now, and its own
  // thread now when the parent had one (else at its first CUDA call). No lock of the shim is held
  // here; pthread_create allocates its stack and thread state, and glibc has reset its
  // allocator's and thread-stack locks before fork handlers run. Under ThreadSanitizer a forked
  // child of a threaded parent cannot start a thread ("not supported"): its signals are counted,
  // not taken.
  const bool had_thread = g_thread_started.exchange(false);
  g_forked_thread.store(false);
  if (g_pipe.rd.valid()) {
    g_pipe.rd.close();
    g_pipe.wr.close();
    if (!__tsan_init && make_pipe() && had_thread) {
      g_thread_started.store(true);
      g_forked_thread.store(true);
      if (start_detached_quiet(snapshot_thread, nullptr, "cmg-snapshot") != 0) {
        g_forked_thread.store(false);
        g_thread_started.store(false);  // tried again at the child's first CUDA call
      }
    }
  }
}

}  // namespace cmg::shim
