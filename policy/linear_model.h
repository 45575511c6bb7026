// SPDX-License-Identifier: Apache-2.0
// The linear-memory model: cudaMalloc / cuMemAlloc / host / async / managed allocations and IPC
// imports by address, with the frees that can still be recognised. Pure C++, thread-safe.
//
//  * A free is one transaction, as a VMM call is (vmm_model.h): begin_free() classifies it under
//    the address's shard lock, notes a free of a live allocation before it is forwarded (the
//    address leaves the live set at once, so a concurrent re-issue of the address by the driver
//    cannot be confused with the allocation being freed), and returns a LinearTicket with the
//    verdict, the finding and the Decision (decide_free) for a free it did not accept. end()
//    completes it with the driver's answer: a refused free is put back only if the record is
//    still the one this free made (its generation, below); an accepted free of an address the
//    model held as freed (an unseen re-issue) becomes the remembered free.
//  * A record is Live, Held or Freed. Held: the shim holds the free back (the quarantine or a
//    deferred flush, shim/held.h) and the driver still has the memory; the hook marks it so when
//    the free is held (mark_held) and Freed when the held free goes to the driver (given_back).
//    A free of a held address is a proven double free that begin_free answers itself, with the
//    held free as the first one; a held record is never forgotten by the bounded history.
//  * Addresses are reused by the driver (real-driver.md D18, 49 of 50 cuMemAlloc pointers): a
//    freed record lasts until the address is issued again, or until the bounded history forgets it.
//  * Sharded by address: many threads allocate at once, each call takes one shard's lock.
//  * Each shard is an open-addressing table keyed by address (linear probing, deletion by backward
//    shift, no tombstones) over records kept in fixed blocks: an allocation and its free find
//    their record in one or two probes and flip it live or freed in place, with no heap allocation
//    once the table has grown to the program's working set. One record per address, live, held
//    or freed; every change of a record stamps it with a new generation, so a ticket taken before
//    the driver call tells "the record this free made" from a free and re-issue of the same
//    address by another thread since.
//  * Containing-address look-ups (an interior pointer, a freed base inside a newer allocation) are
//    the slow path: each shard keeps a sorted array of its live ranges, rebuilt under the shard's
//    lock when an allocation or free changed the shard since it was last built. The common path
//    only marks the shard changed.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "decide.h"
#include "event.h"
#include "fn_ref.h"
#include "lock_within.h"

namespace cmg {

struct LinearRec {
  std::uint64_t ptr = 0, size = 0;
  std::int32_t dev = -1;
  MemKind kind = MemKind::Linear;
  EventRef alloc;
  std::uint32_t capture = 0;  // made while this capture was open on the thread (capture_model.h)
  std::uint64_t stream = 0;   // stream-ordered memory: the stream it was allocated on
};

// The byte counters' kind of an allocation: memory made for a CUDA graph counts as the graph's.
inline MemKind counted_kind(const LinearRec &r) {
  return r.capture ? MemKind::Graph : r.kind;
}

enum class FreeClass : std::uint8_t {
  Live,        // a live allocation of an accepted kind: a normal free
  Null,        // nullptr: a no-op for every free API
  DoubleFree,  // freed before and not re-issued since (or held: the shim still holds that free)
  Interior,    // inside a live allocation, not its base
  WrongKind,   // a live allocation of another kind (host pointer to cudaFree, …)
  InVmm,       // inside a VMM reservation
  Unknown,     // never seen
};

struct FreeVerdict {
  LinearRec rec;          // the live (or freed, or containing) allocation when known
  EventRef first_free;    // DoubleFree: the earlier free
  EventRef this_free;     // the free being classified
  std::uint64_t vmm_base = 0, vmm_size = 0;  // InVmm: the reservation
  std::uint32_t gen = 0;  // Live, DoubleFree: the record's generation after this verdict (0: none)
  // Next to gen, the small fields share its word: a ticket is zeroed on every free.
  FreeClass cls = FreeClass::Unknown;
  bool held = false;  // DoubleFree: the first free is still held by the shim (not yet freed)
  // LinearTicket's: Live, the record went straight to Held (see there).
  bool holding = false;
};

// One linear free in flight: what begin_free() found and decided, and what end() completes. The
// verdict's fields are the ticket's own (cls, rec, gen, ...).
struct LinearTicket : FreeVerdict {
  // A free the model did not accept (not Live, not Null). Behind a pointer: the common ticket
  // (Live) is built without zeroing a Finding's bytes.
  std::unique_ptr<Finding> finding;
  Decision decision;  // what happens to that finding (decide_free)
  // (holding, in the verdict's spare bytes) Live: the record went straight to Held (begin_free's
  // `hold` named its kind), generation gen: the hook holds the free with it, or gives it back
  // (given_back) before forwarding it.
  bool skip() const { return finding && decision.skip; }
};

class VmmModel;  // vmm_model.h: its reservations make a free InVmm

using KindMask = unsigned;
constexpr KindMask kind_bit(MemKind k) {
  return 1u << static_cast<unsigned>(k);
}

class LinearModel {
 public:
  void on_alloc(const LinearRec &rec);
  // Begins the free `ev` of ptr by an API that frees the kinds in `accepted`. A Live ticket has
  // removed the allocation from the live set and remembered it as freed (noted before
  // forwarding), or, for a kind in `hold` (the ones the caller will hold back), made it Held at
  // once (t.holding), under the same lock. Any other ticket but Null carries its finding
  // (phrased with ev.api) and the Decision of `o`; an address not known here is looked up in
  // the reservations of `vmm` (InVmm; none when null).
  LinearTicket begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev,
                          const Options &o, const VmmModel *vmm, KindMask hold = 0);
  // The same with default options and no VMM reservations (tests, benchmarks, IPC closes).
  LinearTicket begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev);
  // Completes a forwarded free with the driver's answer (`ok`: it accepted). Refused Live: the
  // allocation is live again, if its record is still the one this free made. Accepted DoubleFree
  // that was not confirmed (decision.unseen: the address had been issued again unseen): the free
  // the model remembers is this one. Anything else changes nothing; a second end() neither.
  void end(const LinearTicket &t, bool ok) {
    // Inline: the common end (a free the driver accepted) changes nothing.
    const bool refused_live = t.cls == FreeClass::Live && !ok;
    const bool unseen = t.cls == FreeClass::DoubleFree && !t.held && t.decision.unseen && ok;
    if (refused_live || unseen) [[unlikely]]
      end_changed(t, unseen);
  }
  // The shim holds the Live free of `t` back (quarantine, deferred flush) that begin_free did not
  // make Held itself: its record becomes Held. Returns the generation the held free must give back
  // with (0: the record is no longer the one this free made, nothing changed).
  std::uint32_t mark_held(const LinearTicket &t);
  // The held free of ptr went to the driver (or was not held after all): Held becomes Freed, its
  // free remembered in the bounded history, if the record is still the one mark_held made (gen).
  // Returns the record's generation as Freed (what a ticket of the free ends with), 0 if nothing
  // changed.
  std::uint32_t given_back(std::uint64_t ptr, std::uint32_t gen);
  std::optional<LinearRec> find_containing(std::uint64_t p) const;
  std::size_t live_count() const;
  void for_each_live(FnRef<void(const LinearRec &)> fn) const;
  // for_each_live for exit paths (lock_within.h): visits in place, allocating nothing; a shard
  // whose lock this thread holds, or that stays taken for patience_ns, is skipped. Returns the
  // number of shards skipped.
  std::size_t for_each_live_within(FnRef<void(const LinearRec &)> fn,
                                   std::uint64_t patience_ns) const;
  void clear();
  // After a failure inside the shim the model may have missed a call: it proves nothing from then
  // on (shim/shield.h).
  void distrust() { trusted_.store(false, std::memory_order_relaxed); }
  bool trusted() const { return trusted_.load(std::memory_order_relaxed); }
  // fork(): the child does not own the parent's CUDA objects and starts with an empty model. The 64
  // shard locks are not held across fork (holding them all made fork's cost grow with the shards
  // and exceeded what ThreadSanitizer's deadlock detector can follow): the child builds fresh
  // shards over the old ones without touching them, so a table another thread was changing at the
  // fork is simply left behind (the child's copy of it leaks, the parent's is untouched).
  void fork_child();

  static constexpr std::size_t kShards = 64;
  static constexpr std::size_t kFreedPerShard = 4096;
  static std::size_t shard_of(std::uint64_t p) {
    std::uint64_t x = p >> 8;
    x ^= x >> 17;
    x *= 0x9E3779B97F4A7C15ull;
    return static_cast<std::size_t>(x >> 58);
  }

 private:
  // One record per address, live or freed: the driver re-issues the address it freed last (D18,
  // 49 of 50 cuMemAlloc pointers), so an allocation and its free flip the state of one record in
  // place. The free itself is kept in the bounded history's slot, which the record names: the
  // record stays at 88 bytes (docs/performance.md, memory per live allocation). A held free is
  // kept in the shard's held slots instead, out of the bounded history's reach.
  enum class St : std::uint8_t { Unused, Live, Held, Freed };
  struct Rec {
    LinearRec rec;
    std::uint32_t gen = 0;   // stamped at each change (alloc, free, hold, give-back, end)
    std::uint32_t slot = 0;  // freed: its free's slot in freed_ring; held: in held_slots; unused:
                             // the next unused record
    St st = St::Unused;
  };
  struct HeldSlot {
    EventRef free;
    std::uint32_t next_unused = UINT32_MAX;
  };
  static constexpr std::uint32_t kBlockShift = 8;  // records per block: 256 (22.5 KiB)
  struct FreedSlot {
    std::uint64_t ptr;
    EventRef free;
  };
  struct Range {
    std::uint64_t base, end;
    std::uint32_t rec;
  };
  struct alignas(64) Shard {
    mutable MarkedMutex mu;  // its holder is known (exit paths, lock_within.h)
    // The index: 0 = empty, else (hash tag << 32) | (record + 1); capacity a power of two, at
    // most three quarters full.
    std::vector<std::uint64_t> index;
    std::vector<std::unique_ptr<Rec[]>> blocks;  // records never move: blocks are only added
    std::uint32_t recs_made = 0;                 // records handed out of the blocks so far
    std::uint32_t unused = UINT32_MAX;           // the chain of records given back
    std::uint32_t in_index = 0;                  // records in the table, live or freed
    std::uint32_t gen = 0;
    std::size_t live_n = 0;
    std::vector<FreedSlot> freed_ring;  // the bounded history, oldest at fifo_head once full
    std::size_t fifo_head = 0;
    std::vector<HeldSlot> held_slots;  // the frees of Held records; a chain of unused ones
    std::uint32_t held_unused = UINT32_MAX;
    // The slow path's sorted live ranges; `changed` when the live set moved since they were built.
    mutable std::vector<Range> ranges;
    mutable bool changed = false;
    Rec &at(std::uint32_t r) const {
      return blocks[r >> kBlockShift][r & ((1u << kBlockShift) - 1)];
    }
  };
  static std::uint32_t hash_of(std::uint64_t p) {
    std::uint64_t x = p ^ (p >> 29);
    x *= 0xBF58476D1CE4E5B9ull;
    return static_cast<std::uint32_t>(x >> 32);
  }
  // The record of ptr in s, or nullptr.
  static Rec *find(const Shard &s, std::uint64_t ptr);
  // A new record for ptr (not in the table), in the table.
  static Rec &insert(Shard &s, std::uint64_t ptr);
  // Removes ptr's record from the table and gives it back.
  static void drop(Shard &s, std::uint64_t ptr);
  static void grow(Shard &s);
  // Records the free of r (at ptr) in the history and marks r freed by it.
  static void remember_freed(Shard &s, Rec &r, std::uint64_t ptr, const EventRef &ev);
  static void remember_in_full_ring(Shard &s, Rec &r, std::uint64_t ptr, const EventRef &ev);
  // The live allocation of the shard that contains p.
  static const LinearRec *containing_in(const Shard &s, std::uint64_t p);
  // end() of a refused Live free (`unseen` false) or an accepted unseen re-issue.
  void end_changed(const LinearTicket &t, bool unseen);
  // The Held record r stops being held: its held slot is given back.
  static void unhold(Shard &s, Rec &r);
  // r becomes Held by the free ev.
  static void hold(Shard &s, Rec &r, const EventRef &ev);
  // The classification of begin_free under the address's shard lock: true for a ticket complete
  // there (Null, Live); false for the rest, with cls set (WrongKind, a held address) or left
  // Unknown for the slow path's look-ups (classify_slow).
  bool classify_fast(LinearTicket &t, std::uint64_t ptr, KindMask accepted, KindMask hold,
                     const EventRef &ev);
  void classify_slow(LinearTicket &t, std::uint64_t ptr);
  // Everything but a free of a live allocation, out of the common path: the slow classification
  // when the first look left the ticket Unknown, the VMM look-up, the finding and the decision.
  [[gnu::noinline]] void judge(LinearTicket &t, std::uint64_t ptr, const Options &o,
                               const VmmModel *vmm);
  std::array<Shard, kShards> shards_;
  std::atomic<bool> trusted_{true};
};

// The finding for a free the linear model did not accept (DoubleFree, Interior, WrongKind, InVmm,
// Unknown): phrased here so the hooks stay free of policy text.
Finding finding_for_free(const FreeVerdict &v, const char *api, std::uint64_t ptr);

// What happens to such a free (decide.h). A double free is proven redundant from the model only
// for synchronous memory the shim does not hold itself (v.held: the first free is still in the
// quarantine or deferred, so the driver has not freed it): its skip is then confirmed with the
// driver's view. A second free of stream-ordered memory is never proven (a graph launch the shim
// does not see allocates it again): forwarded, reported if refused.
// `trusted`: the model may prove (LinearModel::trusted).
Decision decide_free(const Options &o, const FreeVerdict &v, bool trusted = true);

// The free of an address the model held as freed, which the driver held live and freed when the
// shim forwarded it: it had been issued again through a path the shim does not see.
Finding unseen_free(const FreeVerdict &v, const char *api, std::uint64_t ptr, const DriverView &dv);

}  // namespace cmg
