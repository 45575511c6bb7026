// SPDX-License-Identifier: Apache-2.0
// The VMM model: see vmm_model.h for the transaction and generation rules.
#include "vmm_model.h"

#include <algorithm>

#include "node_reuse.h"
#include "text.h"

namespace cmg {

using detail::erase_keep;
using detail::put_reusing;
using detail::recycle;

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

// ---------------------------------------------------------------------------------------------
// Helpers under the lock.

Reservation *VmmModel::res_containing_locked(std::uint64_t p) {
  auto it = res_.upper_bound(p);
  if (it == res_.begin()) return nullptr;
  --it;
  return (p >= it->second.base && p < it->second.base + it->second.size) ? &it->second : nullptr;
}

const Reservation *VmmModel::res_containing_locked(std::uint64_t p) const {
  return const_cast<VmmModel *>(this)->res_containing_locked(p);
}

void VmmModel::issue_locked(std::uint64_t value, std::uint64_t alloc_id, const EventRef &ev) {
  auto it = handles_.find(value);
  if (it != handles_.end() && it->second.refs > 0) {
    // The driver issued a value the model holds live: the model missed its release (made through
    // a path the shim does not see). The driver is the truth: that issue is gone.
    auto a = allocs_.find(it->second.alloc_id);
    if (a != allocs_.end()) {
      a->second.handle_refs -= std::min(a->second.handle_refs, it->second.refs);
      VmmFreed gone;
      drop_if_dead_locked(a->first, nullptr, gone);
    }
  }
  HandleRec h;
  h.value = value;
  h.alloc_id = alloc_id;
  h.refs = 1;
  h.gen = next_gen_++;
  h.issued = ev;
  handles_.insert_or_assign(value, h);
}

void VmmModel::drop_if_dead_locked(std::uint64_t alloc_id, VmmTicket *t, VmmFreed &freed) {
  auto it = allocs_.find(alloc_id);
  if (it == allocs_.end() || it->second.handle_refs != 0 || it->second.map_count != 0) return;
  freed.bytes += it->second.size;
  freed.dev = it->second.dev();
  counters_.add(it->second.dev(), MemKind::Vmm, -static_cast<std::int64_t>(it->second.size));
  if (t) t->dropped.push_back(it->second);
  recycle(spare_allocs_, allocs_.extract(it));
}

// The inverse of one drop a refused call made: the allocation is back, with its bytes. Only when
// what referred to it comes back too (a mapping restored, a reference given back): an allocation
// put back with nothing referring to it would never be dropped again (a leak at exit).
PhysAlloc *VmmModel::undo_drop_locked(VmmTicket &t, std::uint64_t alloc_id) {
  if (auto a = allocs_.find(alloc_id); a != allocs_.end()) return &a->second;
  for (std::size_t i = 0; i < t.dropped.size(); ++i) {
    const PhysAlloc &a = t.dropped[i];
    if (a.id != alloc_id) continue;  // ids are never reused: absent means this call dropped it
    put_reusing(allocs_, spare_allocs_, a.id, a);
    counters_.add(a.dev(), MemKind::Vmm, static_cast<std::int64_t>(a.size));
    if (t.freed.bytes >= a.size) t.freed.bytes -= a.size;
    return &allocs_.find(a.id)->second;
  }
  return nullptr;
}

void VmmModel::erase_res_locked(Reservations::iterator it, VmmFreed &freed) {
  Reservation &r = it->second;
  for (const auto &[o, m] : r.maps) {
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end() && a->second.map_count)
      a->second.map_count--;
    drop_if_dead_locked(m.alloc_id, nullptr, freed);
  }
  // A reservation with a free in flight gave its bytes back when that free began.
  if (!r.freeing) counters_.add(-1, MemKind::Va, -static_cast<std::int64_t>(r.size));
  // The reservation's own maps give their nodes back too: a spare reservation node reused with
  // them still inside freed them at the reuse (a malloc and a free per record per VMM cycle).
  while (!r.maps.empty()) recycle(spare_maps_, r.maps.extract(r.maps.begin()));
  while (!r.asleep.empty()) recycle(spare_sleepers_, r.asleep.extract(r.asleep.begin()));
  recycle(spare_res_, res_.extract(it));
}

void VmmModel::remember_released_locked(const HandleRec &h) {
  if (released_ring_.size() < kReleasedKept) {
    released_ring_.emplace_back(h.value, h.gen);
    return;
  }
  const auto [old, old_gen] = released_ring_[released_head_];
  released_ring_[released_head_] = {h.value, h.gen};
  released_head_ = (released_head_ + 1) % kReleasedKept;
  // Forgotten only if the value is still released in the generation this entry recorded.
  auto it = handles_.find(old);
  if (it != handles_.end() && it->second.refs == 0 && it->second.gen == old_gen) handles_.erase(it);
}

void VmmModel::remember_freed_res_locked(std::uint64_t base, std::uint64_t size,
                                         const EventRef &ev) {
  put_reusing(freed_res_, spare_freed_res_, base, std::make_pair(size, ev));
  if (freed_res_ring_.size() < kFreedResKept) {
    freed_res_ring_.emplace_back(base, ev.seq);
    return;
  }
  const auto [old, old_seq] = freed_res_ring_[freed_res_head_];
  freed_res_ring_[freed_res_head_] = {base, ev.seq};
  freed_res_head_ = (freed_res_head_ + 1) % kFreedResKept;
  auto it = freed_res_.find(old);
  if (it != freed_res_.end() && it->second.second.seq == old_seq)
    erase_keep(freed_res_, spare_freed_res_, it);
}

// ---------------------------------------------------------------------------------------------
// Issuing calls.

void VmmModel::on_create(std::uint64_t handle, std::uint64_t size, Location loc, int loc_id,
                         unsigned handle_types, bool imported, const EventRef &ev,
                         ThreadVmmState &ts) {
  ts.pending = false;
  std::lock_guard lk(mu_);
  PhysAlloc a;
  a.id = next_alloc_id_++;
  a.size = size;
  a.loc = loc;
  a.loc_id = loc_id;
  a.handle_types = handle_types;
  a.handle_refs = 1;
  a.imported = imported;
  a.created = ev;
  counters_.add(a.dev(), MemKind::Vmm, static_cast<std::int64_t>(size));
  const std::uint64_t id = a.id;
  put_reusing(allocs_, spare_allocs_, id, std::move(a));
  issue_locked(handle, id, ev);
}

void VmmModel::on_retain(std::uint64_t handle, std::uint64_t va, const EventRef &ev,
                         ThreadVmmState &ts) {
  // A value issued on this thread: a release of it next is not the stale one of the pairing rule
  // (tests/integration case retain-pairing).
  ts.pending = false;
  std::lock_guard lk(mu_);
  std::uint64_t alloc_id = 0;
  if (Reservation *r = res_containing_locked(va)) {
    auto m = first_after(r->maps, va - r->base);
    if (m != r->maps.end() && m->second.off <= va - r->base) alloc_id = m->second.alloc_id;
  }
  if (auto a = allocs_.find(alloc_id); a != allocs_.end()) a->second.handle_refs++;
  auto h = handles_.find(handle);
  if (h != handles_.end() && h->second.refs > 0 && h->second.alloc_id == alloc_id) {
    h->second.refs++;  // the driver handed out a value that is live already (real-driver.md D16)
    return;
  }
  issue_locked(handle, alloc_id, ev);
}

void VmmModel::on_reserve(std::uint64_t base, std::uint64_t size, const EventRef &ev,
                          ThreadVmmState &ts) {
  ts.pending = false;
  std::lock_guard lk(mu_);
  // The driver handed out this range: whatever the model still holds there is gone at the driver
  // (freed through a path the shim does not see, or by an address free that has not returned to
  // the shim yet).
  VmmFreed gone;
  for (auto it = res_.upper_bound(base); it != res_.begin();) {
    auto prev = std::prev(it);
    if (prev->second.base + prev->second.size <= base) break;
    erase_res_locked(prev, gone);
    it = res_.upper_bound(base);
  }
  for (auto it = res_.lower_bound(base); it != res_.end() && it->first < base + size;
       it = res_.lower_bound(base))
    erase_res_locked(it, gone);
  Reservation r;
  r.base = base;
  r.size = size;
  r.gen = next_gen_++;
  r.reserved = ev;
  put_reusing(res_, spare_res_, base, std::move(r));
  for (auto it = freed_res_.lower_bound(base); it != freed_res_.end() && it->first < base + size;)
    it = erase_keep(freed_res_, spare_freed_res_, it);
  counters_.add(-1, MemKind::Va, static_cast<std::int64_t>(size));
}

void VmmModel::on_set_access(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r) return;
  const std::uint64_t off = va - r->base;
  for (auto it = first_after(r->maps, off); it != r->maps.end() && it->second.off < off + size;
       ++it)
    it->second.access = true;
}

// ---------------------------------------------------------------------------------------------
// Map.

VmmTicket VmmModel::begin_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset,
                              std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts,
                              const Options &o) {
  ts.pending = false;
  VmmTicket t;
  t.op = VmmTicket::Op::Map;
  t.va = va;
  t.size = size;
  t.value = handle;
  t.alloc_off = offset;
  t.ev = ev;
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  // Not ours to judge (reserved before tracking, size 0, past the end): the driver answers.
  if (!r || size == 0 || size > r->base + r->size - va) {
    // What the model knew of the range goes only into the call record of the event log.
    if (!o.log.empty()) t.va_state = range_state_locked(va, size);
    return t;
  }
  const std::uint64_t off = va - r->base;
  t.res_gen = r->gen;
  auto cur = first_after(r->maps, off);
  if (cur != r->maps.end() && cur->second.off < off + size) {
    // real-driver.md D12: refused, and the new handle stays alive. Not noted: if the driver
    // accepts it after all, end() follows the driver.
    t.finding = vmm_findings::map_over_mapped(va, size, handle, *r, cur->second);
    t.decision = decide(o, FindingClass::MapOverMapped, false);
    t.va_state = range_state_locked(va, size);
    return t;
  }
  note_map_locked(t, *r, off);
  return t;
}

void VmmModel::note_map_locked(VmmTicket &t, Reservation &r, std::uint64_t off) {
  Mapping m;
  m.off = off;
  m.size = t.size;
  m.handle = t.value;
  m.alloc_off = t.alloc_off;
  m.mapped = t.ev;
  auto h = handles_.find(t.value);
  if (h != handles_.end() && h->second.refs > 0) {
    HandleRec &hr = h->second;
    m.alloc_id = hr.alloc_id;
    m.gen = hr.gen;
    t.gen = hr.gen;
    t.prev_where = {hr.last_res, hr.last_off, hr.ever_mapped};
    hr.last_res = r.base;
    hr.last_off = off;
    hr.ever_mapped = true;
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end()) {
      a->second.map_count++;
      // An imported handle has no size until it is mapped (cuMemImportFromShareableHandle does
      // not say): its first mapping is its size.
      if (a->second.imported && a->second.size == 0) {
        a->second.size = t.size;
        counters_.add(a->second.dev(), MemKind::Vmm, static_cast<std::int64_t>(t.size));
        t.sized_import = true;
      }
    }
  }
  for (auto it = first_after(r.asleep, off); it != r.asleep.end() && it->second.off < off + t.size;) {
    t.woken.push_back(it->second);
    it = erase_keep(r.asleep, spare_sleepers_, it);
  }
  put_reusing(r.maps, spare_maps_, off, m);
  t.prev_ever_mapped = r.ever_mapped;
  r.ever_mapped = true;
  t.noted = true;
}

void VmmModel::end_map_locked(VmmTicket &t, bool ok) {
  Reservation *r = res_containing_locked(t.va);
  if (!r || r->gen != t.res_gen) return;
  const std::uint64_t off = t.va - r->base;
  if (!t.noted) {
    if (!ok || !t.finding) return;
    // The driver accepted a map over what the model holds mapped: the model drifted (memory
    // unmapped through a path the shim does not see). Follow the driver.
    force_unmap_locked(*r, off, off + t.size, t.ev, t.freed);
    note_map_locked(t, *r, off);
    return;
  }
  if (ok) return;
  auto m = r->maps.find(off);
  if (m == r->maps.end() || m->second.mapped.seq != t.ev.seq) return;  // not this map's any more
  const std::uint64_t alloc_id = m->second.alloc_id;
  erase_keep(r->maps, spare_maps_, m);
  if (auto a = allocs_.find(alloc_id); a != allocs_.end() && a->second.map_count) {
    a->second.map_count--;
    if (t.sized_import) {
      counters_.add(a->second.dev(), MemKind::Vmm, -static_cast<std::int64_t>(a->second.size));
      a->second.size = 0;
    }
    VmmFreed gone;  // another thread released the last handle meanwhile: the driver freed it then
    drop_if_dead_locked(alloc_id, nullptr, gone);
  }
  if (auto h = handles_.find(t.value); h != handles_.end() && h->second.gen == t.gen && t.gen &&
                                       h->second.last_res == r->base && h->second.last_off == off) {
    h->second.last_res = t.prev_where.res;
    h->second.last_off = t.prev_where.off;
    h->second.ever_mapped = t.prev_where.ever_mapped;
  }
  t.woken.each([&](const Sleeper &s) {
    if (!overlaps(r->asleep, s.off, s.off + s.size) && !overlaps(r->maps, s.off, s.off + s.size))
      put_reusing(r->asleep, spare_sleepers_, s.off, s);
  });
  r->ever_mapped = t.prev_ever_mapped || !r->maps.empty() || !r->asleep.empty();
}

// ---------------------------------------------------------------------------------------------
// Unmap.

VmmTicket VmmModel::begin_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev,
                                ThreadVmmState &ts, const Options &o, bool owner_teardown) {
  VmmTicket t;
  t.op = VmmTicket::Op::Unmap;
  t.va = va;
  t.size = size;
  t.ev = ev;
  std::unique_lock lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r || size == 0 || size > r->base + r->size - va) {
    ts.pending = false;
    // Read only for the call record of the event log: a refused call's other cost is a lookup.
    if (!o.log.empty()) t.va_state = range_state_locked(va, size);
    return t;  // not ours to judge: the driver answers (real-driver.md D10)
  }
  const std::uint64_t off = va - r->base, end = off + size;
  t.res_gen = r->gen;
  // Legitimate only when the range is exactly tiled by whole mappings (real-driver.md D9).
  bool exact = true;
  std::uint64_t cur = off;
  std::size_t hits = 0;
  for (auto it = first_after(r->maps, off); it != r->maps.end() && it->second.off < end; ++it) {
    if (it->second.off != cur) exact = false;
    cur = it->second.off + it->second.size;
    ++hits;
  }
  if (hits == 0 && owner_teardown && off == 0 && size == r->size) {
    // The reservation's maker ending it (see begin_unmap in vmm_model.h): the driver does nothing
    // (D3/D4), and none of its sleeping ranges is the program's to pair with a release.
    ts.pending = false;
    return t;
  }
  if (hits == 0) {
    // real-driver.md D3/D4: the driver answers SUCCESS and does nothing; the call is redundant.
    // The sleeping ranges it covers are remembered on this thread for the pairing rule: the first
    // eight copied, the rest found again at the release (ThreadVmmState). O(log n) and no
    // allocation under the lock, however many ranges it covers: an expandable segment keeps
    // thousands of them in one reservation.
    ts.pending = true;
    ts.base = va;
    ts.size = size;
    ts.res_base = r->base;
    ts.res_gen = r->gen;
    ts.mark = next_gen_++;  // ranges put to sleep from now on are not this unmap's
    ts.nlast = 0;
    ts.more = false;
    ts.noop_unmap = ev;
    for (auto it = first_after(r->asleep, off); it != r->asleep.end() && it->second.off < end;
         ++it) {
      const Sleeper &s = it->second;
      if (ts.nlast == ts.last.size()) {
        ts.more = true;
        ts.beyond = s.off;  // where the release's lookup starts
        break;
      }
      ts.last[ts.nlast++] = ThreadVmmState::Last{s.handle, s.gen, s.alloc_id, s.unmapped};
    }
    t.noop = VmmTicket::Noop{r->base, r->size, r->ever_mapped, r->reserved};
    t.decision = decide(o, FindingClass::UnmapUnmapped, trusted());
    lk.unlock();
    t.finding = vmm_findings::unmap_unmapped(va, size, t.noop, ts);
    return t;  // nothing to note: forwarded (report mode), the driver does nothing either
  }
  ts.pending = false;
  if (!exact || cur != end) {
    std::vector<const Mapping *> hit;
    for (auto it = first_after(r->maps, off); it != r->maps.end() && it->second.off < end; ++it)
      hit.push_back(&it->second);
    t.finding = vmm_findings::partial_unmap(va, size, *r, hit);
    t.decision = decide(o, FindingClass::PartialUnmap, false);
    t.va_state = range_state_locked(va, size);
    return t;
  }
  note_unmap_locked(t, *r, off, end);
  return t;
}

void VmmModel::note_unmap_locked(VmmTicket &t, Reservation &r, std::uint64_t off,
                                 std::uint64_t end) {
  for (auto it = first_after(r.maps, off); it != r.maps.end() && it->second.off < end;) {
    const Mapping m = it->second;
    t.unmapped.push_back(m);
    if (!t.mapped.known()) t.mapped = m.mapped;
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end() && t.dev < 0) t.dev = a->second.dev();
    it = erase_keep(r.maps, spare_maps_, it);
    put_reusing(r.asleep, spare_sleepers_, m.off,
                Sleeper{m.off, m.size, m.handle, m.gen, m.alloc_id, t.ev, next_gen_});
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end() && a->second.map_count)
      a->second.map_count--;
    drop_if_dead_locked(m.alloc_id, &t, t.freed);
  }
  t.noted = true;
}

void VmmModel::force_unmap_locked(Reservation &r, std::uint64_t off, std::uint64_t end,
                                  const EventRef &ev, VmmFreed &freed) {
  for (auto it = first_after(r.maps, off); it != r.maps.end() && it->second.off < end;) {
    const Mapping m = it->second;
    it = erase_keep(r.maps, spare_maps_, it);
    put_reusing(r.asleep, spare_sleepers_, m.off,
                Sleeper{m.off, m.size, m.handle, m.gen, m.alloc_id, ev, next_gen_});
    if (auto a = allocs_.find(m.alloc_id); a != allocs_.end() && a->second.map_count)
      a->second.map_count--;
    drop_if_dead_locked(m.alloc_id, nullptr, freed);
  }
}

void VmmModel::end_unmap_locked(VmmTicket &t, bool ok) {
  Reservation *r = res_containing_locked(t.va);
  if (!t.noted) {
    // The driver accepted an unmap the model expected it to refuse (a partial unmap): follow it.
    if (ok && t.finding && t.finding->cls == FindingClass::PartialUnmap && r &&
        r->gen == t.res_gen)
      force_unmap_locked(*r, t.va - r->base, t.va - r->base + t.size, t.ev, t.freed);
    return;
  }
  if (ok) return;
  // Refused: the driver still maps the ranges. Each mapping goes back where it was, with the
  // allocation that died with it — only together: if the reservation is gone (freed since, which
  // the driver can only have done after unmapping), nothing comes back, and an allocation put
  // back without its mapping would stay in the model for ever (a false leak at exit).
  if (!r || r->gen != t.res_gen) return;
  t.unmapped.each([&](const Mapping &m) {
    auto s = r->asleep.find(m.off);
    if (s != r->asleep.end() && s->second.unmapped.seq == t.ev.seq)
      erase_keep(r->asleep, spare_sleepers_, s);
    // A map noted meanwhile over the range is one the driver refuses (it is still mapped, D12):
    // undone here, with its reference to its allocation; its own end() finds it gone.
    for (auto it = first_after(r->maps, m.off);
         it != r->maps.end() && it->second.off < m.off + m.size;) {
      const std::uint64_t other = it->second.alloc_id;
      it = erase_keep(r->maps, spare_maps_, it);
      if (auto a = allocs_.find(other); a != allocs_.end() && a->second.map_count)
        a->second.map_count--;
      VmmFreed gone;
      drop_if_dead_locked(other, nullptr, gone);
    }
    put_reusing(r->maps, spare_maps_, m.off, m);
    if (PhysAlloc *a = undo_drop_locked(t, m.alloc_id)) a->map_count++;
  });
  t.freed = {};
}

// ---------------------------------------------------------------------------------------------
// Release.

VmmTicket VmmModel::begin_release(std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts,
                                  const Options &o) {
  VmmTicket t;
  t.op = VmmTicket::Op::Release;
  t.value = handle;
  t.ev = ev;
  // Not ended here: the next release of this thread may pair with the same no-op unmap.
  const bool paired = ts.pending;
  std::lock_guard lk(mu_);
  t.gen_floor = next_gen_;
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    // A record is forgotten only while its value is released (remember_released_locked), and a
    // value issued again through a hooked call has one: a sleeping range of the paired no-op unmap
    // backed by this value names a release whose record aged out (a thread descheduled between its
    // sleep and its free while asleep). That is a double release, proven as one.
    if (paired)
      if (const auto l = paired_forgotten_locked(ts, handle)) {
        t.finding = vmm_findings::released_again_forgotten(handle, ts, *l);
        t.decision = decide(o, FindingClass::DoubleRelease, trusted());
        if (!t.decision.skip && !t.decision.abort_first) rests_on_freed(t.decision);
        return t;
      }
    t.finding = vmm_findings::release_unknown(handle);
    t.decision = decide(o, FindingClass::ReleaseUnknown, false);
    return t;
  }
  HandleRec &h = it->second;
  if (h.refs > 0) {
    // The sleeping ranges of the no-op unmap: the eight it copied, then (past eight) one still
    // asleep in the reservation with this value in an older generation.
    ThreadVmmState::Last beyond{};
    const unsigned n = paired ? ts.nlast + (ts.more ? 1 : 0) : 0;
    for (unsigned i = 0; i < n; ++i) {
      if (i == ts.nlast) {
        const Sleeper *s = paired_beyond_locked(ts, handle, h.gen);
        if (!s) break;
        beyond = ThreadVmmState::Last{s->handle, s->gen, s->alloc_id, s->unmapped};
      }
      const ThreadVmmState::Last &l = i < ts.nlast ? ts.last[i] : beyond;
      if (l.handle != handle || l.gen == h.gen) continue;
      // The value was issued again since the range went to sleep. Issued to another thread, the
      // new generation is not this thread's to release; issued to this thread, it is someone's
      // live memory when it is mapped (P02) — a wake-up whose map failed releases its fresh,
      // unmapped handle the same way, and that release is legitimate.
      const auto a = allocs_.find(h.alloc_id);
      const bool mapped = a != allocs_.end() && a->second.map_count > 0;
      if (h.issued.tid == ev.tid && !mapped) continue;
      t.finding = vmm_findings::stale_release_paired(handle, ts, l, h);
      t.decision = decide(o, FindingClass::StaleRelease, trusted());
      if (t.decision.skip || t.decision.abort_first) return t;
      break;  // forwarded (report mode): the driver releases the new generation; follow it
    }
    note_release_locked(t, h);
    return t;
  }
  // The value is not live: a second release of it. Before a re-issuing create has returned to the
  // shim, this is still the value's current generation, so the release is skipped as a double
  // release rather than forwarded to destroy the new owner's handle.
  bool replaced = false;
  EventRef replaced_by;
  if (h.ever_mapped) {
    if (auto r = res_.find(h.last_res); r != res_.end()) {
      auto m = r->second.maps.find(h.last_off);
      if (m != r->second.maps.end() && m->second.alloc_id != h.alloc_id) {
        replaced = true;
        replaced_by = m->second.mapped;
      }
      auto s = r->second.asleep.find(h.last_off);
      if (s != r->second.asleep.end() && s->second.alloc_id != h.alloc_id) {
        replaced = true;
        replaced_by = s->second.unmapped;
      }
    }
  }
  t.finding = vmm_findings::released_again(handle, h, replaced, replaced_by);
  t.decision = decide(o, t.finding->cls, trusted());
  // A skip is proven from what the shim saw (handle values carry a generation); the driver is not
  // asked: cuMemGetAllocationPropertiesFromHandle answers a released value with SUCCESS as it
  // answers a live one (real-driver.md D23, measured on the H200), so its answer proves nothing,
  // and taking it for "live" forwarded every double release (the program got INVALID_VALUE, as
  // without the shim). A release forwarded anyway (report mode, ACTION=forward) is judged by the
  // driver's answer to it: accepted, the value had been issued again unseen. A handle issued again
  // through a path the shim does not see is otherwise not told apart (docs/limitations.md).
  if (!t.decision.skip && !t.decision.abort_first) rests_on_freed(t.decision);
  return t;
}

std::optional<ThreadVmmState::Last> VmmModel::paired_forgotten_locked(const ThreadVmmState &ts,
                                                                      std::uint64_t handle) const {
  for (unsigned i = 0; i < ts.nlast; ++i)
    if (ts.last[i].handle == handle && ts.last[i].alloc_id) return ts.last[i];
  if (!ts.more) return std::nullopt;
  // Past the eighth: a range still asleep in the reservation (generation 0 is never issued).
  const Sleeper *s = paired_beyond_locked(ts, handle, 0);
  if (!s || !s->alloc_id) return std::nullopt;
  return ThreadVmmState::Last{s->handle, s->gen, s->alloc_id, s->unmapped};
}

const Sleeper *VmmModel::paired_beyond_locked(const ThreadVmmState &ts, std::uint64_t handle,
                                              std::uint64_t gen) const {
  auto r = res_.find(ts.res_base);
  if (r == res_.end() || r->second.gen != ts.res_gen) return nullptr;
  const std::uint64_t end = ts.base - r->second.base + ts.size;
  for (auto it = r->second.asleep.lower_bound(ts.beyond);
       it != r->second.asleep.end() && it->second.off < end; ++it) {
    const Sleeper &s = it->second;
    if (s.handle == handle && s.gen != gen && s.since <= ts.mark) return &s;
  }
  return nullptr;
}

void VmmModel::note_release_locked(VmmTicket &t, HandleRec &h) {
  h.refs--;
  t.gen = h.gen;
  t.alloc_id = h.alloc_id;
  t.noted = true;
  if (auto a = allocs_.find(h.alloc_id); a != allocs_.end() && a->second.handle_refs)
    a->second.handle_refs--;
  drop_if_dead_locked(h.alloc_id, &t, t.freed);
  if (h.refs == 0) {
    h.released = t.ev;
    remember_released_locked(h);  // last: it may forget an older record, never this one's use
  }
}

void VmmModel::end_release_locked(VmmTicket &t, bool ok) {
  if (!t.noted || ok) return;
  // Refused: the driver kept the reference, so the value was never free at the driver.
  auto h = handles_.find(t.value);
  if (h == handles_.end()) return;
  // A newer generation of the value seen meanwhile can only be the driver handing out this same
  // live value again: a retain of the same allocation (real-driver.md D16) that the model took
  // for a re-issue because it had noted the reference gone. It is the same issue: the reference
  // goes back to it. Any other newer generation is not this release's to touch.
  // Generations, not sequence numbers: a retain is stamped when it enters the shim, possibly
  // before this release began, yet the model hears of it after this release noted the reference
  // gone; its generation is then at least the floor this release saw.
  const bool same_issue = h->second.gen == t.gen || (h->second.alloc_id == t.alloc_id &&
                                                     h->second.gen >= t.gen_floor);
  if (!same_issue) return;
  if (h->second.refs++ == 0) h->second.released = {};
  if (PhysAlloc *a = undo_drop_locked(t, h->second.alloc_id)) a->handle_refs++;
  t.freed = {};
}

// ---------------------------------------------------------------------------------------------
// Address free.

VmmTicket VmmModel::begin_address_free(std::uint64_t base, std::uint64_t size, const EventRef &ev,
                                       ThreadVmmState &ts, const Options &o) {
  ts.pending = false;
  VmmTicket t;
  t.op = VmmTicket::Op::AddressFree;
  t.va = base;
  t.size = size;
  t.ev = ev;
  std::lock_guard lk(mu_);
  auto it = res_.find(base);
  if (it == res_.end()) {
    auto f = freed_res_.find(base);
    if (f != freed_res_.end() && !res_containing_locked(base)) {
      t.finding = vmm_findings::double_address_free(base, size, f->second.second);
      t.decision = decide(o, FindingClass::DoubleAddressFree, false);
    }
    return t;
  }
  Reservation &r = it->second;
  if (size != r.size) return t;  // the driver refuses a wrong size (real-driver.md D14)
  t.res_gen = r.gen;
  if (!r.maps.empty()) {
    t.finding = vmm_findings::free_mapped_va(base, size, r);
    t.decision = decide(o, FindingClass::FreeMappedVa, false);
    return t;
  }
  if (r.freeing) {
    // Another thread's free of it is in flight: the driver accepts one of the two. Not noted;
    // if this one is accepted, the model follows.
    t.follow = true;
    return t;
  }
  // Noted as a mark, not by taking the reservation out: what the call changes is undone by
  // clearing the mark (an inverse delta checked against the reservation's generation), never by
  // writing a copy back over what other threads did meanwhile.
  r.freeing = ev.seq;
  remember_freed_res_locked(base, size, ev);
  counters_.add(-1, MemKind::Va, -static_cast<std::int64_t>(size));
  t.va_freed = true;
  t.noted = true;
  return t;
}

void VmmModel::end_address_free_locked(VmmTicket &t, bool ok) {
  auto it = res_.find(t.va);
  const bool same = it != res_.end() && it->second.gen == t.res_gen;
  if (!t.noted) {
    if (!ok || !same) return;
    if (t.finding && t.finding->cls != FindingClass::FreeMappedVa) return;
    // The driver freed a reservation the model holds mappings in, or that another thread's free
    // was freeing: follow it.
    erase_res_locked(it, t.freed);
    remember_freed_res_locked(t.va, t.size, t.ev);
    t.va_freed = true;
    return;
  }
  if (!same || it->second.freeing != t.ev.seq) {
    // Gone already: the driver handed the range out again (on_reserve removed it) or another
    // free was accepted. Nothing of this call is left to complete or undo.
    t.va_freed = ok;
    return;
  }
  if (ok) {
    // Any mapping in it was made meanwhile by a map the driver refused (the range was going).
    erase_res_locked(it, t.freed);
    return;
  }
  // Refused: the mark goes, with the bytes and the record of the free; maps made meanwhile stay.
  it->second.freeing = 0;
  counters_.add(-1, MemKind::Va, static_cast<std::int64_t>(it->second.size));
  t.va_freed = false;
  if (auto f = freed_res_.find(t.va); f != freed_res_.end() && f->second.second.seq == t.ev.seq)
    erase_keep(freed_res_, spare_freed_res_, f);
}

// ---------------------------------------------------------------------------------------------

VmmFreed VmmModel::end(VmmTicket &t, bool ok) {
  if (t.op == VmmTicket::Op::None) return {};
  // A call that succeeded as noted, or one the model noted nothing for and has nothing to follow
  // (its va_state was read under begin's lock): no second locked pass.
  if (ok && t.noted && t.op != VmmTicket::Op::AddressFree) return t.freed;
  if (!t.noted && (!(t.finding || t.follow) || !ok)) return t.freed;
  std::lock_guard lk(mu_);
  switch (t.op) {
    case VmmTicket::Op::Map: end_map_locked(t, ok); break;
    case VmmTicket::Op::Unmap: end_unmap_locked(t, ok); break;
    case VmmTicket::Op::Release: end_release_locked(t, ok); break;
    case VmmTicket::Op::AddressFree: end_address_free_locked(t, ok); break;
    case VmmTicket::Op::None: break;
  }
  if (!ok && t.noted && (t.op == VmmTicket::Op::Map || t.op == VmmTicket::Op::Unmap))
    t.va_state = range_state_locked(t.va, t.size);  // after the undo: as it was before the call
  return t.freed;
}

}  // namespace cmg
