// SPDX-License-Identifier: Apache-2.0
// The VMM model's queries (the summary, leaks, the IPC diagnosis and bridge, failing calls'
// records): read under the model's lock, never on the path of a successful call.
#include <algorithm>

#include "lock_within.h"
#include "node_reuse.h"
#include "vmm_model.h"

namespace cmg {
namespace {

template <class Map>
auto first_after(Map &m, std::uint64_t off) {
  return detail::first_ending_after(m, off, [](const auto &v) { return v.off + v.size; });
}

template <class Map>
bool overlaps(const Map &m, std::uint64_t off, std::uint64_t end) {
  auto it = first_after(m, off);
  return it != m.end() && it->second.off < end;
}

}  // namespace

std::optional<ReservationPages> VmmModel::pages_of(std::uint64_t p) const {
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(p);
  if (!r) return std::nullopt;
  ReservationPages out{r->base, r->size, r->reserved, {}};
  for (const auto &[o, m] : r->maps) {
    PageView v{m.off, m.size, m.alloc_id, m.mapped.seq, 0, Location::Device, 0};
    // By allocation, not by handle value: the handle may be released while the mapping lives
    // (NCCL releases right after mapping; real-driver.md section 6).
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end()) {
      v.handle_types = a->second.handle_types;
      v.loc = a->second.loc;
      v.loc_id = a->second.loc_id;
    }
    out.pages.push_back(v);
  }
  return out;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> VmmModel::reservation_range(
    std::uint64_t p) const {
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(p);
  if (!r) return std::nullopt;
  return std::make_pair(r->base, r->size);
}

std::optional<HandleRec> VmmModel::handle(std::uint64_t value) const {
  std::lock_guard lk(mu_);
  auto h = handles_.find(value);
  if (h == handles_.end()) return std::nullopt;
  return h->second;
}

std::optional<std::pair<PhysAlloc, std::uint64_t>> VmmModel::mapped_at(std::uint64_t va) const {
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(va);
  if (!r) return std::nullopt;
  const std::uint64_t off = va - r->base;
  auto it = first_after(r->maps, off);
  if (it == r->maps.end() || it->second.off > off) return std::nullopt;
  auto a = allocs_.find(it->second.alloc_id);
  if (a == allocs_.end()) return std::nullopt;
  return std::make_pair(a->second, it->second.alloc_off + (off - it->second.off));
}

std::optional<PhysAlloc> VmmModel::alloc(std::uint64_t id) const {
  std::lock_guard lk(mu_);
  auto a = allocs_.find(id);
  if (a == allocs_.end()) return std::nullopt;
  return a->second;
}

const char *VmmModel::range_state(std::uint64_t va, std::uint64_t size) const {
  std::lock_guard lk(mu_);
  return range_state_locked(va, size);
}

const char *VmmModel::range_state_locked(std::uint64_t va, std::uint64_t size) const {
  const Reservation *r = res_containing_locked(va);
  if (!r) return "not reserved";
  const std::uint64_t off = va - r->base;
  const std::uint64_t end = size > r->size - off ? r->size : off + (size ? size : 1);
  std::uint64_t mapped = 0;
  for (auto it = first_after(r->maps, off); it != r->maps.end() && it->second.off < end; ++it) {
    const Mapping &m = it->second;
    mapped += std::min(end, m.off + m.size) - std::max(off, m.off);
  }
  if (mapped && mapped >= end - off) return "mapped";
  if (mapped) return "partly mapped";
  if (overlaps(r->asleep, off, end)) return "asleep";
  return r->ever_mapped ? "unmapped" : "reserved, never mapped";
}

VmmCounts VmmModel::counts() const {
  std::lock_guard lk(mu_);
  VmmCounts c;
  c.phys = allocs_.size();
  for (const auto &[id, a] : allocs_) c.phys_bytes += a.size;
  for (const auto &[v, h] : handles_) {
    c.handles += h.refs > 0;
    c.released_kept += h.refs == 0;
  }
  c.freed_res_kept = freed_res_.size();
  c.reservations = res_.size();
  for (const auto &[b, r] : res_) {
    c.mappings += r.maps.size();
    c.va_bytes += r.size;
  }
  return c;
}

void VmmModel::for_each_alloc(const std::function<void(const PhysAlloc &)> &fn) const {
  std::lock_guard lk(mu_);
  for (const auto &[id, a] : allocs_) fn(a);
}

void VmmModel::for_each_reservation(const std::function<void(const Reservation &)> &fn) const {
  std::lock_guard lk(mu_);
  for (const auto &[b, r] : res_) fn(r);
}

bool VmmModel::visit_within(std::uint64_t patience_ns, FnRef<void(const PhysAlloc &)> alloc,
                            FnRef<void(const Reservation &)> res, VmmCounts &counts) const {
  if (!lock_within(mu_, patience_ns)) return false;
  std::lock_guard lk(mu_, std::adopt_lock);
  counts = VmmCounts{};
  counts.phys = allocs_.size();
  for (const auto &[id, a] : allocs_) {
    counts.phys_bytes += a.size;
    alloc(a);
  }
  for (const auto &[v, h] : handles_) counts.handles += h.refs > 0;
  counts.reservations = res_.size();
  for (const auto &[b, r] : res_) {
    counts.mappings += r.maps.size();
    counts.va_bytes += r.size;
    res(r);
  }
  return true;
}

void VmmModel::for_each_live_handle(const std::function<void(const HandleRec &)> &fn) const {
  std::lock_guard lk(mu_);
  for (const auto &[v, h] : handles_)
    if (h.refs > 0) fn(h);
}

void VmmModel::clear() {
  std::lock_guard lk(mu_);
  spare_allocs_.clear();
  spare_res_.clear();
  spare_freed_res_.clear();
  spare_maps_.clear();
  spare_sleepers_.clear();
  allocs_.clear();
  handles_.clear();
  res_.clear();
  freed_res_.clear();
  released_ring_.clear();
  freed_res_ring_.clear();
  released_head_ = freed_res_head_ = 0;
}

}  // namespace cmg
