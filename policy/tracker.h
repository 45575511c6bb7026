// SPDX-License-Identifier: Apache-2.0
// The state model: linear allocations, VMM physical allocations with their (reused) handle values,
// reservations with their mappings and sleeping ranges, and byte counters. Pure C++, thread-safe.
//
// Rules that shape this file:
//  * State follows the driver: a change is committed only after the real call succeeded; frees,
//    unmaps and releases are noted *before* forwarding (so a concurrent re-issue of the address or
//    value cannot confuse them) and rolled back when the driver refuses.
//  * Handle values and addresses are reused by the driver (real-driver.md D18): every record keyed by
//    a value or an address describes the *current* issue of it, and keeps the sequence number of that
//    issue so stale uses can be told apart.
//  * Linear allocations are sharded (many threads allocate at once); VMM traffic is rarer and each call
//    costs the driver tens of microseconds (real-driver.md section 4), so one mutex guards it.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "event.h"

namespace cmg {

// ---------------------------------------------------------------------------------------------
// Byte counters per device and memory kind (current / peak / total), lock-free.
class ByteCounters {
 public:
  static constexpr int kDevices = 64;  // device ordinals 0..63; -1 (host/unknown) has its own row
  void add(int dev, MemKind kind, std::int64_t delta);
  struct Row {
    int dev;
    MemKind kind;
    std::int64_t current, peak, total;
  };
  std::vector<Row> snapshot() const;  // rows that ever saw a byte
  // The same rows without allocating (atomic loads only): usable from a signal handler.
  template <class F>
  void visit(F &&fn) const {
    for (int r = 0; r <= kDevices; ++r)
      for (int k = 0; k < kMemKinds; ++k) {
        const Cell &c = cells_[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
        const std::int64_t total = c.total.load(std::memory_order_relaxed);
        const std::int64_t cur = c.current.load(std::memory_order_relaxed);
        if (total == 0 && cur == 0) continue;
        fn(Row{r - 1, static_cast<MemKind>(k), cur, c.peak.load(std::memory_order_relaxed), total});
      }
  }
  void reset();

 private:
  static int row(int dev) { return dev < 0 ? 0 : (dev >= kDevices ? kDevices : dev + 1); }
  // One cache line per (device, kind): current, peak and total of a cell are updated together
  // (one line moves per call), and threads working on other devices or kinds never share it.
  // Exact peaks need one process-wide order of the updates of a cell, hence one line per cell
  // rather than per-thread stripes (docs/performance.md, "scaling").
  struct alignas(64) Cell {
    std::atomic<std::int64_t> current{0}, peak{0}, total{0};
  };
  std::array<std::array<Cell, kMemKinds>, kDevices + 1> cells_{};
};

// ---------------------------------------------------------------------------------------------
// Linear allocations: cudaMalloc / cuMemAlloc / host / async / managed / IPC imports.
struct LinearRec {
  std::uint64_t ptr = 0, size = 0;
  std::int32_t dev = -1;
  MemKind kind = MemKind::Linear;
  EventRef alloc;
};

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
  LinearRec rec;            // the live (or freed, or containing) allocation when known
  EventRef first_free;      // DoubleFree: the earlier free
  std::uint64_t vmm_base = 0, vmm_size = 0;  // InVmm: the reservation
};

using KindMask = unsigned;
constexpr KindMask kind_bit(MemKind k) { return 1u << static_cast<unsigned>(k); }

class LinearModel {
 public:
  void on_alloc(const LinearRec &rec);
  // Classifies a free of ptr by an API that frees the kinds in `accepted`. A Live verdict removes
  // the allocation from the live set and remembers it as freed (noted before forwarding); call
  // rollback() if the driver then refuses the free.
  FreeVerdict begin_free(std::uint64_t ptr, KindMask accepted, const EventRef &ev);
  void rollback(const FreeVerdict &v);
  std::optional<LinearRec> find_containing(std::uint64_t p) const;
  std::size_t live_count() const;
  void for_each_live(const std::function<void(const LinearRec &)> &fn) const;
  void clear();
  // fork(): the child does not own the parent's CUDA objects and starts with an empty model. The 64
  // shard locks are not held across fork (holding them all made fork's cost grow with the shards
  // and exceeded what ThreadSanitizer's deadlock detector can follow): the child builds fresh shards
  // over the old ones without touching them, so a map another thread was changing at the fork is
  // simply left behind (the child's copy of it leaks, the parent's is untouched).
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
  struct Freed {
    LinearRec rec;
    EventRef free;
  };
  using LiveMap = std::map<std::uint64_t, LinearRec>;
  using FreedMap = std::map<std::uint64_t, Freed>;
  struct alignas(64) Shard {
    mutable std::mutex mu;
    LiveMap live;
    FreedMap freed;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> freed_fifo;  // (address, free seq) ring
    std::size_t fifo_head = 0;
    // Map nodes taken out by erasures, reused by the next insertions: an allocation and its free
    // move a record from `live` to `freed` and back, which would otherwise be two mallocs and two
    // frees per pair (measured: a third of the instructions the model added, docs/performance.md).
    std::vector<LiveMap::node_type> spare_live;
    std::vector<FreedMap::node_type> spare_freed;
  };
  static constexpr std::size_t kSpareNodes = 16;  // per shard and map
  void remember_freed(Shard &s, const LinearRec &rec, const EventRef &ev);
  static void put_live(Shard &s, const LinearRec &rec);
  static void put_freed(Shard &s, const Freed &f);
  static void drop_freed(Shard &s, FreedMap::iterator it);
  std::array<Shard, kShards> shards_;
};

// ---------------------------------------------------------------------------------------------
// VMM: physical allocations, handle values, reservations, mappings, sleeping ranges.
struct PhysAlloc {
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  Location loc = Location::Device;
  int loc_id = 0;                   // device ordinal or NUMA node
  unsigned handle_types = 0;        // CUmemAllocationHandleType bits requested at create
  unsigned handle_refs = 0;         // live handle references (create, retain, import)
  unsigned map_count = 0;
  bool imported = false;
  EventRef created;
  int dev() const { return loc == Location::Device ? loc_id : -1; }
};

struct HandleRec {
  std::uint64_t value = 0;
  std::uint64_t alloc_id = 0;
  unsigned refs = 0;                // >0: live
  std::uint64_t issue_seq = 0;      // seq of the create/retain/import that issued the current value
  EventRef issued, released;
  std::uint64_t last_res = 0, last_off = 0;  // where this value was last mapped (reservation, offset)
  bool ever_mapped = false;
};

struct Mapping {
  std::uint64_t off = 0, size = 0;  // within the reservation
  std::uint64_t alloc_id = 0;
  std::uint64_t handle = 0;         // value used at map time
  std::uint64_t alloc_off = 0;
  bool access = false;
  EventRef mapped;
};

// A range that was mapped and then unmapped while its reservation was kept: "asleep".
struct Sleeper {
  std::uint64_t off = 0, size = 0;
  std::uint64_t handle = 0;         // the last handle value that backed it
  std::uint64_t alloc_id = 0;
  EventRef unmapped;
};

struct Reservation {
  std::uint64_t base = 0, size = 0;
  std::map<std::uint64_t, Mapping> maps;      // by offset
  std::map<std::uint64_t, Sleeper> asleep;    // by offset
  EventRef reserved;
  bool ever_mapped = false;
};

// Per-thread memory of the last no-op unmap, for the stale-release pairing rule: vLLM's
// unmap_and_release() issues the unmap and the release back to back on one thread.
struct ThreadVmmState {
  bool pending = false;
  std::uint64_t base = 0, size = 0;
  struct Last {
    std::uint64_t handle, alloc_id, unmap_seq;
    EventRef unmapped;
  };
  std::array<Last, 8> last{};
  unsigned nlast = 0;
  EventRef noop_unmap;
};

// What the model concludes about one VMM call, before it is forwarded.
struct VmmVerdict {
  std::optional<Finding> finding;   // class decides the action (Options::action_for)
  bool skippable = false;           // true when the model proves the call has no effect left to have
  // Undo data for rollback after a failed driver call:
  std::vector<Mapping> removed_maps;
  std::vector<Sleeper> removed_sleepers;
  std::uint64_t res_base = 0;
  std::optional<HandleRec> handle_before;
  std::optional<Reservation> reservation_before;
  bool changed = false;             // begin_* changed the model (commit or rollback must follow)
};

// A reservation's mapped pages with what their allocations really are (legacy IPC diagnosis and
// the bridge's exports).
struct PageView {
  std::uint64_t off = 0, size = 0;
  std::uint64_t alloc_id = 0;
  std::uint64_t map_seq = 0;   // the cuMemMap that made the mapping
  unsigned handle_types = 0;   // CUmemAllocationHandleType bits the allocation has
  Location loc = Location::Device;
  int loc_id = 0;
};
struct ReservationPages {
  std::uint64_t base = 0, size = 0;
  EventRef reserved;
  std::vector<PageView> pages;  // by offset
};

struct VmmCounts {
  std::size_t phys = 0, handles = 0, reservations = 0, mappings = 0;
  std::uint64_t phys_bytes = 0, va_bytes = 0;
};

class VmmModel {
 public:
  explicit VmmModel(ByteCounters &counters) : counters_(counters) {}

  // Creation-type calls: only after the driver succeeded.
  void on_create(std::uint64_t handle, std::uint64_t size, Location loc, int loc_id,
                 unsigned handle_types, bool imported, const EventRef &ev);
  // cuMemRetainAllocationHandle(&h, va) succeeded.
  void on_retain(std::uint64_t handle, std::uint64_t va, const EventRef &ev);
  void on_reserve(std::uint64_t base, std::uint64_t size, const EventRef &ev);

  // Map: the verdict may carry map-over-mapped; commit with on_map_ok after success.
  VmmVerdict check_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset,
                       std::uint64_t handle, ThreadVmmState &ts);
  void on_map_ok(std::uint64_t va, std::uint64_t size, std::uint64_t offset, std::uint64_t handle,
                 const EventRef &ev);
  void on_set_access(std::uint64_t va, std::uint64_t size);

  // Unmap, release and address free are noted before forwarding (begin_*: the mappings, the handle
  // reference or the reservation disappear from the model so a concurrent re-issue cannot be
  // confused with them), then either committed after the driver succeeded or rolled back.
  // A skippable verdict may have noted the call too (a stale release of a live value does, so that
  // a forwarded one is followed): a skipped call is rolled back, a forwarded one committed or
  // rolled back like any other (shim/handlers_vmm.cpp with_verdict).
  VmmVerdict begin_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev,
                         ThreadVmmState &ts);
  // Commits return the physical bytes that went away with the call (the last reference of an
  // allocation) and that allocation's device.
  struct Freed {
    std::uint64_t bytes = 0;
    int dev = -1;
  };
  Freed commit_unmap(const VmmVerdict &v);
  void rollback_unmap(const VmmVerdict &v);

  VmmVerdict begin_release(std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts);
  Freed commit_release(const VmmVerdict &v);
  void rollback_release(const VmmVerdict &v);

  VmmVerdict begin_address_free(std::uint64_t base, std::uint64_t size, const EventRef &ev,
                                ThreadVmmState &ts);
  void rollback_address_free(const VmmVerdict &v);

  // The driver accepted a call the model expected it to refuse (a partial unmap, an address free
  // with mappings): the model missed something, so it follows what the driver did.
  Freed force_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev);
  Freed force_address_free(std::uint64_t base, std::uint64_t size, const EventRef &ev);

  // Queries.
  std::optional<Reservation> reservation_containing(std::uint64_t p) const;
  std::optional<ReservationPages> pages_of(std::uint64_t p) const;
  std::optional<PhysAlloc> alloc_of_handle(std::uint64_t handle) const;
  std::optional<HandleRec> handle(std::uint64_t value) const;
  // The physical allocation mapped at va, with the offset into it.
  std::optional<std::pair<PhysAlloc, std::uint64_t>> mapped_at(std::uint64_t va) const;
  VmmCounts counts() const;
  // What the model knows of [va, va+size): "not reserved", "reserved, never mapped", "mapped",
  // "partly mapped", "asleep" (unmapped after being mapped), "unmapped". For failing calls' records.
  const char *range_state(std::uint64_t va, std::uint64_t size) const;
  void for_each_alloc(const std::function<void(const PhysAlloc &)> &fn) const;
  void for_each_reservation(const std::function<void(const Reservation &)> &fn) const;
  void for_each_live_handle(const std::function<void(const HandleRec &)> &fn) const;
  void clear();
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child() {
    mu_.unlock();
    clear();
  }

  // Called on any VMM call that breaks the unmap→release pairing on this thread.
  static void break_pairing(ThreadVmmState &ts) { ts.pending = false; }

 private:
  Reservation *res_containing_locked(std::uint64_t p);
  const Reservation *res_containing_locked(std::uint64_t p) const;
  Freed drop_alloc_if_dead_locked(std::uint64_t alloc_id);
  std::string describe_range_locked(const Reservation &r, std::uint64_t off,
                                    std::uint64_t size) const;

  using Allocs = std::unordered_map<std::uint64_t, PhysAlloc>;
  using Reservations = std::map<std::uint64_t, Reservation>;
  using FreedReservations = std::map<std::uint64_t, std::pair<std::uint64_t, EventRef>>;
  using Maps = std::map<std::uint64_t, Mapping>;
  using Sleepers = std::map<std::uint64_t, Sleeper>;

  ByteCounters &counters_;
  mutable std::mutex mu_;
  std::uint64_t next_alloc_id_ = 1;
  Allocs allocs_;
  std::unordered_map<std::uint64_t, HandleRec> handles_;   // live and released values
  Reservations res_;                                       // by base
  FreedReservations freed_res_;                            // base -> (size, free)
  // Nodes of erased records, reused by the next insertions (a VMM cycle inserts and erases one
  // record of each kind: without this, about ten mallocs and frees per cycle).
  std::vector<Allocs::node_type> spare_allocs_;
  std::vector<Reservations::node_type> spare_res_;
  std::vector<FreedReservations::node_type> spare_freed_res_;
  std::vector<Maps::node_type> spare_maps_;
  std::vector<Sleepers::node_type> spare_sleepers_;
};

}  // namespace cmg

namespace cmg {
// The finding for a free the linear model did not accept (DoubleFree, Interior, WrongKind, InVmm,
// Unknown): phrased here so the hooks stay free of policy text.
Finding finding_for_free(const FreeVerdict &v, const char *api, std::uint64_t ptr);
}  // namespace cmg
