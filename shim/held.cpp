// SPDX-License-Identifier: Apache-2.0
// Held-back frees (see held.h). The real free runs under the re-entry guard, so the driver calls
// it makes are not recorded again, and a `call` record with "released_from" says when it happened;
// the linear model's record of it then turns from Held to Freed.
#include "held.h"

#include <atomic>
#include <cstdlib>

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
std::atomic<std::uint64_t> g_quarantine_limit{0};  // resolved `auto`, 0 until the first hold
std::atomic<bool> g_quarantine_device_known{false};  // the device's memory was read for it
}  // namespace

std::uint64_t quarantine_limit(int dev) {
  const std::uint64_t q = state().opts.quarantine;
  if (q != kAutoSize) return q;
  std::uint64_t limit = g_quarantine_limit.load(std::memory_order_acquire);
  if (limit) return limit;
  static std::atomic<void *> slot{nullptr};
  std::size_t total = 0;
  // The device's memory, from the driver's own export (a host allocation, dev -1, asks device 0).
  auto f = driver_fn<PFN_cuDeviceTotalMem_v3020>(slot, "cuDeviceTotalMem_v2");
  if (!f || f(&total, dev < 0 ? 0 : dev) != CUDA_SUCCESS) total = 0;
  limit = quarantine_for_device(total);
  g_quarantine_device_known.store(total != 0, std::memory_order_relaxed);
  g_quarantine_limit.store(limit, std::memory_order_release);
  return limit;
}

QuarantineSize quarantine_size() {
  QuarantineSize q;
  q.bytes = state().opts.quarantine;
  if (q.bytes != kAutoSize) return q;
  q.bytes = g_quarantine_limit.load(std::memory_order_acquire);
  if (!q.bytes)
    q.how = QuarantineSize::How::NeverSized;
  else if (g_quarantine_device_known.load(std::memory_order_relaxed))
    q.how = QuarantineSize::How::Auto;
  else
    q.how = QuarantineSize::How::AutoDeviceUnknown;
  return q;
}

bool HeldFrees::hold(const Held &h) {
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

// Exit: the lock with a bounded wait (lock_within.h), none when this thread holds it itself (a
// signal handler interrupted it there and called exit()). Without the lock nothing is counted;
// the frees still held are returned with the process either way.
void HeldFrees::close() {
  exit_begun();
  if (at_exit_known_.load(std::memory_order_acquire)) return;
  if (!lock_within(mu_)) {
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
      note(LogLevel::Warn, "exit: the held frees stayed locked by a thread that did not come back "
                           "(a signal handler that called exit() interrupted it); they are "
                           "returned with the process, uncounted");
    return;
  }
  closed_ = true;
  AtExit a;
  a.known = true;
  for (const Held &h : q_) {
    ++a.count[static_cast<int>(h.why)];
    a.bytes[static_cast<int>(h.why)] += h.size;
  }
  at_exit_ = a;
  at_exit_known_.store(true, std::memory_order_release);
  mu_.unlock();
}

HeldFrees::AtExit HeldFrees::at_exit() const {
  return at_exit_known_.load(std::memory_order_acquire) ? at_exit_ : AtExit{};
}

bool HeldFrees::hold_within(const Held &h, std::uint64_t limit) {
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
  // After the driver's free, not before: until it returns, a second free of the address must
  // still meet the held record (a proven double free), never a Freed one that asks the driver.
  s.linear.given_back(h.ptr, h.gen);
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

// The oldest entry of `why` while more than keep_bytes of it are held, taken off the queue.
bool HeldFrees::pop_oldest(HoldReason why, std::uint64_t keep_bytes, Held &out) {
  std::lock_guard lk(mu_);
  auto &b = bytes_[static_cast<int>(why)];
  if (b <= keep_bytes) return false;
  for (auto it = q_.begin(); it != q_.end(); ++it) {
    if (it->why != why) continue;
    out = *it;
    b -= it->size;
    released_[static_cast<int>(why)] += it->size;
    q_.erase(it);
    return true;
  }
  return false;
}

// One at a time: each free is taken off the queue under the lock and given to the driver outside
// it (a free synchronises the device; another thread's hold must not wait for that), with no list
// of them built first.
std::uint64_t HeldFrees::release_down_to(HoldReason why, std::uint64_t keep_bytes) {
  std::uint64_t n = 0;
  Held h;
  while (pop_oldest(why, keep_bytes, h)) {
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
  at_exit_ = AtExit{};
  at_exit_known_.store(false, std::memory_order_relaxed);
  q_.clear();
  bytes_[0] = bytes_[1] = 0;
  released_[0] = 0;
  released_[1] = 0;
}

}  // namespace cmg::shim
