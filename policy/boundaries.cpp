// SPDX-License-Identifier: Apache-2.0
// Sleep and wake-up runs (see boundaries.h).
#include "boundaries.h"

#include <algorithm>
#include <new>

namespace cmg {

void Boundaries::set_open_locked() {
  open_.store((sleep_ ? 1 : 0) | (wake_ ? 2 : 0), std::memory_order_relaxed);
  sleep_run_.store(sleep_ ? kRun | sleep_->tid : 0, std::memory_order_relaxed);
  wake_run_.store(wake_ ? kRun | (wake_->failed ? kFailed : 0) | wake_->tid : 0,
                  std::memory_order_relaxed);
}

bool Boundaries::ends_run(std::uint32_t tid, CallRole role) const {
  // The same conditions as on_call's, on the words set_open_locked stores.
  const std::uint64_t mine = kRun | tid;
  if (role != CallRole::Takes && sleep_run_.load(std::memory_order_relaxed) == mine) return true;
  const std::uint64_t w = wake_run_.load(std::memory_order_relaxed);
  if ((w & ~kFailed) != mine) return false;
  return !(role == CallRole::Wakes || (role == CallRole::Takes && (w & kFailed)));
}

Boundaries::Ended Boundaries::take_locked() {
  Ended e;
  if (sleep_) e.sleep = std::move(*sleep_);
  if (wake_) e.wake = std::move(*wake_);
  sleep_.reset();
  wake_.reset();
  set_open_locked();
  return e;
}

Boundaries::Ended Boundaries::on_call(std::uint32_t tid, CallRole role) {
  Ended e;
  std::lock_guard lk(mu_);
  // A sleep goes on while its thread takes memory away.
  if (sleep_ && sleep_->tid == tid && role != CallRole::Takes) {
    e.sleep = std::move(*sleep_);
    sleep_.reset();
  }
  // A wake-up goes on while its thread creates and maps, and, once failed, while it rolls back.
  if (wake_ && wake_->tid == tid &&
      !(role == CallRole::Wakes || (role == CallRole::Takes && wake_->failed))) {
    e.wake = std::move(*wake_);
    wake_.reset();
  }
  set_open_locked();
  return e;
}

Boundaries::Ended Boundaries::on_address_free(std::uint32_t tid, std::uint64_t va) {
  Ended e;
  // Only this thread opens a sleep of its own (see ends_run): without one, no lock.
  if (sleep_run_.load(std::memory_order_relaxed) != (kRun | tid)) return e;
  std::lock_guard lk(mu_);
  if (!sleep_ || sleep_->tid != tid) return e;
  for (std::size_t i = 0; i < sleep_->seen.size(); ++i) {
    const SleepRun::Range &r = sleep_->seen[i];
    if (va <= r.va && r.va < va + std::max<std::uint64_t>(r.size, 1)) return e;
  }
  if (!sleep_->seen_all) return e;  // not known: a free of one of its ranges, maybe
  e.sleep = std::move(*sleep_);
  sleep_.reset();
  set_open_locked();
  return e;
}

Boundaries::Ended Boundaries::end_all() {
  std::lock_guard lk(mu_);
  return take_locked();
}

Boundaries::Ended Boundaries::on_sleep_unmap(const EventRef &ev, std::uint64_t va,
                                             std::uint64_t size, std::uint64_t ranges,
                                             std::uint64_t bytes, const std::uintptr_t *sites,
                                             std::size_t nsites) {
  Ended e;
  std::lock_guard lk(mu_);
  // A failed wake-up's rollback puts its ranges back to sleep: that is the wake-up's, not a sleep.
  if (wake_ && wake_->tid == ev.tid && wake_->failed) return e;
  if (sleep_ && sleep_->tid != ev.tid) {
    e.sleep = std::move(*sleep_);
    sleep_.reset();
  }
  if (!sleep_) {
    sleep_.emplace();
    sleep_->tid = ev.tid;
    sleep_->first = ev;
  }
  SleepRun &s = *sleep_;
  s.ranges += ranges;
  s.bytes += bytes;
  if (s.seen.size() < kMaxRanges)
    s.seen.push_back(SleepRun::Range{va, size});
  else
    s.seen_all = false;
  for (std::size_t i = 0; i < nsites; ++i) {
    if (!sites[i]) {
      s.sites_known = false;
      continue;
    }
    if (s.sites.contains(sites[i])) continue;
    if (s.sites.size() < kMaxSites) s.sites.push_back(sites[i]);
  }
  set_open_locked();
  return e;
}

Boundaries::Ended Boundaries::on_wake_map(const EventRef &ev, std::uint64_t va, std::uint64_t size,
                                          std::uint64_t handle, std::uint64_t woken,
                                          std::uint64_t woken_bytes, std::uintptr_t site) {
  Ended e;
  std::lock_guard lk(mu_);
  // Memory being woken ends a sleep, whichever thread wakes it.
  if (sleep_) {
    e.sleep = std::move(*sleep_);
    sleep_.reset();
  }
  if (wake_ && wake_->tid != ev.tid) {
    e.wake = std::move(*wake_);
    wake_.reset();
  }
  if (!wake_) {
    wake_.emplace();
    wake_->tid = ev.tid;
    wake_->first = ev;
  }
  WakeRun &w = *wake_;
  w.woken += woken;
  w.woken_bytes += woken_bytes;
  set_open_locked();
  // The create just before this map made the handle: that entry becomes the mapping.
  for (auto it = w.made.rbegin(); it != w.made.rend(); ++it)
    if (it->handle == handle && it->va == 0) {
      *it = WakeMade{va, size, handle, ev, site};
      return e;
    }
  if (w.made.size() < kMaxMade)
    w.made.push_back(WakeMade{va, size, handle, ev, site});
  else
    ++w.made_dropped;
  return e;
}

void Boundaries::on_map(const EventRef &ev, std::uint64_t va, std::uint64_t size,
                        std::uint64_t handle, std::uintptr_t site) {
  if (!wake_of(ev.tid)) return;
  std::lock_guard lk(mu_);
  if (!wake_ || wake_->tid != ev.tid) return;
  WakeRun &w = *wake_;
  for (auto it = w.made.rbegin(); it != w.made.rend(); ++it)
    if (it->handle == handle && it->va == 0) {
      *it = WakeMade{va, size, handle, ev, site};
      return;
    }
  if (w.made.size() < kMaxMade)
    w.made.push_back(WakeMade{va, size, handle, ev, site});
  else
    ++w.made_dropped;
}

void Boundaries::on_create(const EventRef &ev, std::uint64_t handle, std::uint64_t size) {
  if (!wake_of(ev.tid)) return;
  std::lock_guard lk(mu_);
  if (!wake_ || wake_->tid != ev.tid) return;
  if (wake_->made.size() < kMaxMade)
    wake_->made.push_back(WakeMade{0, size, handle, ev, 0});
  else
    ++wake_->made_dropped;
}

void Boundaries::on_refused(const EventRef &ev, int res) {
  if (!wake_of(ev.tid)) return;
  std::lock_guard lk(mu_);
  if (!wake_ || wake_->tid != ev.tid || wake_->failed) return;
  wake_->failed = true;
  wake_->failed_call = ev;
  wake_->failed_res = res;
  set_open_locked();
}

void Boundaries::keep(std::vector<Leftover> l) {
  std::lock_guard lk(mu_);
  for (Leftover &x : l) {
    if (leftovers_.size() >= kMaxLeftovers) break;
    leftovers_.push_back(std::move(x));
  }
  nleft_.store(leftovers_.size(), std::memory_order_relaxed);
}

std::vector<Leftover> Boundaries::take_leftovers() {
  std::lock_guard lk(mu_);
  std::vector<Leftover> out;
  out.swap(leftovers_);
  nleft_.store(0, std::memory_order_relaxed);
  return out;
}

void Boundaries::fork_child() {
  // The child owns none of the parent's memory; the lock may have been held at fork.
  mu_.reset();
  sleep_.reset();
  wake_.reset();
  leftovers_.clear();
  open_.store(0, std::memory_order_relaxed);
  sleep_run_.store(0, std::memory_order_relaxed);
  wake_run_.store(0, std::memory_order_relaxed);
  nleft_.store(0, std::memory_order_relaxed);
}

}  // namespace cmg
