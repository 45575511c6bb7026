// SPDX-License-Identifier: Apache-2.0
// The linear-memory model: see linear_model.h for the rules.
#include "linear_model.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include "lock_within.h"
#include "node_reuse.h"
#include "text.h"

namespace cmg {

using detail::recycle;

void LinearModel::drop(Shard &s, RecMap::iterator it) { recycle(s.spare, s.recs.extract(it)); }

void LinearModel::remember_freed(Shard &s, Rec &r, std::uint64_t ptr, const EventRef &ev) {
  r.freed = true;
  if (s.freed_ring.size() < kFreedPerShard) {
    r.slot = static_cast<std::uint32_t>(s.freed_ring.size());
    s.freed_ring.push_back(FreedSlot{ptr, ev});
    return;
  }
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
  auto it = s.recs.find(old.ptr);
  if (it != s.recs.end() && it->second.freed && it->second.slot == at) drop(s, it);
}

void LinearModel::on_alloc(const LinearRec &rec) {
  Shard &s = shards_[shard_of(rec.ptr)];
  std::lock_guard lk(s.mu);
  auto it = s.recs.lower_bound(rec.ptr);
  if (it != s.recs.end() && it->first == rec.ptr) {
    // The address is issued again: its old free no longer says anything (a live record here is
    // one whose free the model missed; the driver's answer wins).
    if (it->second.freed) ++s.live_n;
    it->second = Rec{rec, 0, false};
    return;
  }
  ++s.live_n;
  if (s.spare.empty()) {
    s.recs.emplace_hint(it, rec.ptr, Rec{rec, 0, false});
    return;
  }
  RecMap::node_type nh = std::move(s.spare.back());
  s.spare.pop_back();
  nh.key() = rec.ptr;
  nh.mapped() = Rec{rec, 0, false};
  s.recs.insert(it, std::move(nh));
}

FreeVerdict LinearModel::begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev) {
  FreeVerdict v;
  if (ptr == 0) {
    v.cls = FreeClass::Null;
    return v;
  }
  {
    Shard &s = shards_[shard_of(ptr)];
    std::lock_guard lk(s.mu);
    auto it = s.recs.find(ptr);
    if (it != s.recs.end() && !it->second.freed) {
      Rec &r = it->second;
      v.rec = r.rec;
      if (!(accepted & kind_bit(r.rec.kind))) {
        v.cls = FreeClass::WrongKind;
        return v;
      }
      v.cls = FreeClass::Live;
      v.this_free = ev;
      --s.live_n;
      remember_freed(s, r, ptr, ev);
      return v;
    }
  }
  // Slow path (only for frees that are not a live base address): an interior pointer, or a
  // double free, which is proven only when no live allocation covers the address now.
  if (auto c = find_containing(ptr)) {
    v.rec = *c;
    v.cls = FreeClass::Interior;
    return v;
  }
  Shard &s = shards_[shard_of(ptr)];
  std::lock_guard lk(s.mu);
  auto f = s.recs.find(ptr);
  if (f != s.recs.end() && f->second.freed) {
    v.cls = FreeClass::DoubleFree;
    v.rec = f->second.rec;
    v.first_free = s.freed_ring[f->second.slot].free;
    return v;
  }
  v.cls = FreeClass::Unknown;
  return v;
}

void LinearModel::rollback(const FreeVerdict &v) {
  if (v.cls != FreeClass::Live) return;
  Shard &s = shards_[shard_of(v.rec.ptr)];
  std::lock_guard lk(s.mu);
  // The inverse of this free only: the driver refused it, so the address was never free and
  // nothing can have been issued there since; the check keeps that true if a caller misuses it.
  auto f = s.recs.find(v.rec.ptr);
  if (f == s.recs.end() || !f->second.freed ||
      s.freed_ring[f->second.slot].free.seq != v.this_free.seq)
    return;
  f->second = Rec{v.rec, 0, false};
  ++s.live_n;
}

void LinearModel::refreed(const FreeVerdict &v, const EventRef &ev) {
  if (v.cls != FreeClass::DoubleFree) return;
  Shard &s = shards_[shard_of(v.rec.ptr)];
  std::lock_guard lk(s.mu);
  auto f = s.recs.find(v.rec.ptr);
  if (f == s.recs.end() || !f->second.freed ||
      s.freed_ring[f->second.slot].free.seq != v.first_free.seq)
    return;  // issued again
  remember_freed(s, f->second, v.rec.ptr, ev);
}

const LinearRec *LinearModel::containing_in(const Shard &s, std::uint64_t p) {
  // Live allocations do not overlap: only the nearest live record at or below p can contain it.
  // Freed records between it and p are stepped over (this is the slow path of a free that is not
  // a live base address; the history bounds them, kFreedPerShard).
  auto it = s.recs.upper_bound(p);
  while (it != s.recs.begin()) {
    --it;
    if (it->second.freed) continue;
    const LinearRec &r = it->second.rec;
    return p >= r.ptr && (p < r.ptr + r.size || p == r.ptr) ? &r : nullptr;
  }
  return nullptr;
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
    for (const auto &[p, r] : s.recs)
      if (!r.freed) fn(r.rec);
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
    for (const auto &[p, r] : s.recs)
      if (!r.freed) fn(r.rec);
  }
  return skipped;
}

void LinearModel::fork_child() {
  // No destructor runs on the old shard: its lock may be held by a thread that does not exist
  // here, and its maps may be half-changed. Its bytes are kept in a block that stays referenced,
  // so that what the old maps point to is reachable, not leaked (LeakSanitizer checks children).
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
    s.recs.clear();
    s.live_n = 0;
    s.freed_ring.clear();
    s.fifo_head = 0;
    s.spare.clear();
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
      f.msg = who + " of " + p + ", which was never allocated in this process (or not through "
              "an API the shim sees)";
      break;
  }
  return f;
}

Decision decide_free(const Options &o, const FreeVerdict &v, bool held, bool trusted) {
  const bool dbl = v.cls == FreeClass::DoubleFree;
  const bool async = v.rec.kind == MemKind::Async;
  const FindingClass c = dbl ? FindingClass::DoubleFree : FindingClass::InvalidFree;
  Decision d = decide(o, c, dbl && !async && trusted, dbl && async);
  if (dbl && !async && !held) rests_on_freed(d);
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
