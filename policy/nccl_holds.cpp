// SPDX-License-Identifier: Apache-2.0
// What NCCL and multicast objects hold of the program's memory (see nccl_holds.h).
#include "nccl_holds.h"

#include <algorithm>

namespace cmg {

std::string_view hold_kind_name(HoldKind k) {
  switch (k) {
    case HoldKind::Registration:
      return "registration";
    case HoldKind::Window:
      return "window";
    case HoldKind::BindMem:
    case HoldKind::BindAddr:
      return "multicast binding";
  }
  return "?";
}

namespace {
bool is_comm_hold(const Hold &h) {
  return h.kind == HoldKind::Registration || h.kind == HoldKind::Window;
}
}  // namespace

void NcclHolds::on_register(std::uint64_t comm, std::uint64_t va, std::uint64_t size,
                            std::uint64_t handle, bool inside_nccl, const EventRef &ev) {
  if (inside_nccl || handle == 0) return;  // NCCL_LOCAL_REGISTER=0 answers a NULL handle
  std::lock_guard lk(mu_);
  // A range inside a registered slot gets the same handle and takes a reference on it
  // (2.28.9 src/register/register.cc).
  for (auto &[k, h] : holds_)
    if (h.kind == HoldKind::Registration && h.owner == comm && h.handle == handle) {
      ++h.refs;
      return;
    }
  Hold h;
  h.kind = HoldKind::Registration;
  h.owner = comm;
  h.handle = handle;
  h.va = va;
  h.size = size;
  h.made = ev;
  holds_.emplace(va, h);
  count_locked();
}

bool NcclHolds::on_deregister(std::uint64_t comm, std::uint64_t handle) {
  std::lock_guard lk(mu_);
  for (auto it = holds_.begin(); it != holds_.end(); ++it) {
    Hold &h = it->second;
    if (h.kind != HoldKind::Registration || h.owner != comm || h.handle != handle) continue;
    if (--h.refs == 0) holds_.erase(it);
    count_locked();
    return true;
  }
  return false;
}

void NcclHolds::on_window(std::uint64_t comm, std::uint64_t va, std::uint64_t size,
                          std::uint64_t win, const EventRef &ev) {
  if (win == 0) return;
  std::lock_guard lk(mu_);
  Hold h;
  h.kind = HoldKind::Window;
  h.owner = comm;
  h.handle = win;
  h.va = va;
  h.size = size;
  h.made = ev;
  holds_.emplace(va, h);
  count_locked();
}

bool NcclHolds::on_window_deregister(std::uint64_t comm, std::uint64_t win) {
  std::lock_guard lk(mu_);
  for (auto it = holds_.begin(); it != holds_.end(); ++it)
    if (it->second.kind == HoldKind::Window && it->second.owner == comm &&
        it->second.handle == win) {
      holds_.erase(it);
      count_locked();
      return true;
    }
  return false;
}

void NcclHolds::on_comm_end(std::uint64_t comm) {
  std::lock_guard lk(mu_);
  for (auto it = holds_.begin(); it != holds_.end();)
    it = is_comm_hold(it->second) && it->second.owner == comm ? holds_.erase(it) : std::next(it);
  sleeping_.erase(comm);
  // What NCCL did not free of its own ranges is no longer known to be NCCL's.
  for (auto it = own_.begin(); it != own_.end();)
    it = it->second.comm == comm ? own_.erase(it) : std::next(it);
  own_count_.store(own_.size(), std::memory_order_relaxed);
  count_locked();
}

void NcclHolds::on_own_reserve(std::uint64_t comm, std::uint64_t base, std::uint64_t size) {
  if (comm == 0 || size == 0) return;
  std::lock_guard lk(mu_);
  own_[base] = OwnReservation{comm, size};
  own_count_.store(own_.size(), std::memory_order_relaxed);
}

void NcclHolds::on_address_freed(std::uint64_t base) {
  std::lock_guard lk(mu_);
  own_.erase(base);
  own_count_.store(own_.size(), std::memory_order_relaxed);
}

bool NcclHolds::own_teardown(std::uint64_t comm, std::uint64_t va, std::uint64_t size) const {
  if (comm == 0 || !has_own()) return false;
  std::lock_guard lk(mu_);
  const auto it = own_.find(va);
  return it != own_.end() && it->second.comm == comm && it->second.size == size;
}

void NcclHolds::on_bind(const Hold &binding) {
  std::lock_guard lk(mu_);
  holds_.emplace(binding.va, binding);
  count_locked();
}

bool NcclHolds::on_unbind(std::uint64_t mc, int dev, std::uint64_t mc_offset, std::uint64_t size) {
  std::lock_guard lk(mu_);
  for (auto it = holds_.begin(); it != holds_.end(); ++it) {
    const Hold &h = it->second;
    if (!is_comm_hold(h) && h.owner == mc && h.dev == dev && h.mc_offset == mc_offset &&
        h.size == size) {
      holds_.erase(it);
      count_locked();
      return true;
    }
  }
  return false;
}

void NcclHolds::on_multicast_release(std::uint64_t mc) {
  std::lock_guard lk(mu_);
  for (auto it = holds_.begin(); it != holds_.end();)
    it = !is_comm_hold(it->second) && it->second.owner == mc ? holds_.erase(it) : std::next(it);
  count_locked();
}

std::vector<Hold> NcclHolds::take_overlapping(std::uint64_t va, std::uint64_t size) {
  std::vector<Hold> out;
  if (empty() || size == 0) return out;
  std::lock_guard lk(mu_);
  // Ranges start below va + size; one that starts below va may still reach into it.
  for (auto it = holds_.begin(); it != holds_.end() && it->first < va + size; ++it) {
    Hold &h = it->second;
    if (h.kind == HoldKind::BindMem || h.reported || h.va + h.size <= va) continue;
    h.reported = true;
    out.push_back(h);
  }
  return out;
}

std::vector<Hold> NcclHolds::take_bound(std::uint64_t alloc_id) {
  std::vector<Hold> out;
  if (empty() || alloc_id == 0) return out;
  std::lock_guard lk(mu_);
  for (auto &[k, h] : holds_)
    if (!is_comm_hold(h) && h.alloc_id == alloc_id && !h.reported) {
      h.reported = true;
      out.push_back(h);
    }
  return out;
}

std::vector<Hold> NcclHolds::holds_of(std::uint64_t owner) const {
  std::vector<Hold> out;
  std::lock_guard lk(mu_);
  for (const auto &[k, h] : holds_)
    if (h.owner == owner) out.push_back(h);
  return out;
}

void NcclHolds::on_suspend_unmap(std::uint64_t comm, std::uint64_t va, std::uint64_t size,
                                 const EventRef &ev) {
  std::lock_guard lk(mu_);
  sleeping_[comm].push_back(SleepingRange{va, size, ev});
}

std::vector<SleepingRange> NcclHolds::sleeping(std::uint64_t comm) const {
  std::lock_guard lk(mu_);
  auto it = sleeping_.find(comm);
  return it == sleeping_.end() ? std::vector<SleepingRange>{} : it->second;
}

void NcclHolds::on_resumed(std::uint64_t comm) {
  std::lock_guard lk(mu_);
  sleeping_.erase(comm);
}

void NcclHolds::on_import(const PeerImport &imp) {
  std::lock_guard lk(mu_);
  imports_.push_back(imp);
  if (imports_.size() > kImportsKept) imports_.pop_front();
}

void NcclHolds::clear() {
  std::lock_guard lk(mu_);
  clear_locked();
}

void NcclHolds::clear_locked() {
  holds_.clear();
  sleeping_.clear();
  imports_.clear();
  own_.clear();
  own_count_.store(0, std::memory_order_relaxed);
  count_locked();
}

}  // namespace cmg
