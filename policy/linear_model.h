// SPDX-License-Identifier: Apache-2.0
// The linear-memory model: cudaMalloc / cuMemAlloc / host / async / managed allocations and IPC
// imports by address, with the frees that can still be recognised. Pure C++, thread-safe.
//
//  * Frees are noted before forwarding (the address leaves the live set at once), so a concurrent
//    re-issue of the address by the driver cannot be confused with the allocation being freed; a
//    free the driver refuses is put back only if the record is still the one this free made (its
//    generation, below).
//  * Addresses are reused by the driver (real-driver.md D18, 49 of 50 cuMemAlloc pointers): a
//    freed record lasts until the address is issued again, or until the bounded history forgets it.
//  * Sharded by address: many threads allocate at once, each call takes one shard's lock.
//  * Each shard is an open-addressing table keyed by address (linear probing, deletion by backward
//    shift, no tombstones) over records kept in fixed blocks: an allocation and its free find
//    their record in one or two probes and flip it live or freed in place, with no heap allocation
//    once the table has grown to the program's working set. One record per address, live or
//    freed; every change of a record stamps it with a new generation, so a verdict taken before
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
  DoubleFree,  // freed before and not re-issued since
  Interior,    // inside a live allocation, not its base
  WrongKind,   // a live allocation of another kind (host pointer to cudaFree, …)
  InVmm,       // inside a VMM reservation
  Unknown,     // never seen
};

struct FreeVerdict {
  FreeClass cls = FreeClass::Unknown;
  LinearRec rec;          // the live (or freed, or containing) allocation when known
  EventRef first_free;    // DoubleFree: the earlier free
  EventRef this_free;     // Live: the free noted now
  std::uint32_t gen = 0;  // Live, DoubleFree: the record's generation after this verdict (0: none)
  std::uint64_t vmm_base = 0, vmm_size = 0;  // InVmm: the reservation
};

using KindMask = unsigned;
constexpr KindMask kind_bit(MemKind k) {
  return 1u << static_cast<unsigned>(k);
}

class LinearModel {
 public:
  void on_alloc(const LinearRec &rec);
  // Classifies a free of ptr by an API that frees the kinds in `accepted`. A Live verdict removes
  // the allocation from the live set and remembers it as freed (noted before forwarding); call
  // rollback() if the driver then refuses the free.
  FreeVerdict begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev);
  void rollback(const FreeVerdict &v);
  // A free of an address the model held as freed was forwarded and the driver accepted it (the
  // address had been issued again unseen): the free it remembers is this one.
  void refreed(const FreeVerdict &v, const EventRef &ev);
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
  // record stays at 88 bytes (docs/performance.md, memory per live allocation).
  enum class St : std::uint8_t { Unused, Live, Freed };
  struct Rec {
    LinearRec rec;
    std::uint32_t gen = 0;   // stamped at each change (alloc, free, rollback, refree)
    std::uint32_t slot = 0;  // freed: its free's slot in freed_ring; unused: the next unused record
    St st = St::Unused;
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
  std::array<Shard, kShards> shards_;
  std::atomic<bool> trusted_{true};
};

// The finding for a free the linear model did not accept (DoubleFree, Interior, WrongKind, InVmm,
// Unknown): phrased here so the hooks stay free of policy text.
Finding finding_for_free(const FreeVerdict &v, const char *api, std::uint64_t ptr);

// What happens to such a free (decide.h). A double free is proven redundant from the model only
// for synchronous memory the shim does not hold itself (`held`: the first free is still in the
// quarantine or deferred, so the driver has not freed it): its skip is then confirmed with the
// driver's view. A second free of stream-ordered memory is never proven (a graph launch the shim
// does not see allocates it again): forwarded, reported if refused.
// `trusted`: the model may prove (LinearModel::trusted).
Decision decide_free(const Options &o, const FreeVerdict &v, bool held, bool trusted = true);

// The free of an address the model held as freed, which the driver held live and freed when the
// shim forwarded it: it had been issued again through a path the shim does not see.
Finding unseen_free(const FreeVerdict &v, const char *api, std::uint64_t ptr, const DriverView &dv);

}  // namespace cmg
