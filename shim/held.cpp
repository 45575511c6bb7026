// SPDX-License-Identifier: Apache-2.0
// Held-back frees (see held.h). The real free runs under the re-entry guard, so the driver calls
// it makes are not recorded again, and a `call` record with "released_from" says when it happened.
#include "held.h"

#include <atomic>
#include <cstdlib>

#include <vector>

#include "loader.h"
#include "lock_within.h"
#include "state.h"
#include "summary.h"

namespace cmg::shim {

HeldFrees &held() {
  static HeldFrees *h = new HeldFrees;  // leaked: used until the last free at exit
  return *h;
}

namespace {
// Held frees go back to the driver at exit while the runtime still works: this handler is
// registered at the first hold, after the program's first CUDA calls initialised cudart, so exit()
// runs it before cudart's own teardown (handlers run in reverse order of registration). A release
// from the shim's destructor instead would meet cudaErrorCudartUnloading.
void release_at_exit() {
  exit_begun();
  ReentryGuard guard;
  held().close();
}

void register_exit_release() {
  static std::atomic<bool> done{false};
  if (!done.exchange(true)) std::atexit(release_at_exit);
}
std::atomic<std::uint64_t> g_quarantine_limit{0};  // resolved `auto`, 0 until the first hold
}  // namespace

std::uint64_t quarantine_limit(int dev) {
  const std::uint64_t q = state().opts.quarantine;
  if (q != kAutoSize) return q;
  std::uint64_t limit = g_quarantine_limit.load(std::memory_order_relaxed);
  if (limit) return limit;
  static std::atomic<void *> slot{nullptr};
  std::size_t total = 0;
  // The device's memory, from the driver's own export (a host allocation, dev -1, asks device 0).
  auto f = driver_fn<PFN_cuDeviceTotalMem_v3020>(slot, "cuDeviceTotalMem_v2");
  if (!f || f(&total, dev < 0 ? 0 : dev) != CUDA_SUCCESS) total = 0;
  limit = quarantine_for_device(total);
  g_quarantine_limit.store(limit, std::memory_order_relaxed);
  return limit;
}

bool HeldFrees::hold(const Held &h) {
  register_exit_release();
  std::lock_guard lk(mu_);
  if (closed_) return false;  // exit has begun: nothing would release it later
  q_.push_back(h);
  bytes_[static_cast<int>(h.why)] += h.size;
  return true;
}

bool HeldFrees::closed() const {
  std::lock_guard lk(mu_);
  return closed_;
}

// Exit: the lock with a bounded wait (lock_within.h). A thread that kept it (a signal handler
// interrupted it there and called exit()) leaves the held frees to the end of the process, which
// returns the memory to the driver anyway; a note says so.
void HeldFrees::close() {
  exit_begun();
  if (lock_within(mu_)) {
    closed_ = true;
    mu_.unlock();
  }
  release_all_at_exit();
}

std::uint64_t HeldFrees::release_all_at_exit() {
  const std::uint64_t n = release_down_to(HoldReason::Quarantine, 0, true) +
                          release_down_to(HoldReason::Deferred, 0, true);
  static std::atomic<bool> said{false};
  if (gave_up_ && !said.exchange(true))
    note(LogLevel::Warn, "exit: the held frees stayed locked by a thread that did not come back (a "
                         "signal handler that called exit() interrupted it); they are returned "
                         "with the process");
  return n;
}

bool HeldFrees::hold_within(const Held &h, std::uint64_t limit) {
  register_exit_release();
  std::lock_guard lk(mu_);
  if (closed_) return false;  // the caller frees it now
  auto &b = bytes_[static_cast<int>(h.why)];
  if (h.size > limit || b > limit - h.size) return false;
  q_.push_back(h);
  b += h.size;
  return true;
}

void HeldFrees::really_free(const Held &h) {
  ReentryGuard guard;  // not a call of the program: nested driver calls stay unrecorded
  int r = -1;
  void *p = reinterpret_cast<void *>(h.ptr);
  switch (h.api) {
    case Api::cudaFree: r = CMG_REAL(cudaFree)(p); break;
    case Api::cudaFreeHost: r = CMG_REAL(cudaFreeHost)(p); break;
    case Api::cuMemFree_v2: r = CMG_REAL(cuMemFree_v2)(h.ptr); break;
    case Api::cuMemFreeHost: r = CMG_REAL(cuMemFreeHost)(p); break;
    default: return;  // only synchronous frees are ever held
  }
  State &s = state();
  if (!s.log.is_open()) return;
  char buf[512];
  JsonLine j(buf, sizeof buf);
  std::uint64_t ts = now_ns();
  j.str("k", "call").unum("seq", s.seq.fetch_add(1) + 1).unum("ts", ts).unum("tid", thread_id())
      .str("api", api_name(h.api)).num("res", r).unum("dur", 0).begin_object("args")
      .hex("ptr", h.ptr).unum("size", h.size).end_object()
      .str("released_from", h.why == HoldReason::Quarantine ? "quarantine" : "deferred")
      .unum("freed_seq", h.freed.seq);
  s.log.write(j.finish(), ts);
}

std::uint64_t HeldFrees::release_down_to(HoldReason why, std::uint64_t keep_bytes, bool at_exit) {
  std::vector<Held> go;
  {
    if (at_exit && !lock_within(mu_)) {
      gave_up_ = true;
      return 0;
    }
    if (!at_exit) mu_.lock();
    std::lock_guard lk(mu_, std::adopt_lock);
    auto &b = bytes_[static_cast<int>(why)];
    for (auto it = q_.begin(); it != q_.end() && b > keep_bytes;) {
      if (it->why != why) {
        ++it;
        continue;
      }
      b -= it->size;
      released_[static_cast<int>(why)] += it->size;
      go.push_back(*it);
      it = q_.erase(it);
    }
  }
  std::uint64_t n = 0;
  for (const Held &h : go) {
    really_free(h);
    n += h.size;
  }
  return n;
}

std::uint64_t HeldFrees::release_all(HoldReason why) { return release_down_to(why, 0); }

std::uint64_t HeldFrees::release_all() {
  return release_all(HoldReason::Quarantine) + release_all(HoldReason::Deferred);
}

std::uint64_t HeldFrees::bytes(HoldReason why) const {
  std::lock_guard lk(mu_);
  return bytes_[static_cast<int>(why)];
}

bool HeldFrees::release(std::uint64_t ptr) {
  Held h;
  {
    std::lock_guard lk(mu_);
    auto it = q_.begin();
    while (it != q_.end() && it->ptr != ptr) ++it;
    if (it == q_.end()) return false;
    h = *it;
    bytes_[static_cast<int>(h.why)] -= h.size;
    released_[static_cast<int>(h.why)] += h.size;
    q_.erase(it);
  }
  really_free(h);
  return true;
}

std::optional<Held> HeldFrees::find(std::uint64_t ptr) const {
  std::lock_guard lk(mu_);
  for (const Held &h : q_)
    if (h.ptr == ptr) return h;
  return std::nullopt;
}

std::uint64_t HeldFrees::released_bytes(HoldReason why) const {
  return released_[static_cast<int>(why)].load(std::memory_order_relaxed);
}

bool HeldFrees::empty() const {
  std::lock_guard lk(mu_);
  return q_.empty();
}

void HeldFrees::fork_child() {
  mu_.unlock();
  closed_ = false;
  q_.clear();
  bytes_[0] = bytes_[1] = 0;
  released_[0] = 0;
  released_[1] = 0;
}

}  // namespace cmg::shim
