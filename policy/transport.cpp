// SPDX-License-Identifier: Apache-2.0
// Transport registry, flush classification and flush policy (see transport.h).
#include "transport.h"

#include "text.h"

#include <cstdio>
#include <new>

namespace cmg {
namespace {

// The registry whose run_flush() this thread is inside (nullptr: none).
thread_local const Transport *t_flushing = nullptr;

int slot_of(int dev) {
  return dev >= 0 && dev < Transport::kMaxDevices ? dev : Transport::kMaxDevices;
}

}  // namespace

// ---- registry ----------------------------------------------------------------------------------

void Transport::wait_for_flushes() {
  // Every flush request from now on declines (suppressed_ is published before this); then wait
  // for the flushes that already passed their check (each holds the lock shared until it is
  // done). A thread that turns suppression on from inside its own permitted flush cannot wait for
  // itself.
  if (!flushing_here()) {
    std::unique_lock lk(flush_mu_);  // taken only once every running flush is done
  }
}

bool Transport::recompute_locked() {
  // Quiet: every communicator the process made is live and suspended, none is being created or
  // resumed, none ended or failed, and no transport the shim cannot see was announced.
  const int live = live_.load(std::memory_order_relaxed);
  const bool quiet = live > 0 && suspended_n_ == live && creating_ == 0 && !unproven_;
  const bool on = sticky_.load(std::memory_order_relaxed) && !quiet;
  const bool was = suppressed_.exchange(on, std::memory_order_acq_rel);
  return on && !was;
}

bool Transport::set_suppressed(const EventRef &ev, bool external) {
  const bool was = sticky_.exchange(true, std::memory_order_acq_rel);
  {
    std::lock_guard lk(comm_mu_);
    if (external) unproven_ = true;
    else ++creating_;
    recompute_locked();
  }
  if (!was) {
    suppressed_by_ = ev;
    by_ready_.store(true, std::memory_order_release);
  }
  wait_for_flushes();
  return !was;
}

bool Transport::on_create_enter(const EventRef &ev) {
  return set_suppressed(ev, false);
}

void Transport::on_create_exit(std::span<const CommOnDevice> created, const EventRef &ev) {
  std::lock_guard lk(comm_mu_);
  if (creating_ > 0) --creating_;
  if (created.empty()) unproven_ = true;  // a failed setup proves nothing about its peers
  for (const CommOnDevice &c : created) {
    if (c.comm == 0 || !comms_.emplace(c.comm, Comm{c.dev, ev, {}, false}).second) continue;
    ended_.erase(c.comm);  // the pointer is a communicator again
    live_dev_[slot_of(c.dev)].fetch_add(1, std::memory_order_relaxed);
    live_.fetch_add(1, std::memory_order_relaxed);
    created_total_.fetch_add(1, std::memory_order_relaxed);
  }
  recompute_locked();
}

int Transport::on_destroy(std::uint64_t comm, const EventRef &ev) {
  std::lock_guard lk(comm_mu_);
  auto it = comms_.find(comm);
  int dev = -1;
  if (it != comms_.end()) {
    dev = it->second.dev;
    if (it->second.suspended.known() && !it->second.resuming) --suspended_n_;
    comms_.erase(it);
    live_dev_[slot_of(dev)].fetch_sub(1, std::memory_order_relaxed);
    live_.fetch_sub(1, std::memory_order_relaxed);
    // An empty communicator list does not prove the transports are quiet (sticky).
    unproven_ = true;
  }
  // Ended, whether it was seen created or not (made before the shim): ending it again is the
  // same double destroy.
  if (comm && ended_.insert_or_assign(comm, ev).second) {
    ended_order_.push_back(comm);
    if (ended_order_.size() > kEndedKept) {
      ended_.erase(ended_order_.front());
      ended_order_.pop_front();
    }
  }
  recompute_locked();
  return dev;
}

bool Transport::suppress_external(const EventRef &ev) {
  return set_suppressed(ev, true);
}

bool Transport::on_suspended(std::uint64_t comm, const EventRef &ev) {
  std::lock_guard lk(comm_mu_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return false;
  if (!it->second.suspended.known() || it->second.resuming) ++suspended_n_;
  it->second.suspended = ev;
  it->second.resuming = false;
  recompute_locked();
  return true;
}

void Transport::on_resume_enter(std::uint64_t comm) {
  bool wait = false;
  {
    std::lock_guard lk(comm_mu_);
    auto it = comms_.find(comm);
    if (it == comms_.end() || !it->second.suspended.known() || it->second.resuming) return;
    it->second.resuming = true;
    --suspended_n_;
    recompute_locked();
    wait = suppressed_.load(std::memory_order_relaxed);
  }
  if (wait) wait_for_flushes();
}

void Transport::on_resume_exit(std::uint64_t comm, bool ok) {
  std::lock_guard lk(comm_mu_);
  auto it = comms_.find(comm);
  if (it == comms_.end() || !it->second.resuming) return;
  it->second.resuming = false;
  if (ok)
    it->second.suspended = {};
  else
    ++suspended_n_;
  recompute_locked();
}

int Transport::suspended_count() const {
  std::lock_guard lk(comm_mu_);
  return suspended_n_;
}

std::optional<Transport::CommState> Transport::comm_state(std::uint64_t comm) const {
  std::lock_guard lk(comm_mu_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) return std::nullopt;
  CommState st;
  st.dev = it->second.dev;
  st.created = it->second.created;
  if (!it->second.resuming) st.suspended = it->second.suspended;
  return st;
}

std::optional<EventRef> Transport::ended(std::uint64_t comm) const {
  std::lock_guard lk(comm_mu_);
  auto it = ended_.find(comm);
  if (it == ended_.end()) return std::nullopt;
  return it->second;
}

int Transport::live_on(int dev) const {
  return live_dev_[slot_of(dev)].load(std::memory_order_relaxed);
}

std::vector<std::pair<int, int>> Transport::live_by_device() const {
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i <= kMaxDevices; ++i)
    if (int n = live_dev_[i].load(std::memory_order_relaxed))
      out.emplace_back(i == kMaxDevices ? -1 : i, n);
  return out;
}

int Transport::device_of(std::uint64_t comm) const {
  std::lock_guard lk(comm_mu_);
  auto it = comms_.find(comm);
  return it == comms_.end() ? -1 : it->second.dev;
}

EventRef Transport::suppressed_by() const {
  return by_ready_.load(std::memory_order_acquire) ? suppressed_by_ : EventRef{};
}

bool Transport::flushing_here() const {
  return t_flushing == this;
}

bool Transport::run_flush(void (*flush)(void *), void *arg) {
  if (!flush) return false;
  if (flushing_here()) {
    // A request from inside this thread's own permitted flush: the lock is already held shared.
    if (suppressed()) {
      flushes_declined_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    flush(arg);
    flushes_run_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  std::shared_lock lk(flush_mu_);
  if (suppressed()) {
    flushes_declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  struct Scope {
    const Transport *prev;
    explicit Scope(const Transport *t) : prev(t_flushing) { t_flushing = t; }
    ~Scope() { t_flushing = prev; }
  } scope(this);
  flush(arg);
  flushes_run_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void Transport::reset() {
  new (&flush_mu_) std::shared_mutex();
  new (&comm_mu_) std::mutex();
  comms_.clear();
  ended_.clear();
  ended_order_.clear();
  suspended_n_ = 0;
  creating_ = 0;
  // The parent's communicators are not the child's: what they did proves nothing here.
  unproven_ = true;
  live_.store(0);
  for (auto &d : live_dev_) d.store(0);
  suppressed_.store(sticky_.load());
}

// ---- classification ----------------------------------------------------------------------------

namespace {

// PyTorch's flush entry points (nccl-and-cleanup.md 4.2, 4.4; local symbols in the 2.11 wheel).
// DeviceCachingAllocator::emptyCache is inlined in 2.11 and out of line in other releases.
constexpr std::string_view kBuiltinFlush[] = {
    "NativeCachingAllocator::emptyCache",
    "CudaMallocAsyncAllocator::emptyCache",
    "DeviceCachingAllocator::emptyCache",
};

// PyTorch's allocation path that releases cached blocks to satisfy an allocation (4.3): the OOM
// retry and the garbage collection. Whether DeviceCachingAllocator::malloc stays out of line is
// not known for every release, so the Native entry points that call it are listed too.
constexpr std::string_view kBuiltinRetry[] = {
    "DeviceCachingAllocator::malloc",  "DeviceCachingAllocator::alloc_block",
    "NativeCachingAllocator::malloc",  "NativeCachingAllocator::allocate",
    "release_available_cached_blocks", "garbage_collect_cached_blocks",
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool contains_any(std::string_view name, const std::vector<std::string> &pats) {
  if (name.empty()) return false;
  for (const std::string &p : pats)
    if (name.find(p) != std::string_view::npos) return true;
  return false;
}

std::string_view basename(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

}  // namespace

std::span<const std::string_view> FlushPatterns::builtin_flush() {
  return kBuiltinFlush;
}
std::span<const std::string_view> FlushPatterns::builtin_retry() {
  return kBuiltinRetry;
}

FlushPatterns FlushPatterns::from_option(std::string_view extra) {
  FlushPatterns p;
  for (std::string_view s : kBuiltinFlush) p.flush_.emplace_back(s);
  for (std::string_view s : kBuiltinRetry) p.retry_.emplace_back(s);
  while (!extra.empty()) {
    const auto comma = extra.find(',');
    std::string_view item = trim(extra.substr(0, comma));
    extra = comma == std::string_view::npos ? std::string_view() : extra.substr(comma + 1);
    if (!item.empty() && item.front() == '!') {
      item = trim(item.substr(1));
      if (!item.empty()) p.retry_.emplace_back(item);
    } else if (!item.empty()) {
      p.flush_.emplace_back(item);
    }
  }
  return p;
}

FrameKind FlushPatterns::classify(std::string_view mangled, std::string_view demangled,
                                  std::string_view module_path) const {
  // NCCL's frees (destroy, abort, lazy connect, failure cleanup) are its own buffers
  // (nccl-and-cleanup.md 1.7), reached from libnccl's text.
  if (basename(module_path).substr(0, 7) == "libnccl") return FrameKind::Nccl;
  if (contains_any(demangled, retry_) || contains_any(mangled, retry_)) return FrameKind::Retry;
  if (contains_any(demangled, flush_) || contains_any(mangled, flush_)) return FrameKind::Flush;
  return FrameKind::Other;
}

FlushVerdict classify_stack(std::span<const FrameKind> frames) {
  FlushVerdict v;
  bool nccl = false, retry = false;
  const int n = static_cast<int>(frames.size());
  for (int i = 0; i < n; ++i) {
    switch (frames[i]) {
      case FrameKind::Nccl:
        nccl = true;
        break;
      case FrameKind::Retry:
        retry = true;
        break;
      case FrameKind::Flush:
        if (v.flush_frame < 0) v.flush_frame = i;
        break;
      case FrameKind::Other:
        break;
    }
  }
  if (nccl) {
    v.why = FlushVerdict::Why::FromNccl;
  } else if (retry) {
    v.why = FlushVerdict::Why::RetryFrame;
  } else if (v.flush_frame >= 0) {
    v.why = FlushVerdict::Why::Flush;
    int top = v.flush_frame;
    while (top + 1 < n && frames[top + 1] == FrameKind::Flush) ++top;
    v.caller_frame = top + 1 < n ? top + 1 : -1;
  }
  return v;
}

// ---- policy ------------------------------------------------------------------------------------

Action decide_flush(const Options &o, FlushTarget target) {
  const auto override_ = o.action[static_cast<std::size_t>(FindingClass::OpportunisticFlush)];
  if (o.action_for(FindingClass::OpportunisticFlush) == Action::Abort) return Action::Abort;
  if (override_ == ActionOverride::Forward) return Action::Forward;
  if (o.opportunistic == FlushPolicy::Defer)
    return target == FlushTarget::Trim ? Action::Skip : Action::Defer;
  return Action::Forward;
}

Finding flush_finding(const FlushEvent &e) {
  Finding f;
  f.cls = FindingClass::OpportunisticFlush;
  const bool trim = e.target == FlushTarget::Trim;
  std::string msg(e.api);
  if (!trim) msg += " of " + human_bytes(e.bytes);
  msg += " in a cache flush (";
  msg.append(e.flush_frame.empty() ? std::string_view("?") : e.flush_frame);
  msg += ") ";
  const bool external =
      e.suppressed_by.api && std::string_view(e.suppressed_by.api).rfind("cumemguard_", 0) == 0;
  if (e.live > 0)
    msg += "while " + std::to_string(e.live) +
           (e.live == 1 ? " NCCL communicator is" : " NCCL communicators are") + " live";
  else if (external)
    msg += "after the program announced a transport (cumemguard_suppress_opportunistic_cleanup)";
  else
    msg += "after NCCL was set up (suppression is sticky; no communicator is live now)";
  msg += ": ";
  switch (e.action) {
    case Action::Forward:
      if (e.over_limit)
        msg += "forwarded and took " + human_ns(e.blocked_ns) +
               ", because holding it would pass "
               "CUMEMGUARD_DEFER_LIMIT (" +
               human_bytes(e.defer_limit) + "; " + human_bytes(e.held_bytes) + " held)";
      else if (trim)
        msg += "took " + human_ns(e.blocked_ns) +
               "; a trim does not wait for the device itself, "
               "the synchronization PyTorch makes before it does (docs/transport.md)";
      else
        msg += "took " + human_ns(e.blocked_ns) +
               " (a synchronizing free waits for all work on "
               "the device); remove the flush from the per-iteration path or run it through "
               "cumemguard_maybe_empty_cache()";
      break;
    case Action::Defer:
      msg += "held back (" + human_bytes(e.held_bytes) +
             " deferred); released at out-of-memory, "
             "by cumemguard_release_deferred(), past CUMEMGUARD_DEFER_LIMIT or at exit";
      break;
    case Action::Skip:
      msg +=
          "not made: a pool trim returns only memory already free in the pool, which keeps it "
          "for its next allocations";
      break;
    case Action::Abort:
      msg += "strict mode";
      break;
  }
  f.msg = std::move(msg);
  f.bytes = e.bytes;
  f.blocked_ns = e.blocked_ns;
  f.state_json = "{\"flush_frame\":\"" + json_escape(e.flush_frame) + "\",\"site\":\"" +
                 json_escape(e.site) + "\",\"target\":\"" + (trim ? "trim" : "free") +
                 "\",\"live\":" + std::to_string(e.live) +
                 ",\"held_bytes\":" + std::to_string(e.held_bytes) +
                 ",\"over_limit\":" + (e.over_limit ? "true" : "false") + "}";
  if (e.suppressed_by.known()) f.related.push_back(Related{"suppressed from", e.suppressed_by});
  return f;
}

}  // namespace cmg
