// SPDX-License-Identifier: Apache-2.0
// The linear-memory model: see linear_model.h for the rules.
#include "linear_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "lock_within.h"
#include "text.h"
#include "vmm_model.h"

namespace cmg {

namespace {

constexpr std::uint32_t kNone = UINT32_MAX;

std::uint32_t rec_of(std::uint64_t slot) {
  return static_cast<std::uint32_t>(slot) - 1;
}
std::uint32_t tag_of(std::uint64_t slot) {
  return static_cast<std::uint32_t>(slot >> 32);
}
std::uint64_t slot_for(std::uint32_t tag, std::uint32_t rec) {
  return (static_cast<std::uint64_t>(tag) << 32) | (static_cast<std::uint64_t>(rec) + 1);
}

}  // namespace

__attribute__((always_inline)) inline LinearModel::Rec *LinearModel::find(const Shard &s,
                                                                          std::uint64_t ptr) {
  if (s.index.empty()) return nullptr;
  const std::uint32_t h = hash_of(ptr);
  const std::size_t mask = s.index.size() - 1;
  for (std::size_t i = h & mask;; i = (i + 1) & mask) {
    const std::uint64_t e = s.index[i];
    if (e == 0) return nullptr;
    if (tag_of(e) == h) {
      Rec &r = s.at(rec_of(e));
      if (r.rec.ptr == ptr) return &r;
    }
  }
}

void LinearModel::grow(Shard &s) {
  // Doubles the index (the first one has 64 slots) and puts every entry at its new place: the
  // tag is the full 32-bit hash, so no record is read.
  const std::size_t cap = s.index.empty() ? 64 : s.index.size() * 2;
  std::vector<std::uint64_t> next(cap, 0);
  for (const std::uint64_t e : s.index) {
    if (e == 0) continue;
    std::size_t i = tag_of(e) & (cap - 1);
    while (next[i] != 0) i = (i + 1) & (cap - 1);
    next[i] = e;
  }
  s.index.swap(next);
}

LinearModel::Rec &LinearModel::insert(Shard &s, std::uint64_t ptr) {
  if ((static_cast<std::size_t>(s.in_index) + 1) * 4 > s.index.size() * 3) grow(s);
  std::uint32_t r;
  if (s.unused != kNone) {
    r = s.unused;
    s.unused = s.at(r).slot;
  } else {
    r = s.recs_made++;
    if ((r >> kBlockShift) == s.blocks.size())
      s.blocks.push_back(std::make_unique<Rec[]>(std::size_t{1} << kBlockShift));
  }
  const std::uint32_t h = hash_of(ptr);
  const std::size_t mask = s.index.size() - 1;
  std::size_t i = h & mask;
  while (s.index[i] != 0) i = (i + 1) & mask;
  s.index[i] = slot_for(h, r);
  ++s.in_index;
  Rec &rec = s.at(r);
  rec.rec.ptr = ptr;
  return rec;
}

void LinearModel::drop(Shard &s, std::uint64_t ptr) {
  if (s.index.empty()) return;
  const std::uint32_t h = hash_of(ptr);
  const std::size_t mask = s.index.size() - 1;
  std::size_t i = h & mask;
  for (;; i = (i + 1) & mask) {
    const std::uint64_t e = s.index[i];
    if (e == 0) return;
    if (tag_of(e) == h && s.at(rec_of(e)).rec.ptr == ptr) break;
  }
  const std::uint32_t r = rec_of(s.index[i]);
  // Backward shift: each later entry of the run that may move into the hole does (its home slot
  // is not in the cyclic range (hole, its slot]), so a look-up never meets a hole inside its run.
  for (std::size_t j = (i + 1) & mask;; j = (j + 1) & mask) {
    const std::uint64_t e = s.index[j];
    if (e == 0) break;
    const std::size_t home = tag_of(e) & mask;
    if (((j - home) & mask) >= ((j - i) & mask)) {
      s.index[i] = e;
      i = j;
    }
  }
  s.index[i] = 0;
  --s.in_index;
  Rec &rec = s.at(r);
  rec.st = St::Unused;
  rec.slot = s.unused;
  s.unused = r;
}

__attribute__((always_inline)) inline void LinearModel::remember_freed(Shard &s, Rec &r,
                                                                       std::uint64_t ptr,
                                                                       const EventRef &ev) {
  r.st = St::Freed;
  r.gen = ++s.gen;
  if (s.freed_ring.size() < kFreedPerShard) [[likely]] {
    r.slot = static_cast<std::uint32_t>(s.freed_ring.size());
    s.freed_ring.push_back(FreedSlot{ptr, ev});
    return;
  }
  remember_in_full_ring(s, r, ptr, ev);
}

void LinearModel::remember_in_full_ring(Shard &s, Rec &r, std::uint64_t ptr, const EventRef &ev) {
  // Bounded history: forget the oldest free (the driver will have re-issued most addresses by
  // then) — but only if the address's current record is that free, not a later one or a live
  // allocation.
  const std::size_t at = s.fifo_head;
  const FreedSlot old = s.freed_ring[at];
  s.freed_ring[at] = FreedSlot{ptr, ev};
  r.slot = static_cast<std::uint32_t>(at);
  s.fifo_head = (s.fifo_head + 1) % kFreedPerShard;
  // The address freed now holds this free, newer than any entry of the ring: nothing to forget
  // (the driver's re-issue of the last freed address, D18, makes this the common case).
  if (old.ptr == ptr) return;
  Rec *o = find(s, old.ptr);
  if (o && o->st == St::Freed && o->slot == at) drop(s, old.ptr);
}

void LinearModel::on_alloc(const LinearRec &rec) {
  Shard &s = shards_[shard_of(rec.ptr)];
  std::lock_guard lk(s.mu);
  Rec *r = find(s, rec.ptr);
  // The address issued again: its old free no longer says anything (a live record here is one
  // whose free the model missed; the driver's answer wins).
  if (!r) r = &insert(s, rec.ptr);
  if (r->st == St::Held) unhold(s, *r);  // its held free went to the driver, not yet given back
  if (r->st != St::Live) ++s.live_n;
  r->rec = rec;
  r->st = St::Live;
  r->gen = ++s.gen;
  s.changed = true;
}

void LinearModel::unhold(Shard &s, Rec &r) {
  s.held_slots[r.slot].next_unused = s.held_unused;
  s.held_unused = r.slot;
}

void LinearModel::hold(Shard &s, Rec &r, const EventRef &ev) {
  std::uint32_t h;
  if (s.held_unused != kNone) {
    h = s.held_unused;
    s.held_unused = s.held_slots[h].next_unused;
    s.held_slots[h].free = ev;
  } else {
    h = static_cast<std::uint32_t>(s.held_slots.size());
    s.held_slots.push_back(HeldSlot{ev});
  }
  r.st = St::Held;
  r.slot = h;
  r.gen = ++s.gen;
}

__attribute__((always_inline)) inline bool LinearModel::classify_fast(LinearTicket &v,
                                                                      std::uint64_t ptr,
                                                                      KindMask accepted,
                                                                      KindMask hold_kinds,
                                                                      const EventRef &ev) {
  v.this_free = ev;
  if (ptr == 0) {
    v.cls = FreeClass::Null;
    return true;
  }
  {
    Shard &s = shards_[shard_of(ptr)];
    std::lock_guard lk(s.mu);
    Rec *r = find(s, ptr);
    if (r && r->st == St::Live) {
      v.rec = r->rec;
      if (!(accepted & kind_bit(r->rec.kind))) {
        v.cls = FreeClass::WrongKind;
        return false;
      }
      v.cls = FreeClass::Live;
      --s.live_n;
      s.changed = true;
      // Held at once (the caller holds this kind back): the bounded history gets the free only
      // when it is given back, once.
      if (hold_kinds & kind_bit(r->rec.kind)) {
        hold(s, *r, ev);
        v.holding = true;
      } else {
        remember_freed(s, *r, ptr, ev);
      }
      v.gen = r->gen;
      return true;
    }
    if (r && r->st == St::Held) {
      // The shim still holds this address's free (quarantine, deferred): the program freed it
      // before and the driver has not, so forwarding would free it twice. No live allocation can
      // cover it (the driver still has the memory).
      v.cls = FreeClass::DoubleFree;
      v.held = true;
      v.rec = r->rec;
      v.first_free = s.held_slots[r->slot].free;
      v.gen = r->gen;
      return false;
    }
  }
  return false;
}

void LinearModel::classify_slow(LinearTicket &v, std::uint64_t ptr) {
  // Slow path (only for frees that are not a live or held base address): an interior pointer, or
  // a double free, which is proven only when no live allocation covers the address now.
  if (auto c = find_containing(ptr)) {
    v.rec = *c;
    v.cls = FreeClass::Interior;
    return;
  }
  Shard &s = shards_[shard_of(ptr)];
  std::lock_guard lk(s.mu);
  Rec *f = find(s, ptr);
  if (f && f->st == St::Freed) {
    v.cls = FreeClass::DoubleFree;
    v.rec = f->rec;
    v.first_free = s.freed_ring[f->slot].free;
    v.gen = f->gen;
    return;
  }
  if (f && f->st == St::Held) {  // held since the first look (a concurrent free of the address)
    v.cls = FreeClass::DoubleFree;
    v.held = true;
    v.rec = f->rec;
    v.first_free = s.held_slots[f->slot].free;
    v.gen = f->gen;
    return;
  }
  v.cls = FreeClass::Unknown;
}

void LinearModel::judge(LinearTicket &t, std::uint64_t ptr, const Options &o, const VmmModel *vmm) {
  if (t.cls == FreeClass::Unknown) classify_slow(t, ptr);  // not classified under the first lock
  if (t.cls == FreeClass::Unknown || t.cls == FreeClass::Interior) {
    if (auto res = vmm ? vmm->reservation_range(ptr) : std::nullopt) {
      t.cls = FreeClass::InVmm;
      t.vmm_base = res->first;
      t.vmm_size = res->second;
    }
  }
  t.finding = std::make_unique<Finding>(finding_for_free(t, t.this_free.api, ptr));
  t.decision = decide_free(o, t, trusted());
}

LinearTicket LinearModel::begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev,
                                     const Options &o, const VmmModel *vmm, KindMask hold_kinds) {
  LinearTicket t;
  if (classify_fast(t, ptr, accepted, hold_kinds, ev)) [[likely]]
    return t;
  judge(t, ptr, o, vmm);
  return t;
}

LinearTicket LinearModel::begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev) {
  static const Options defaults{};
  return begin_free(ptr, accepted, ev, defaults, nullptr);
}

void LinearModel::end_changed(const LinearTicket &t, bool unseen) {
  Shard &s = shards_[shard_of(t.rec.ptr)];
  std::lock_guard lk(s.mu);
  // The record this free made (or judged), not a later one: the generation keeps a misused ticket
  // (a second end(), or one after the address was issued and freed again) from changing anything.
  Rec *f = find(s, t.rec.ptr);
  if (!f || f->st != St::Freed || f->gen != t.gen) return;
  if (unseen) {
    // The address had been issued again through a path the shim does not see, and the driver
    // freed it now: the free the model remembers is this one.
    remember_freed(s, *f, t.rec.ptr, t.this_free);
    return;
  }
  // The inverse of this free only: the driver refused it, so the address was never free and
  // nothing can have been issued there since.
  f->rec = t.rec;
  f->st = St::Live;
  f->gen = ++s.gen;
  ++s.live_n;
  s.changed = true;
}

std::uint32_t LinearModel::mark_held(const LinearTicket &t) {
  if (t.cls != FreeClass::Live) return 0;
  Shard &s = shards_[shard_of(t.rec.ptr)];
  std::lock_guard lk(s.mu);
  Rec *f = find(s, t.rec.ptr);
  if (!f || f->st != St::Freed || f->gen != t.gen) return 0;
  // The free's slot in the bounded history stays behind, stale: its overwrite drops only a Freed
  // record that still names it.
  hold(s, *f, t.this_free);
  return f->gen;
}

std::uint32_t LinearModel::given_back(std::uint64_t ptr, std::uint32_t gen) {
  if (gen == 0) return 0;
  Shard &s = shards_[shard_of(ptr)];
  std::lock_guard lk(s.mu);
  Rec *f = find(s, ptr);
  if (!f || f->st != St::Held || f->gen != gen) return 0;
  const EventRef ev = s.held_slots[f->slot].free;
  unhold(s, *f);
  remember_freed(s, *f, ptr, ev);
  return f->gen;
}

const LinearRec *LinearModel::containing_in(const Shard &s, std::uint64_t p) {
  if (s.changed) {
    // Rebuilt from the records (the slow path pays for the common path's not keeping an order):
    // the array keeps its capacity, so a rebuild allocates only when the shard has grown.
    s.ranges.clear();
    for (std::uint32_t r = 0; r < s.recs_made; ++r) {
      const Rec &x = s.at(r);
      if (x.st == St::Live) s.ranges.push_back(Range{x.rec.ptr, x.rec.ptr + x.rec.size, r});
    }
    std::sort(s.ranges.begin(), s.ranges.end(),
              [](const Range &a, const Range &b) { return a.base < b.base; });
    s.changed = false;
  }
  // Live allocations do not overlap: only the nearest live range at or below p can contain it.
  auto it = std::upper_bound(s.ranges.begin(), s.ranges.end(), p,
                             [](std::uint64_t q, const Range &r) { return q < r.base; });
  if (it == s.ranges.begin()) return nullptr;
  --it;
  const LinearRec &r = s.at(it->rec).rec;
  return p >= it->base && (p < it->end || p == it->base) ? &r : nullptr;
}

std::optional<LinearRec> LinearModel::find_containing(std::uint64_t p) const {
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    if (s.live_n == 0) continue;
    if (const LinearRec *r = containing_in(s, p)) return *r;
  }
  return std::nullopt;
}

std::size_t LinearModel::live_count() const {
  std::size_t n = 0;
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    n += s.live_n;
  }
  return n;
}

void LinearModel::for_each_live(FnRef<void(const LinearRec &)> fn) const {
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    for (std::uint32_t r = 0; r < s.recs_made; ++r)
      if (s.at(r).st == St::Live) fn(s.at(r).rec);
  }
}

std::size_t LinearModel::for_each_live_within(FnRef<void(const LinearRec &)> fn,
                                              std::uint64_t patience_ns) const {
  std::size_t skipped = 0;
  for (const Shard &s : shards_) {
    if (!lock_within(s.mu, patience_ns)) {
      ++skipped;
      continue;
    }
    std::lock_guard lk(s.mu, std::adopt_lock);
    for (std::uint32_t r = 0; r < s.recs_made; ++r)
      if (s.at(r).st == St::Live) fn(s.at(r).rec);
  }
  return skipped;
}

void LinearModel::fork_child() {
  // No destructor runs on the old shard: its lock may be held by a thread that does not exist
  // here, and its table may be half-changed. Its bytes are kept in a block that stays referenced,
  // so that what the old table points to is reachable, not leaked (LeakSanitizer checks children).
  static void *kept = nullptr;  // a chain: a child of a child keeps its parent's too
  if (auto *k = static_cast<unsigned char *>(std::malloc(sizeof(void *) + sizeof(shards_)))) {
    std::memcpy(k, &kept, sizeof(void *));
    std::memcpy(k + sizeof(void *), static_cast<const void *>(&shards_), sizeof(shards_));
    kept = k;
  }
  for (Shard &s : shards_) new (&s) Shard();
}

void LinearModel::clear() {
  for (Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    s.index.clear();
    s.blocks.clear();
    s.recs_made = 0;
    s.unused = kNone;
    s.in_index = 0;
    s.live_n = 0;
    s.freed_ring.clear();
    s.fifo_head = 0;
    s.held_slots.clear();
    s.held_unused = kNone;
    s.ranges.clear();
    s.changed = false;
  }
}

Finding finding_for_free(const FreeVerdict &v, const char *api, std::uint64_t ptr) {
  Finding f;
  const std::string p = hex(ptr);
  const std::string who = std::string(api ? api : "free");
  switch (v.cls) {
    case FreeClass::DoubleFree:
      f.cls = FindingClass::DoubleFree;
      f.msg = who + " of " + p + ", which was already freed at " + at_seq(v.first_free) +
              "; it was allocated at " + at_seq(v.rec.alloc) + " (" + std::to_string(v.rec.size) +
              " bytes, " + std::string(mem_kind_name(v.rec.kind)) + ")";
      f.related.push_back({"allocation", v.rec.alloc});
      f.related.push_back({"first free", v.first_free});
      f.bytes = v.rec.size;
      break;
    case FreeClass::Interior:
      f.cls = FindingClass::InvalidFree;
      f.msg = who + " of " + p + ", which is " + std::to_string(ptr - v.rec.ptr) +
              " bytes inside the allocation at " + hex(v.rec.ptr) + " (" +
              std::to_string(v.rec.size) + " bytes, allocated at " + at_seq(v.rec.alloc) +
              "); only the base address can be freed";
      f.related.push_back({"allocation", v.rec.alloc});
      break;
    case FreeClass::WrongKind:
      f.cls = FindingClass::InvalidFree;
      f.msg = who + " of " + p + ", which is " + std::string(mem_kind_name(v.rec.kind)) +
              " memory allocated by " + (v.rec.alloc.api ? v.rec.alloc.api : "an earlier call") +
              " at " + at_seq(v.rec.alloc) + "; it must be freed by the matching API";
      f.related.push_back({"allocation", v.rec.alloc});
      break;
    case FreeClass::InVmm:
      f.cls = FindingClass::InvalidFree;
      f.msg = who + " of " + p + ", which lies in the VMM reservation at " + hex(v.vmm_base) +
              " (+" + std::to_string(v.vmm_size) +
              " bytes): VMM memory is released with cuMemUnmap, cuMemRelease and cuMemAddressFree";
      break;
    default:
      f.cls = FindingClass::InvalidFree;
      f.msg = who + " of " + p +
              ", which was never allocated in this process (or not through "
              "an API the shim sees)";
      break;
  }
  return f;
}

Decision decide_free(const Options &o, const FreeVerdict &v, bool trusted) {
  const bool dbl = v.cls == FreeClass::DoubleFree;
  const bool async = v.rec.kind == MemKind::Async;
  const FindingClass c = dbl ? FindingClass::DoubleFree : FindingClass::InvalidFree;
  Decision d = decide(o, c, dbl && !async && trusted, dbl && async);
  if (dbl && !async && !v.held) rests_on_freed(d);
  return d;
}

Finding unseen_free(const FreeVerdict &v, const char *api, std::uint64_t ptr,
                    const DriverView &dv) {
  Finding f;
  f.cls = FindingClass::UnseenReissue;
  f.msg = std::string(api ? api : "free") + " of " + hex(ptr) + ", which the shim saw freed at " +
          at_seq(v.first_free) + " (" + std::to_string(v.rec.size) + " bytes, " +
          std::string(mem_kind_name(v.rec.kind)) +
          ") and never allocated again, but the driver holds it live: it was issued again "
          "through " +
          (dv.path ? std::string(dv.path) : std::string(kUnseenPaths)) +
          "; forwarded (the driver freed it)";
  f.related.push_back({"allocation", v.rec.alloc});
  f.related.push_back({"earlier free", v.first_free});
  f.state_json = "{\"ptr\":\"" + hex(ptr) + "\",\"model\":\"double-free\",\"driver\":\"live\"}";
  return f;
}

}  // namespace cmg
