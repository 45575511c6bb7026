// SPDX-License-Identifier: Apache-2.0
// How each process ended, for the "What happened" block: its status, the fatal signal, the first
// CUDA errors (a sticky one poisons the context: every later call fails, so the first is the one
// that explains the crash), the memory lifecycle calls just before, and the VMM ranges asleep at
// the first sticky error (or at the end), the last sleep first with its stack, and whether any CUDA
// call worked at all (no driver: nothing was checked). It follows what is live only: reservations
// and their mapped ranges, and 8 calls.
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "report_model.h"

namespace cmg::report {
namespace {

constexpr std::size_t kLifecycleShown = 8;
constexpr std::size_t kErrorsKept = 32;  // the shim writes at most 32 distinct codes
constexpr std::size_t kAsleepShown = 16;

// Frees, unmaps, releases and address frees: what the stale call that crashes usually is.
bool lifecycle_call(const std::string &api) {
  return api.find("Free") != std::string::npos || api == "cuMemUnmap" || api == "cuMemRelease";
}

struct Range {
  std::uint64_t size = 0;
  bool mapped = true;
  std::uint64_t unmap_seq = 0;
  std::int64_t unmap_tid = 0;
  std::optional<std::uint64_t> unmap_stack;
};

struct Reservation {
  std::uint64_t size = 0;
  std::map<std::uint64_t, Range> ranges;  // by start address
};

}  // namespace

struct OutcomeTracker::Impl {
  // A ring of the last kLifecycleShown calls; slots are assigned over, so their strings keep
  // their capacity (frees are half the records of a log).
  std::array<LifeEvent, kLifecycleShown> ring;
  std::size_t ring_next = 0, ring_size = 0;
  std::vector<LifeEvent> recent() const {
    std::vector<LifeEvent> out;
    for (std::size_t i = 0; i < ring_size; ++i)
      out.push_back(ring[(ring_next + kLifecycleShown - ring_size + i) % kLifecycleShown]);
    return out;
  }
  std::vector<LifeEvent> before_error;
  bool have_sticky = false;
  // Strict mode's abort: the calls before it are the story; a call another thread made while
  // the process was dying (a higher seq, logged before the abort landed) is not.
  bool aborted = false;
  void remember(const LifeEvent &l) {
    ring[ring_next] = l;
    ring_next = (ring_next + 1) % kLifecycleShown;
    ring_size = std::min(ring_size + 1, kLifecycleShown);
  }
  std::vector<ErrorPoint> errors;
  std::optional<ErrorPoint> first_sticky;
  std::map<std::uint64_t, Reservation> reservations;
  // The reservations as they stood when the call that returned the first sticky error returned:
  // what the faulting kernel may have touched is what was asleep then, not what is asleep at the
  // end. Taken once every event that began before that return has been seen (`pending_until`).
  std::optional<std::map<std::uint64_t, Reservation>> at_error;
  std::optional<std::uint64_t> pending_until;

  Reservation *holding(std::uint64_t ptr) {
    auto it = reservations.upper_bound(ptr);
    if (it == reservations.begin()) return nullptr;
    --it;
    return ptr - it->first < it->second.size ? &it->second : nullptr;
  }

  void vmm(const Event &e, const Call &c) {
    // cuMemAddressReserve, cuMemAddressFree, cuMemMap, cuMemUnmap: all "cuMem...".
    if (c.res != 0 || c.skipped || !c.ptr || c.api.compare(0, 5, "cuMem") != 0) return;
    if (c.api == "cuMemAddressReserve") {
      if (c.size && *c.size) reservations[*c.ptr] = Reservation{*c.size, {}};
    } else if (c.api == "cuMemAddressFree") {
      reservations.erase(*c.ptr);
    } else if (c.api == "cuMemMap" && c.size) {
      Reservation *r = holding(*c.ptr);
      if (!r) return;
      // A new mapping replaces whatever slept in its span.
      auto it = r->ranges.lower_bound(*c.ptr);
      while (it != r->ranges.end() && it->first - *c.ptr < *c.size) it = r->ranges.erase(it);
      r->ranges[*c.ptr] = Range{*c.size, true, 0, 0, std::nullopt};
    } else if (c.api == "cuMemUnmap" && c.size) {
      Reservation *r = holding(*c.ptr);
      if (!r) return;
      for (auto it = r->ranges.lower_bound(*c.ptr);
           it != r->ranges.end() && it->first - *c.ptr < *c.size; ++it) {
        if (!it->second.mapped) continue;
        it->second.mapped = false;
        it->second.unmap_seq = e.seq;
        it->second.unmap_tid = e.tid;
        it->second.unmap_stack = e.stack;
      }
    }
  }
};

OutcomeTracker::OutcomeTracker() : impl_(std::make_unique<Impl>()) {}
OutcomeTracker::~OutcomeTracker() = default;
OutcomeTracker::OutcomeTracker(OutcomeTracker &&) noexcept = default;
OutcomeTracker &OutcomeTracker::operator=(OutcomeTracker &&) noexcept = default;

void OutcomeTracker::event(const Event &e, std::int64_t t) {
  Impl &d = *impl_;
  if (d.pending_until && e.seq >= *d.pending_until) {
    d.at_error = d.reservations;
    d.pending_until.reset();
  }
  if (const auto *c = std::get_if<Call>(&e.body)) {
    if (lifecycle_call(c->api) && !d.aborted) {
      LifeEvent &l = d.ring[d.ring_next];
      l.api = c->api;
      l.args = c->args;
      l.seq = e.seq;
      l.tid = e.tid;
      l.t = t;
      l.res = c->res;
      l.skipped = c->skipped;
      l.stopped_by.clear();
      d.ring_next = (d.ring_next + 1) % kLifecycleShown;
      d.ring_size = std::min(d.ring_size + 1, kLifecycleShown);
    }
    d.vmm(e, *c);
  } else if (const auto *f = std::get_if<Finding>(&e.body);
             f && f->action == "abort" && f->suppressed.empty() && !d.aborted) {
    // The call strict mode stopped is the last one of the process's story, whatever its API.
    d.aborted = true;
    d.remember(LifeEvent{f->api, f->args, f->call_seq.value_or(e.seq), e.tid, t, f->res, false,
                         f->cls});
  } else if (const auto *ce = std::get_if<CudaError>(&e.body)) {
    ErrorPoint p{e.seq, e.tid, t, e.stack, *ce};
    if (ce->sticky && !d.have_sticky) {
      d.have_sticky = true;
      d.first_sticky = p;
      // Calls with a lower seq only: the failing call's own record may follow its error record.
      for (const auto &l : d.recent())
        if (l.seq < e.seq) d.before_error.push_back(l);
      // Older logs do not say when the call returned: as of when it began.
      if (ce->ret_seq && *ce->ret_seq > e.seq + 1)
        d.pending_until = *ce->ret_seq;
      else
        d.at_error = d.reservations;
    }
    const bool known = std::any_of(d.errors.begin(), d.errors.end(), [&](const ErrorPoint &x) {
      return x.error.res == ce->res && x.error.api == ce->api;
    });
    if (!known && d.errors.size() < kErrorsKept) d.errors.push_back(std::move(p));
  }
}

Outcome OutcomeTracker::finish(const Log &log) {
  Impl &d = *impl_;
  Outcome o;
  o.status = log.status();
  o.quick_exit = log.end_quick_exit;
  o.running = o.status == Status::Truncated && log.running;
  o.signal = log.end_signal;
  o.signal_name = log.end_signal_name;
  if (log.summary) o.all_failed = log.summary->every_call_failed;
  if (log.crash) {
    o.crash = log.crash;
    if (!o.signal) o.signal = log.crash->signal;
    if (o.signal_name.empty()) o.signal_name = log.crash->signal_name;
  }
  o.errors = std::move(d.errors);
  o.first_sticky = std::move(d.first_sticky);
  if (o.first_sticky) {
    o.lifecycle = std::move(d.before_error);
    o.lifecycle_before_error = true;
  } else {
    o.lifecycle = d.recent();
    o.lifecycle_to_abort = d.aborted;
  }
  if (d.pending_until) d.at_error = d.reservations;  // the log ended first
  o.asleep_at_error = d.at_error.has_value();
  std::vector<AsleepRange> all;
  for (const auto &[base, r] : d.at_error ? *d.at_error : d.reservations)
    for (const auto &[ptr, range] : r.ranges)
      if (!range.mapped)
        all.push_back({ptr, range.size, base, r.size, range.unmap_seq, range.unmap_tid,
                       range.unmap_stack});
  o.asleep_total = all.size();
  // The last sleep first: the one a stale kernel most likely ran into.
  std::stable_sort(all.begin(), all.end(), [](const AsleepRange &a, const AsleepRange &b) {
    return a.unmap_seq > b.unmap_seq;
  });
  if (all.size() > kAsleepShown) all.resize(kAsleepShown);
  o.asleep = std::move(all);
  return o;
}

std::string all_failed_short(const AllFailed &a) {
  return fmt::format("every CUDA call failed ({} {}) with {}{}", a.calls,
                     a.calls == 1 ? "call" : "calls", a.res,
                     a.name.empty() ? std::string() : " (" + a.name + ")");
}

std::string all_failed_long(const AllFailed &a) {
  std::string s = all_failed_short(a);
  if (!a.cause.empty()) s += ": " + a.cause;
  if (!a.fake_cuda.empty())
    s += "; on a machine without a GPU, run with the fake CUDA stack of this build: "
         "LD_LIBRARY_PATH=" +
         a.fake_cuda;
  return s;
}

std::size_t not_checked_count(const Model &m) {
  std::size_t n = 0;
  for (const Outcome &o : m.outcomes) n += o.all_failed.has_value();
  return n;
}

std::string not_checked_text(const Model &m) {
  std::vector<std::size_t> logs;
  for (std::size_t i = 0; i < m.outcomes.size(); ++i)
    if (m.outcomes[i].all_failed) logs.push_back(i);
  if (logs.empty()) return {};
  std::string who;
  if (logs.size() < m.logs.size()) {
    for (std::size_t k = 0; k < logs.size() && k < 3; ++k)
      who += (k ? ", " : "") + m.label(logs[k]);
    if (logs.size() > 3) who += fmt::format(" and {} more", logs.size() - 3);
    who += " ";
  }
  if (logs.size() == 1)
    return who + "not checked: " + all_failed_short(*m.outcomes[logs[0]].all_failed);
  const AllFailed &first = *m.outcomes[logs[0]].all_failed;
  bool same = true;
  for (std::size_t i : logs) same = same && m.outcomes[i].all_failed->res == first.res;
  return who + "not checked: every CUDA call failed" +
         (same ? fmt::format(" with {}{}", first.res,
                             first.name.empty() ? std::string() : " (" + first.name + ")")
               : std::string(" (each log with one status)"));
}

}  // namespace cmg::report
