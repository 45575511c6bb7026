// SPDX-License-Identifier: Apache-2.0
// The state model: see tracker.h for the rules. Findings are phrased here because only the model
// knows which earlier event makes a call redundant or stale.
#include "tracker.h"

#include <algorithm>
#include <new>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cmg {

std::string_view mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::Linear: return "linear";
    case MemKind::Async: return "async";
    case MemKind::Managed: return "managed";
    case MemKind::Host: return "host";
    case MemKind::Vmm: return "vmm";
    case MemKind::Va: return "va";
    case MemKind::Ipc: return "ipc";
  }
  return "?";
}

std::string hex(std::uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%" PRIx64, v);
  return buf;
}

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

// Visits the entries of an offset-keyed map of non-overlapping ranges (mappings, sleepers) that
// intersect [off, end), in O(log n + k): PyTorch's expandable segments put thousands of 20 MiB
// pages in one reservation, and every VMM call of theirs passes here.
template <class Map, class F>
void for_overlapping(Map &m, std::uint64_t off, std::uint64_t end, F &&f) {
  auto it = m.upper_bound(off);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (prev->second.off + prev->second.size > off) it = prev;
  }
  while (it != m.end() && it->second.off < end) {
    auto next = std::next(it);
    f(it);
    it = next;
  }
}

std::string at_seq(const EventRef &e) {
  if (!e.known()) return "before tracking";
  std::string s = "seq " + std::to_string(e.seq);
  if (e.api) s += std::string(" (") + e.api + ", thread " + std::to_string(e.tid) + ")";
  return s;
}
std::string range_text(std::uint64_t p, std::uint64_t size) {
  return hex(p) + " (+" + std::to_string(size) + " bytes)";
}

// Inserts or overwrites key -> value in m, taking a node from `spare` when there is one.
template <class Map, class V>
void put_reusing(Map &m, std::vector<typename Map::node_type> &spare, std::uint64_t key,
                 V &&value) {
  if (spare.empty()) {
    m.insert_or_assign(key, std::forward<V>(value));
    return;
  }
  typename Map::node_type nh = std::move(spare.back());
  spare.pop_back();
  nh.key() = key;
  nh.mapped() = std::forward<V>(value);
  auto res = m.insert(std::move(nh));
  if (!res.inserted) {
    res.position->second = std::move(res.node.mapped());
    spare.push_back(std::move(res.node));
  }
}

constexpr std::size_t kSpare = 16;  // nodes kept per kind of record

template <class Node>
void recycle(std::vector<Node> &spare, Node nh, std::size_t cap = kSpare) {
  if (nh && spare.size() < cap) spare.push_back(std::move(nh));
}  // else the handle's destructor frees the node

// Erases *it, keeping its node; returns the next iterator.
template <class Map>
typename Map::iterator erase_keep(Map &m, std::vector<typename Map::node_type> &spare,
                                  typename Map::iterator it) {
  auto next = std::next(it);
  recycle(spare, m.extract(it));
  return next;
}

// Mappings and sleeping ranges of a reservation are disjoint and keyed by offset: the first one
// that ends after `off` is the one before upper_bound(off), or upper_bound(off) itself. Walking
// from there while entries start before the end visits exactly the overlapping ones, in
// O(log n + k): PyTorch's expandable segments keep thousands of mappings in one reservation.
template <class Map>
auto first_ending_after(Map &m, std::uint64_t off) {
  auto it = m.upper_bound(off);
  if (it != m.begin()) {
    auto prev = std::prev(it);
    if (prev->second.off + prev->second.size > off) return prev;
  }
  return it;
}
}  // namespace

// ---------------------------------------------------------------------------------------------
void ByteCounters::add(int dev, MemKind kind, std::int64_t delta) {
  Cell &c = cells_[static_cast<std::size_t>(row(dev))][static_cast<std::size_t>(kind)];
  std::int64_t cur = c.current.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta > 0) {
    c.total.fetch_add(delta, std::memory_order_relaxed);
    std::int64_t peak = c.peak.load(std::memory_order_relaxed);
    while (cur > peak && !c.peak.compare_exchange_weak(peak, cur, std::memory_order_relaxed)) {
    }
  }
}

std::vector<ByteCounters::Row> ByteCounters::snapshot() const {
  std::vector<Row> rows;
  for (int r = 0; r <= kDevices; ++r)
    for (int k = 0; k < kMemKinds; ++k) {
      const Cell &c = cells_[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
      std::int64_t total = c.total.load(std::memory_order_relaxed);
      if (total == 0 && c.current.load(std::memory_order_relaxed) == 0) continue;
      rows.push_back(Row{r - 1, static_cast<MemKind>(k), c.current.load(), c.peak.load(), total});
    }
  return rows;
}

void ByteCounters::reset() {
  for (auto &r : cells_)
    for (auto &c : r) {
      c.current.store(0);
      c.peak.store(0);
      c.total.store(0);
    }
}

// ---------------------------------------------------------------------------------------------

void LinearModel::put_live(Shard &s, const LinearRec &rec) {
  put_reusing(s.live, s.spare_live, rec.ptr, rec);
}

void LinearModel::put_freed(Shard &s, const Freed &f) {
  put_reusing(s.freed, s.spare_freed, f.rec.ptr, f);
}

void LinearModel::drop_freed(Shard &s, FreedMap::iterator it) {
  recycle(s.spare_freed, s.freed.extract(it), kSpareNodes);
}

void LinearModel::remember_freed(Shard &s, const LinearRec &rec, const EventRef &ev) {
  put_freed(s, Freed{rec, ev});
  if (s.freed_fifo.size() < kFreedPerShard) {
    s.freed_fifo.emplace_back(rec.ptr, ev.seq);
    return;
  }
  // Bounded history: forget the oldest free (the driver will have re-issued most addresses by
  // then) — but only if the address's current freed record is that free, not a later one.
  const auto [old, old_seq] = s.freed_fifo[s.fifo_head];
  s.freed_fifo[s.fifo_head] = {rec.ptr, ev.seq};
  s.fifo_head = (s.fifo_head + 1) % kFreedPerShard;
  auto it = s.freed.find(old);
  if (it != s.freed.end() && it->second.free.seq == old_seq) drop_freed(s, it);
}

void LinearModel::on_alloc(const LinearRec &rec) {
  Shard &s = shards_[shard_of(rec.ptr)];
  std::lock_guard lk(s.mu);
  put_live(s, rec);
  // The address is issued again: its old free no longer says anything.
  if (auto f = s.freed.find(rec.ptr); f != s.freed.end()) drop_freed(s, f);
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
    auto it = s.live.find(ptr);
    if (it != s.live.end()) {
      v.rec = it->second;
      if (!(accepted & kind_bit(it->second.kind))) {
        v.cls = FreeClass::WrongKind;
        return v;
      }
      v.cls = FreeClass::Live;
      recycle(s.spare_live, s.live.extract(it), kSpareNodes);
      remember_freed(s, v.rec, ev);
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
  auto f = s.freed.find(ptr);
  if (f != s.freed.end()) {
    v.cls = FreeClass::DoubleFree;
    v.rec = f->second.rec;
    v.first_free = f->second.free;
    return v;
  }
  v.cls = FreeClass::Unknown;
  return v;
}

void LinearModel::rollback(const FreeVerdict &v) {
  if (v.cls != FreeClass::Live) return;
  Shard &s = shards_[shard_of(v.rec.ptr)];
  std::lock_guard lk(s.mu);
  if (auto f = s.freed.find(v.rec.ptr); f != s.freed.end()) drop_freed(s, f);
  put_live(s, v.rec);
}

std::optional<LinearRec> LinearModel::find_containing(std::uint64_t p) const {
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    auto it = s.live.upper_bound(p);
    if (it == s.live.begin()) continue;
    --it;
    const LinearRec &r = it->second;
    if (p >= r.ptr && (p < r.ptr + r.size || p == r.ptr)) return r;
  }
  return std::nullopt;
}

std::size_t LinearModel::live_count() const {
  std::size_t n = 0;
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    n += s.live.size();
  }
  return n;
}

void LinearModel::for_each_live(const std::function<void(const LinearRec &)> &fn) const {
  for (const Shard &s : shards_) {
    std::lock_guard lk(s.mu);
    for (const auto &[p, r] : s.live) fn(r);
  }
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
    s.live.clear();
    s.freed.clear();
    s.freed_fifo.clear();
    s.fifo_head = 0;
    s.spare_live.clear();
    s.spare_freed.clear();
  }
}

// ---------------------------------------------------------------------------------------------
Reservation *VmmModel::res_containing_locked(std::uint64_t p) {
  auto it = res_.upper_bound(p);
  if (it == res_.begin()) return nullptr;
  --it;
  return (p >= it->second.base && p < it->second.base + it->second.size) ? &it->second : nullptr;
}

const Reservation *VmmModel::res_containing_locked(std::uint64_t p) const {
  return const_cast<VmmModel *>(this)->res_containing_locked(p);
}

VmmModel::Freed VmmModel::drop_alloc_if_dead_locked(std::uint64_t alloc_id) {
  auto it = allocs_.find(alloc_id);
  if (it == allocs_.end()) return {};
  if (it->second.handle_refs != 0 || it->second.map_count != 0) return {};
  Freed f{it->second.size, it->second.dev()};
  counters_.add(f.dev, MemKind::Vmm, -static_cast<std::int64_t>(f.bytes));
  recycle(spare_allocs_, allocs_.extract(it));
  return f;
}

std::string VmmModel::describe_range_locked(const Reservation &r, std::uint64_t off,
                                            std::uint64_t size) const {
  // JSON array of the mapped and unmapped pieces of [off, off+size) of r.
  std::string out = "[";
  std::uint64_t cur = off, end = off + size;
  auto piece = [&](std::uint64_t a, std::uint64_t b, const Mapping *m) {
    if (out.size() > 1) out += ",";
    out += "{\"offset\":" + std::to_string(a) + ",\"size\":" + std::to_string(b - a) +
           ",\"mapped\":" + (m ? "true" : "false");
    if (m) out += ",\"handle\":\"" + hex(m->handle) + "\"";
    out += "}";
  };
  auto it = r.maps.upper_bound(off);
  if (it != r.maps.begin()) --it;
  for (; it != r.maps.end() && it->second.off < end; ++it) {
    const Mapping &m = it->second;
    if (m.off + m.size <= cur) continue;
    if (m.off > cur) piece(cur, m.off, nullptr);
    piece(std::max(cur, m.off), std::min(end, m.off + m.size), &m);
    cur = std::min(end, m.off + m.size);
  }
  if (cur < end) piece(cur, end, nullptr);
  return out + "]";
}

void VmmModel::on_create(std::uint64_t handle, std::uint64_t size, Location loc, int loc_id,
                         unsigned handle_types, bool imported, const EventRef &ev) {
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
  HandleRec h;
  h.value = handle;
  h.alloc_id = a.id;
  h.refs = 1;
  h.issue_seq = ev.seq;
  h.issued = ev;
  handles_[handle] = h;
  put_reusing(allocs_, spare_allocs_, a.id, a);
}

void VmmModel::on_retain(std::uint64_t handle, std::uint64_t va, const EventRef &ev) {
  std::lock_guard lk(mu_);
  std::uint64_t alloc_id = 0;
  if (Reservation *r = res_containing_locked(va)) {
    std::uint64_t off = va - r->base;
    auto it = r->maps.upper_bound(off);
    if (it != r->maps.begin()) {
      --it;
      if (off < it->second.off + it->second.size) alloc_id = it->second.alloc_id;
    }
  }
  auto a = allocs_.find(alloc_id);
  if (a != allocs_.end()) a->second.handle_refs++;
  auto h = handles_.find(handle);
  if (h != handles_.end() && h->second.refs > 0 && h->second.alloc_id == alloc_id) {
    h->second.refs++;  // the driver handed out a value that is live already (real-driver.md D16)
    return;
  }
  HandleRec rec;
  rec.value = handle;
  rec.alloc_id = alloc_id;
  rec.refs = 1;
  rec.issue_seq = ev.seq;
  rec.issued = ev;
  handles_[handle] = rec;
}

void VmmModel::on_reserve(std::uint64_t base, std::uint64_t size, const EventRef &ev) {
  std::lock_guard lk(mu_);
  Reservation r;
  r.base = base;
  r.size = size;
  r.reserved = ev;
  put_reusing(res_, spare_res_, base, std::move(r));
  for (auto it = freed_res_.lower_bound(base); it != freed_res_.end() && it->first < base + size;)
    it = erase_keep(freed_res_, spare_freed_res_, it);
  counters_.add(-1, MemKind::Va, static_cast<std::int64_t>(size));
}

VmmVerdict VmmModel::check_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset,
                               std::uint64_t handle, ThreadVmmState &ts) {
  (void)offset;
  break_pairing(ts);
  VmmVerdict v;
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(va);
  if (!r || size == 0 || size > r->base + r->size - va) return v;  // the driver answers
  std::uint64_t off = va - r->base;
  auto it = r->maps.upper_bound(off + size - 1);
  while (it != r->maps.begin()) {
    --it;
    const Mapping &m = it->second;
    if (m.off + m.size <= off) break;
    Finding f;
    f.cls = FindingClass::MapOverMapped;
    f.msg = "cuMemMap of handle " + hex(handle) + " onto " + range_text(va, size) +
            ", but " + hex(r->base + m.off) + " is already mapped to handle " + hex(m.handle) +
            " (mapped at " + at_seq(m.mapped) + "); the driver refuses the map and handle " +
            hex(handle) + " leaks unless it is released";
    f.related.push_back({"current mapping", m.mapped});
    f.state_json = "{\"reservation\":\"" + hex(r->base) + "\",\"current_handle\":\"" +
                   hex(m.handle) + "\",\"new_handle\":\"" + hex(handle) + "\",\"range\":" +
                   describe_range_locked(*r, off, size) + "}";
    v.finding = std::move(f);
    break;
  }
  return v;
}

void VmmModel::on_map_ok(std::uint64_t va, std::uint64_t size, std::uint64_t offset,
                         std::uint64_t handle, const EventRef &ev) {
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r) return;  // reserved before tracking started: nothing to attach the mapping to
  Mapping m;
  m.off = va - r->base;
  m.size = size;
  m.handle = handle;
  m.alloc_off = offset;
  m.mapped = ev;
  auto h = handles_.find(handle);
  if (h != handles_.end()) {
    m.alloc_id = h->second.alloc_id;
    h->second.last_res = r->base;
    h->second.last_off = m.off;
    h->second.ever_mapped = true;
    auto a = allocs_.find(m.alloc_id);
    if (a != allocs_.end()) a->second.map_count++;
  }
  for (auto it = first_ending_after(r->asleep, m.off);
       it != r->asleep.end() && it->second.off < m.off + m.size;)
    it = erase_keep(r->asleep, spare_sleepers_, it);
  // The driver accepted the map: whatever the model thought was mapped there is gone (a map over
  // a mapped range is refused by the driver, so this only repairs a model that drifted).
  for (auto it = first_ending_after(r->maps, m.off);
       it != r->maps.end() && it->second.off < m.off + m.size;)
    it = erase_keep(r->maps, spare_maps_, it);
  put_reusing(r->maps, spare_maps_, m.off, m);
  r->ever_mapped = true;
}

void VmmModel::on_set_access(std::uint64_t va, std::uint64_t size) {
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r) return;
  std::uint64_t off = va - r->base;
  for (auto it = first_ending_after(r->maps, off); it != r->maps.end() && it->second.off < off + size;
       ++it)
    it->second.access = true;
}

VmmVerdict VmmModel::begin_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev,
                                 ThreadVmmState &ts) {
  VmmVerdict v;
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r || size == 0 || size > r->base + r->size - va) {
    break_pairing(ts);
    return v;  // not ours to judge: the driver answers (real-driver.md D10)
  }
  const std::uint64_t off = va - r->base, end = off + size;
  std::vector<Mapping *> hit;
  for (auto it = first_ending_after(r->maps, off); it != r->maps.end() && it->second.off < end; ++it)
    hit.push_back(&it->second);

  if (hit.empty()) {
    // real-driver.md D3/D4: the driver answers SUCCESS and does nothing; the call is redundant.
    Finding f;
    f.cls = FindingClass::UnmapUnmapped;
    ts.pending = true;
    ts.base = va;
    ts.size = size;
    ts.nlast = 0;
    ts.noop_unmap = ev;
    std::string last;
    for (auto it = first_ending_after(r->asleep, off); it != r->asleep.end() && it->second.off < end;
         ++it) {
      const Sleeper &s = it->second;
      if (ts.nlast < ts.last.size())
        ts.last[ts.nlast++] = ThreadVmmState::Last{s.handle, s.alloc_id, s.unmapped.seq, s.unmapped};
      f.related.push_back({"earlier unmap (put to sleep)", s.unmapped});
      if (!last.empty()) last += ",";
      last += "\"" + hex(s.handle) + "\"";
    }
    const bool asleep = !f.related.empty();
    f.msg = "cuMemUnmap of " + range_text(va, size) + " where nothing is mapped: " +
            (asleep ? "the range was already unmapped at " + at_seq(f.related.front().ev) +
                          " and is asleep"
                    : std::string(r->ever_mapped ? "the range is reserved and not mapped now"
                                                 : "the range is reserved and was never mapped")) +
            "; the driver would return SUCCESS and do nothing";
    f.related.push_back({"reservation", r->reserved});
    f.state_json = "{\"reservation\":\"" + hex(r->base) + "\",\"size\":" +
                   std::to_string(r->size) + ",\"state\":\"" +
                   (asleep ? "asleep" : (r->ever_mapped ? "unmapped" : "reserved, never mapped")) +
                   "\",\"last_handles\":[" + last + "]}";
    v.finding = std::move(f);
    v.skippable = true;
    return v;
  }

  // Legitimate only when the range is exactly tiled by whole mappings (real-driver.md D9).
  std::sort(hit.begin(), hit.end(), [](auto *a, auto *b) { return a->off < b->off; });
  bool exact = hit.front()->off == off;
  std::uint64_t cur = off;
  for (Mapping *m : hit) {
    if (m->off != cur) exact = false;
    cur = m->off + m->size;
  }
  if (cur != end) exact = false;
  break_pairing(ts);
  if (!exact) {
    Finding f;
    f.cls = FindingClass::PartialUnmap;
    f.msg = "cuMemUnmap of " + range_text(va, size) +
            " covers only part of what is mapped there, or cuts a mapping; the driver unmaps "
            "only whole mapped ranges and refuses this call";
    for (Mapping *m : hit) f.related.push_back({"mapping", m->mapped});
    f.state_json = "{\"reservation\":\"" + hex(r->base) + "\",\"range\":" +
                   describe_range_locked(*r, std::min(off, hit.front()->off),
                                         std::max(end, cur) - std::min(off, hit.front()->off)) +
                   "}";
    v.finding = std::move(f);
    return v;
  }
  v.res_base = r->base;
  for (Mapping *m : hit) {
    v.removed_maps.push_back(*m);
    Sleeper s{m->off, m->size, m->handle, m->alloc_id, ev};
    v.removed_sleepers.push_back(s);  // recorded as added; rollback removes them again
    put_reusing(r->asleep, spare_sleepers_, m->off, s);
    recycle(spare_maps_, r->maps.extract(m->off));  // m points into this node: not used after
  }
  v.changed = true;
  return v;
}

VmmModel::Freed VmmModel::commit_unmap(const VmmVerdict &v) {
  Freed total;
  if (!v.changed) return total;
  std::lock_guard lk(mu_);
  for (const Mapping &m : v.removed_maps) {
    auto a = allocs_.find(m.alloc_id);
    if (a == allocs_.end()) continue;
    if (a->second.map_count) a->second.map_count--;
    Freed f = drop_alloc_if_dead_locked(m.alloc_id);
    total.bytes += f.bytes;
    if (f.bytes) total.dev = f.dev;
  }
  return total;
}

void VmmModel::rollback_unmap(const VmmVerdict &v) {
  if (!v.changed) return;
  std::lock_guard lk(mu_);
  auto it = res_.find(v.res_base);
  if (it == res_.end()) return;
  for (const Sleeper &s : v.removed_sleepers) it->second.asleep.erase(s.off);
  for (const Mapping &m : v.removed_maps) it->second.maps[m.off] = m;
}

VmmVerdict VmmModel::begin_release(std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts) {
  VmmVerdict v;
  const bool paired = ts.pending;
  const ThreadVmmState pair = ts;
  break_pairing(ts);
  std::lock_guard lk(mu_);
  auto it = handles_.find(handle);
  if (it == handles_.end()) {
    Finding f;
    f.cls = FindingClass::ReleaseUnknown;
    f.msg = "cuMemRelease of handle " + hex(handle) +
            (handle == 0 ? ", which is never a valid handle"
                         : ", which this process never created, retained or imported");
    v.finding = std::move(f);
    return v;
  }
  HandleRec &h = it->second;
  if (h.refs > 0) {
    // The release of a live value is noted now, stale or not: the verdict is skippable, and a
    // skipped call is rolled back (with_verdict), but in report mode, or with the class set to
    // forward, the driver really releases it, and the model must have followed (tests/stress found
    // the forwarded stale release leaving the allocation live in the model forever).
    v.handle_before = h;
    h.refs--;
    if (h.refs == 0) h.released = ev;
    auto a = allocs_.find(h.alloc_id);
    if (a != allocs_.end() && a->second.handle_refs) a->second.handle_refs--;
    v.changed = true;
    if (paired) {
      for (unsigned i = 0; i < pair.nlast; ++i) {
        const auto &l = pair.last[i];
        if (l.handle != handle || h.issue_seq <= l.unmap_seq) continue;
        // Only when the value's current allocation is mapped elsewhere: that is the evidence the
        // release would hit someone else's live memory (P02). A wake-up whose map failed releases
        // its fresh, unmapped handle the same way, and that release is legitimate.
        auto cur = allocs_.find(h.alloc_id);
        if (cur == allocs_.end() || cur->second.map_count == 0) continue;
        // The pairing rule: this thread just made a no-op unmap of a sleeping range whose last
        // handle had this value, and the value was issued again after the range went to sleep.
        Finding f;
        f.cls = FindingClass::StaleRelease;
        f.msg = "cuMemRelease of handle " + hex(handle) + " right after a no-op unmap of " +
                range_text(pair.base, pair.size) + ": that range's last handle had this value " +
                "and was released when the range was put to sleep (" + at_seq(l.unmapped) +
                "); the value was issued again since (" + at_seq(h.issued) +
                ") to another allocation, which this release would free";
        f.related.push_back({"sleep-time unmap", l.unmapped});
        f.related.push_back({"re-issue of the value", h.issued});
        f.related.push_back({"no-op unmap", pair.noop_unmap});
        f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"reservation_range\":\"" +
                       hex(pair.base) + "\",\"current_alloc\":" + std::to_string(h.alloc_id) +
                       ",\"sleeping_alloc\":" + std::to_string(l.alloc_id) + "}";
        v.finding = std::move(f);
        v.skippable = true;
        return v;
      }
    }
    return v;
  }
  // The value is not live: a second release of it.
  bool replaced = false;
  EventRef replaced_by;
  if (h.ever_mapped) {
    auto r = res_.find(h.last_res);
    if (r != res_.end()) {
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
  Finding f;
  f.cls = replaced ? FindingClass::StaleRelease : FindingClass::DoubleRelease;
  f.msg = "cuMemRelease of handle " + hex(handle) + ", which was already released at " +
          at_seq(h.released) +
          (replaced ? "; the range it backed (" + hex(h.last_res + h.last_off) +
                          ") has been mapped to another allocation since"
                    : std::string());
  f.related.push_back({"first release", h.released});
  f.related.push_back({"handle issued", h.issued});
  if (replaced) f.related.push_back({"replacement", replaced_by});
  f.state_json = "{\"handle\":\"" + hex(handle) + "\",\"released\":true" +
                 (h.ever_mapped ? ",\"last_mapped_at\":\"" + hex(h.last_res + h.last_off) + "\""
                                : std::string()) +
                 "}";
  v.finding = std::move(f);
  v.skippable = true;
  return v;
}

VmmModel::Freed VmmModel::commit_release(const VmmVerdict &v) {
  if (!v.changed || !v.handle_before) return {};
  std::lock_guard lk(mu_);
  return drop_alloc_if_dead_locked(v.handle_before->alloc_id);
}

void VmmModel::rollback_release(const VmmVerdict &v) {
  if (!v.changed || !v.handle_before) return;
  std::lock_guard lk(mu_);
  handles_[v.handle_before->value] = *v.handle_before;
  auto a = allocs_.find(v.handle_before->alloc_id);
  if (a != allocs_.end()) a->second.handle_refs++;
}

VmmVerdict VmmModel::begin_address_free(std::uint64_t base, std::uint64_t size, const EventRef &ev,
                                        ThreadVmmState &ts) {
  break_pairing(ts);
  VmmVerdict v;
  std::lock_guard lk(mu_);
  auto it = res_.find(base);
  if (it == res_.end()) {
    auto f = freed_res_.find(base);
    if (f != freed_res_.end() && !res_containing_locked(base)) {
      Finding fd;
      fd.cls = FindingClass::DoubleAddressFree;
      fd.msg = "cuMemAddressFree of " + range_text(base, size) +
               ", a reservation already freed at " + at_seq(f->second.second);
      fd.related.push_back({"first address free", f->second.second});
      v.finding = std::move(fd);
    }
    return v;
  }
  Reservation &r = it->second;
  if (size != r.size) return v;  // the driver refuses a wrong size (real-driver.md D14)
  if (!r.maps.empty()) {
    Finding f;
    f.cls = FindingClass::FreeMappedVa;
    std::uint64_t mapped = 0;
    for (const auto &[o, m] : r.maps) {
      mapped += m.size;
      f.related.push_back({"mapping still in place", m.mapped});
    }
    f.msg = "cuMemAddressFree of " + range_text(base, size) + " while " +
            std::to_string(r.maps.size()) + " mapping(s) (" + std::to_string(mapped) +
            " bytes) are still in place; the driver refuses it (unmap first)";
    f.state_json = "{\"reservation\":\"" + hex(base) + "\",\"range\":" +
                   describe_range_locked(r, 0, r.size) + "}";
    v.finding = std::move(f);
    return v;
  }
  v.reservation_before = std::move(r);  // moved, not copied: its maps keep their nodes
  v.res_base = base;
  recycle(spare_res_, res_.extract(it));
  if (freed_res_.size() > 4096) erase_keep(freed_res_, spare_freed_res_, freed_res_.begin());
  put_reusing(freed_res_, spare_freed_res_, base, std::make_pair(std::uint64_t{size}, ev));
  counters_.add(-1, MemKind::Va, -static_cast<std::int64_t>(size));
  v.changed = true;
  return v;
}

void VmmModel::rollback_address_free(const VmmVerdict &v) {
  if (!v.changed || !v.reservation_before) return;
  std::lock_guard lk(mu_);
  freed_res_.erase(v.res_base);
  res_[v.res_base] = *v.reservation_before;
  counters_.add(-1, MemKind::Va, static_cast<std::int64_t>(v.reservation_before->size));
}

VmmModel::Freed VmmModel::force_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev) {
  Freed total;
  std::lock_guard lk(mu_);
  Reservation *r = res_containing_locked(va);
  if (!r || size == 0) return total;
  const std::uint64_t off = va - r->base, end = size > r->size - off ? r->size : off + size;
  std::vector<std::uint64_t> gone;
  for_overlapping(r->maps, off, end, [&](auto it) {
    const Mapping m = it->second;
    r->asleep[m.off] = Sleeper{m.off, m.size, m.handle, m.alloc_id, ev};
    r->maps.erase(it);
    gone.push_back(m.alloc_id);
  });
  for (std::uint64_t id : gone) {
    auto a = allocs_.find(id);
    if (a != allocs_.end() && a->second.map_count) a->second.map_count--;
    Freed f = drop_alloc_if_dead_locked(id);
    total.bytes += f.bytes;
    if (f.bytes) total.dev = f.dev;
  }
  return total;
}

VmmModel::Freed VmmModel::force_address_free(std::uint64_t base, std::uint64_t size,
                                             const EventRef &ev) {
  Freed total;
  std::lock_guard lk(mu_);
  auto it = res_.find(base);
  if (it == res_.end()) return total;
  for (const auto &[o, m] : it->second.maps) {
    auto a = allocs_.find(m.alloc_id);
    if (a != allocs_.end() && a->second.map_count) a->second.map_count--;
    Freed f = drop_alloc_if_dead_locked(m.alloc_id);
    total.bytes += f.bytes;
    if (f.bytes) total.dev = f.dev;
  }
  counters_.add(-1, MemKind::Va, -static_cast<std::int64_t>(it->second.size));
  res_.erase(it);
  freed_res_[base] = {size, ev};
  return total;
}

std::optional<Reservation> VmmModel::reservation_containing(std::uint64_t p) const {
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(p);
  if (!r) return std::nullopt;
  return *r;
}

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

std::optional<PhysAlloc> VmmModel::alloc_of_handle(std::uint64_t handle) const {
  std::lock_guard lk(mu_);
  auto h = handles_.find(handle);
  if (h == handles_.end() || h->second.refs == 0) return std::nullopt;
  auto a = allocs_.find(h->second.alloc_id);
  if (a == allocs_.end()) return std::nullopt;
  return a->second;
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
  std::uint64_t off = va - r->base;
  auto it = r->maps.upper_bound(off);
  if (it == r->maps.begin()) return std::nullopt;
  --it;
  if (off >= it->second.off + it->second.size) return std::nullopt;
  auto a = allocs_.find(it->second.alloc_id);
  if (a == allocs_.end()) return std::nullopt;
  return std::make_pair(a->second, it->second.alloc_off + (off - it->second.off));
}

const char *VmmModel::range_state(std::uint64_t va, std::uint64_t size) const {
  std::lock_guard lk(mu_);
  const Reservation *r = res_containing_locked(va);
  if (!r) return "not reserved";
  const std::uint64_t off = va - r->base;
  const std::uint64_t end = size > r->size - off ? r->size : off + (size ? size : 1);
  std::uint64_t mapped = 0;
  for (auto it = first_ending_after(r->maps, off); it != r->maps.end() && it->second.off < end; ++it) {
    const Mapping &m = it->second;
    mapped += std::min(end, m.off + m.size) - std::max(off, m.off);
  }
  if (mapped && mapped >= end - off) return "mapped";
  if (mapped) return "partly mapped";
  auto s = first_ending_after(r->asleep, off);
  if (s != r->asleep.end() && s->second.off < end) return "asleep";
  return r->ever_mapped ? "unmapped" : "reserved, never mapped";
}

VmmCounts VmmModel::counts() const {
  std::lock_guard lk(mu_);
  VmmCounts c;
  c.phys = allocs_.size();
  for (const auto &[id, a] : allocs_) c.phys_bytes += a.size;
  for (const auto &[v, h] : handles_) c.handles += h.refs > 0;
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
}

}  // namespace cmg

namespace cmg {

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

}  // namespace cmg
