// SPDX-License-Identifier: Apache-2.0
// The VMM model: physical allocations with their (reused) handle values, reservations with their
// mappings and sleeping ranges. Pure C++, thread-safe. Every intercepted VMM call is one
// transaction of this model:
//
//  * Calls that issue something (create, retain, import, reserve) are applied after the driver
//    succeeded, under the lock, in one pass.
//  * Calls that take something away or bind it (map, unmap, release, address free) are *noted*
//    before they are forwarded: begin_*() checks them under the lock, asks the policy
//    (policy/decide.h) what happens to a finding, and — unless the call will be answered without
//    the driver — applies the call at once, so a concurrent re-issue of the value or the address
//    by the driver can never be confused with what this call takes away. The ticket it returns
//    carries the inverse delta; end() applies it if the driver refuses the call. Nothing carried
//    across the unlocked driver call is written back as a snapshot: each inverse step is checked
//    against the generation it undoes. A successful call costs one locked pass.
//  * Issue identity, not progress (real-driver.md D18: the driver re-issues released handle values
//    and reservations). Each handle value carries a generation, bumped under the lock when it is
//    (re-)issued; mappings, sleeping ranges and each thread's record of its last no-op unmap keep
//    the generation they saw. A release paired with a no-op unmap refers to the generation of the
//    sleeping range's last handle: if the value is not live, the release is redundant; if it is live
//    in a newer generation, the value was issued again since the range went to sleep, and the
//    release would free its new owner's memory (stale-release). Before the re-issuing create has
//    returned to the shim, the old generation is still the current one, not live, so the release is
//    a double release: there is no window in which the stale release is forwarded.
//  * A skip that rests on the model holding a value as released (a double release) is checked with
//    the driver's view before it is answered (Decision::confirm, confirm_ticket): the model sees
//    only what is hooked, and a value issued again behind its back is live.
//  * One mutex: VMM calls cost the driver tens of microseconds each (real-driver.md section 4) and
//    the model's work per call is a few map look-ups. The state it keeps is bounded: released
//    values and freed reservations are remembered for the last kReleasedKept / kFreedResKept of
//    each, oldest forgotten first; a no-op unmap (the free-while-asleep path) allocates nothing
//    under the lock and costs O(log n) whatever the number of sleeping ranges it covers.
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

#include "counters.h"
#include "decide.h"
#include "event.h"
#include "fn_ref.h"
#include "inline_vec.h"
#include "in_flight.h"
#include "lock_within.h"

namespace cmg {

struct PhysAlloc {
  std::uint64_t id = 0;
  std::uint64_t size = 0;
  Location loc = Location::Device;
  int loc_id = 0;                   // device ordinal or NUMA node
  unsigned handle_types = 0;        // CUmemAllocationHandleType bits the allocation has
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
  std::uint64_t gen = 0;            // this issue of the value (model-wide counter, never reused)
  EventRef issued, released;
  std::uint64_t last_res = 0, last_off = 0;  // where this value was last mapped (reservation, offset)
  bool ever_mapped = false;
};

struct Mapping {
  std::uint64_t off = 0, size = 0;  // within the reservation
  std::uint64_t alloc_id = 0;       // 0: the handle was not known to the model
  std::uint64_t handle = 0;         // value used at map time
  std::uint64_t gen = 0;            // and its generation
  std::uint64_t alloc_off = 0;
  bool access = false;
  EventRef mapped;
};

// A range that was mapped and then unmapped while its reservation was kept: "asleep".
struct Sleeper {
  std::uint64_t off = 0, size = 0;
  std::uint64_t handle = 0;         // the last handle value that backed it
  std::uint64_t gen = 0;            // and its generation
  std::uint64_t alloc_id = 0;
  EventRef unmapped;
  std::uint64_t since = 0;          // the model's generation counter when it went to sleep
};

struct Reservation {
  std::uint64_t base = 0, size = 0;
  std::uint64_t gen = 0;                      // this issue of the range
  std::map<std::uint64_t, Mapping> maps;      // by offset
  std::map<std::uint64_t, Sleeper> asleep;    // by offset
  EventRef reserved;
  bool ever_mapped = false;
  // A cuMemAddressFree of it is in flight (the seq of that call, 0: none). The reservation stays
  // in the model until the driver answered, so a map made meanwhile is noted in it: if the free is
  // refused, nothing was lost; if it succeeds, such a map is one the driver refused.
  std::uint64_t freeing = 0;
};

// Per-thread record of the last no-op unmap, for the stale-release pairing rule: vLLM's
// unmap_and_release() issues the unmap and the release back to back on one thread. Every model
// entry point takes it and ends the pairing itself, except releases: the releases that follow
// the no-op unmap (one per sleeping range it covered) are all paired with it.
struct ThreadVmmState {
  bool pending = false;
  std::uint64_t base = 0, size = 0;  // the no-op unmap's range
  std::uint64_t res_base = 0, res_gen = 0;  // its reservation
  std::uint64_t mark = 0;            // the model's generation counter at the no-op unmap
  struct Last {
    std::uint64_t handle, gen, alloc_id;
    EventRef unmapped;
  };
  // Every sleeping range the no-op unmap covered, however many: an unmap of several ranges is
  // followed by one release per range, and each of them is judged. The first eight are kept here
  // as they were at the unmap (no heap memory in thread-local state: a forked child's leak checker
  // cannot see the other threads' storage). Past eight (`more`), the release looks the ranges up
  // in the reservation, among those that were asleep at the unmap (Sleeper::since <= mark) and are
  // still asleep: nothing is copied under the lock for them.
  std::array<Last, 8> last{};
  unsigned nlast = 0;
  bool more = false;
  std::uint64_t beyond = 0;          // more: the offset of the ninth range in the reservation
  EventRef noop_unmap;
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
  std::size_t released_kept = 0, freed_res_kept = 0;  // records of released values, freed ranges
  std::uint64_t phys_bytes = 0, va_bytes = 0;
};

// Physical bytes that went away with a call (the last reference of an allocation) and their device.
struct VmmFreed {
  std::uint64_t bytes = 0;
  int dev = -1;
};

// One VMM call in flight: what begin_*() decided and what end() undoes if the driver refuses.
struct VmmTicket {
  enum class Op : std::uint8_t { None, Map, Unmap, Release, AddressFree };
  Op op = Op::None;
  std::uint64_t va = 0, size = 0, value = 0;  // the call's range and handle
  std::uint64_t alloc_off = 0;       // map: the offset into the allocation
  std::optional<Finding> finding;
  Decision decision;                 // what happens to the finding (decide.h)
  bool noted = false;                // the call is applied in the model; end() undoes it on refusal
  EventRef ev;
  std::uint64_t gen = 0;             // release: the generation whose reference it dropped; map:
                                     // the generation it mapped
  std::uint64_t res_gen = 0;         // map, unmap: the reservation's generation
  std::uint64_t gen_floor = 0;       // release: the first generation issued after it began
  std::uint64_t alloc_id = 0;        // release: the allocation of the reference it dropped
  int dev = -1;                      // unmap: the device of the memory it unmapped (-1: host, unknown)
  EventRef mapped;                   // unmap: the map that made the (first) mapping it took away
  InlineVec<Mapping, 1> unmapped;    // unmap: the mappings it took away (now asleep)
  InlineVec<Sleeper, 1> woken;       // map: the sleeping ranges it replaced
  InlineVec<PhysAlloc, 1> dropped;   // allocations whose last reference went with the call
  VmmFreed freed;                    // bytes that went away with the call
  struct Where {
    std::uint64_t res = 0, off = 0;
    bool ever_mapped = false;
  } prev_where;                      // map: where the handle value was last mapped before
  bool prev_ever_mapped = false;     // map: whether the reservation had been mapped before
  bool sized_import = false;         // map: the first mapping of an import gave it its size
  bool va_freed = false;             // address free: the reservation's bytes went away
  bool follow = false;               // not noted, but the model follows the driver if it accepts
  const char *va_state = nullptr;    // a refused call: what the model knows of the range
  // Unmap of nothing: what its finding says of the reservation, copied under the lock so that the
  // finding is phrased after it (no allocation under the model's lock on this path).
  struct Noop {
    std::uint64_t res_base = 0, res_size = 0;
    bool ever_mapped = false;
    EventRef reserved;
  } noop;

  bool skip() const { return finding && decision.skip; }
};

class VmmModel {
 public:
  // How many released handle values and freed reservations are remembered (for double-release
  // and double-address-free findings), oldest forgotten first. A value the model no longer knows
  // is forwarded (release-unknown): the driver answers it, as it would without the shim.
  static constexpr std::size_t kReleasedKept = 4096;
  static constexpr std::size_t kFreedResKept = 4096;

  explicit VmmModel(ByteCounters &counters) : counters_(counters) {}

  // Issuing calls, after the driver succeeded.
  void on_create(std::uint64_t handle, std::uint64_t size, Location loc, int loc_id,
                 unsigned handle_types, bool imported, const EventRef &ev, ThreadVmmState &ts);
  // cuMemRetainAllocationHandle(&h, va) succeeded.
  void on_retain(std::uint64_t handle, std::uint64_t va, const EventRef &ev, ThreadVmmState &ts);
  void on_reserve(std::uint64_t base, std::uint64_t size, const EventRef &ev, ThreadVmmState &ts);
  void on_set_access(std::uint64_t va, std::uint64_t size);

  // Taking and binding calls: begin before the driver, end after it (ok: the driver succeeded).
  VmmTicket begin_map(std::uint64_t va, std::uint64_t size, std::uint64_t offset,
                      std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts,
                      const Options &o);
  // `owner_teardown`: the caller proved [va, va+size) is a reservation the code unmapping it made
  // for an object it is now tearing down (NCCL's window range at ncclCommDestroy,
  // NcclHolds::own_teardown). An unmap of the whole of such a reservation with nothing mapped is
  // that teardown, forwarded without a finding; any other unmap is judged as usual.
  VmmTicket begin_unmap(std::uint64_t va, std::uint64_t size, const EventRef &ev,
                        ThreadVmmState &ts, const Options &o, bool owner_teardown = false);
  VmmTicket begin_release(std::uint64_t handle, const EventRef &ev, ThreadVmmState &ts,
                          const Options &o);
  VmmTicket begin_address_free(std::uint64_t base, std::uint64_t size, const EventRef &ev,
                               ThreadVmmState &ts, const Options &o);
  // Completes the transaction. A skipped ticket needs no end() (nothing was noted). Returns what
  // went away with the call (0 bytes when it was refused), and sets t.va_state when it was refused.
  VmmFreed end(VmmTicket &t, bool ok);

  // Queries.
  std::optional<ReservationPages> pages_of(std::uint64_t p) const;
  // The reservation containing p: its base and size, without its mappings.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> reservation_range(std::uint64_t p) const;
  std::optional<HandleRec> handle(std::uint64_t value) const;
  // The physical allocation mapped at va, with the offset into it.
  std::optional<std::pair<PhysAlloc, std::uint64_t>> mapped_at(std::uint64_t va) const;
  // A live physical allocation by id (nullopt once its last handle and mapping are gone).
  std::optional<PhysAlloc> alloc(std::uint64_t id) const;
  VmmCounts counts() const;
  // What the model knows of [va, va+size): "not reserved", "reserved, never mapped", "mapped",
  // "partly mapped", "asleep" (unmapped after being mapped), "unmapped".
  const char *range_state(std::uint64_t va, std::uint64_t size) const;
  void for_each_alloc(const std::function<void(const PhysAlloc &)> &fn) const;
  void for_each_reservation(const std::function<void(const Reservation &)> &fn) const;
  void for_each_live_handle(const std::function<void(const HandleRec &)> &fn) const;
  // The allocations, reservations and counts at once, for exit paths (lock_within.h): visited in
  // place, allocating nothing; false, with nothing visited, when this thread holds the lock or it
  // stays taken for patience_ns.
  bool visit_within(std::uint64_t patience_ns, FnRef<void(const PhysAlloc &)> alloc,
                    FnRef<void(const Reservation &)> res, VmmCounts &counts) const;
  void clear();
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child() {
    mu_.unlock();
    clear();
    issues.fork_child();
  }

  // After a failure inside the shim the model may have missed a call: it proves nothing from then
  // on (shim/shield.h).
  void distrust() { trusted_.store(false, std::memory_order_relaxed); }
  bool trusted() const { return trusted_.load(std::memory_order_relaxed); }

  // Creates, retains and imports until they reach the model, releases until the driver answered:
  // the hooks mark them (InFlightCall), a release waits for them (confirm_ticket).
  InFlightCalls issues;

 private:
  using Allocs = std::unordered_map<std::uint64_t, PhysAlloc>;
  using Reservations = std::map<std::uint64_t, Reservation>;
  using FreedReservations = std::map<std::uint64_t, std::pair<std::uint64_t, EventRef>>;
  using Maps = std::map<std::uint64_t, Mapping>;
  using Sleepers = std::map<std::uint64_t, Sleeper>;

  Reservation *res_containing_locked(std::uint64_t p);
  const Reservation *res_containing_locked(std::uint64_t p) const;
  const char *range_state_locked(std::uint64_t va, std::uint64_t size) const;
  // Issues handle value `value` to allocation `alloc_id` in a new generation.
  void issue_locked(std::uint64_t value, std::uint64_t alloc_id, const EventRef &ev);
  // Drops the allocation when nothing refers to it any more; keeps it in `t` for the inverse.
  void drop_if_dead_locked(std::uint64_t alloc_id, VmmTicket *t, VmmFreed &freed);
  void note_map_locked(VmmTicket &t, Reservation &r, std::uint64_t offset);
  void note_unmap_locked(VmmTicket &t, Reservation &r, std::uint64_t off, std::uint64_t end);
  void note_release_locked(VmmTicket &t, HandleRec &h);
  // Puts back an allocation that died with a refused call (its inverse delta), if it is gone.
  PhysAlloc *undo_drop_locked(VmmTicket &t, std::uint64_t alloc_id);
  // Removes a reservation the driver no longer has, with what its mappings held.
  void erase_res_locked(Reservations::iterator it, VmmFreed &freed);
  // Bounded memory of released values and freed reservations (by age).
  void remember_released_locked(const HandleRec &h);
  void remember_freed_res_locked(std::uint64_t base, std::uint64_t size, const EventRef &ev);
  // The pairing rule's sleeping ranges past the eighth, looked up at the release.
  // A sleeping range of the paired no-op unmap backed by `handle`, which the model knows of
  // (the value's own record aged out).
  std::optional<ThreadVmmState::Last> paired_forgotten_locked(const ThreadVmmState &ts,
                                                              std::uint64_t handle) const;
  const Sleeper *paired_beyond_locked(const ThreadVmmState &ts, std::uint64_t handle,
                                      std::uint64_t gen) const;
  void end_map_locked(VmmTicket &t, bool ok);
  void end_unmap_locked(VmmTicket &t, bool ok);
  void end_release_locked(VmmTicket &t, bool ok);
  void end_address_free_locked(VmmTicket &t, bool ok);
  // The driver accepted a call the model expected it to refuse (a partial unmap, a map over a
  // mapped range, an address free with mappings): the model missed something and follows it.
  void force_unmap_locked(Reservation &r, std::uint64_t off, std::uint64_t end, const EventRef &ev,
                          VmmFreed &freed);

  ByteCounters &counters_;
  std::atomic<bool> trusted_{true};
  mutable MarkedMutex mu_;  // its holder is known (exit paths, lock_within.h)
  std::uint64_t next_alloc_id_ = 1;
  std::uint64_t next_gen_ = 1;    // handle-value and reservation generations
  Allocs allocs_;
  std::unordered_map<std::uint64_t, HandleRec> handles_;   // live and released values
  Reservations res_;                                       // by base
  FreedReservations freed_res_;                            // base -> (size, free)
  // Rings in the order of release and of free, (value, generation) and (base, seq), for the
  // bounded memory above: the oldest entry is forgotten when it is still the record's last event.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> released_ring_, freed_res_ring_;
  std::size_t released_head_ = 0, freed_res_head_ = 0;
  // Nodes of erased records, reused by the next insertions (node_reuse.h).
  std::vector<Allocs::node_type> spare_allocs_;
  std::vector<Reservations::node_type> spare_res_;
  std::vector<FreedReservations::node_type> spare_freed_res_;
  std::vector<Maps::node_type> spare_maps_;
  std::vector<Sleepers::node_type> spare_sleepers_;
};

// Findings of the VMM model (vmm_findings.cpp): phrased here, from what the model holds.
namespace vmm_findings {
Finding map_over_mapped(std::uint64_t va, std::uint64_t size, std::uint64_t handle,
                        const Reservation &r, const Mapping &current);
// `ts` holds the sleeping ranges the unmap covered (the first eight; `more`: there were more).
Finding unmap_unmapped(std::uint64_t va, std::uint64_t size, const VmmTicket::Noop &r,
                       const ThreadVmmState &ts);
Finding partial_unmap(std::uint64_t va, std::uint64_t size, const Reservation &r,
                      const std::vector<const Mapping *> &hit);
Finding release_unknown(std::uint64_t handle);
Finding stale_release_paired(std::uint64_t handle, const ThreadVmmState &pair,
                             const ThreadVmmState::Last &l, const HandleRec &h);
// A release paired with a no-op unmap whose sleeping range this value backed, the value's record
// aged out (released, not issued again since through a hooked call).
Finding released_again_forgotten(std::uint64_t handle, const ThreadVmmState &pair,
                                 const ThreadVmmState::Last &l);
Finding released_again(std::uint64_t handle, const HandleRec &h, bool replaced,
                       const EventRef &replaced_by);
// A release the model held as redundant (`was`: its double or stale release) whose value the
// driver holds live: issued again through a path the shim does not see; forwarded.
Finding unseen_release(std::uint64_t handle, const Finding &was, const DriverView &v);
Finding double_address_free(std::uint64_t base, std::uint64_t size, const EventRef &first);
Finding free_mapped_va(std::uint64_t base, std::uint64_t size, const Reservation &r);
// cuMemUnmap of memory whose device still had work queued: `how` is "query" (the stream was busy)
// or "sync" (the context synchronised after waited_ns).
Finding unmap_while_busy(const VmmTicket &t, const char *how, std::uint64_t waited_ns);
// JSON array of the mapped and unmapped pieces of [off, off+size) of r.
std::string describe_range(const Reservation &r, std::uint64_t off, std::uint64_t size);
}  // namespace vmm_findings

}  // namespace cmg

namespace cmg {

// The one sequence of a VMM call the model has a ticket for, shared by the hooks and the tests:
// skip (answered without the driver), abort first (strict mode, reported before the driver), or
// call the driver and complete the transaction with its answer.
struct VmmOutcome {
  bool called = false;      // the driver was called
  bool abort_first = false; // strict: the caller reports with Action::Abort and aborts
  int status = 0;           // what the caller gets (0 when skipped)
  bool report = false;      // the finding stands: report it with `status`
  VmmFreed freed;
};

// A ticket whose decision rests on the model holding the value as released (Decision::confirm):
// `prove` asks the driver. The driver's "live" is conclusive only when no call of another thread
// could be the cause: between a create (retain, import) the shim sees handing the value out and
// the model hearing of it, and between the model noting a release and the driver's, the driver
// holds a value live that the model holds as released, exactly as after an unseen re-issue. So the
// call is judged (`begin`) and the driver asked inside a window in which `calls` (InFlightCalls, or
// a test's stand-in: mark(), quiet_since(mark), settle()) saw no such call of another thread in
// flight or starting; otherwise they are waited for and it is tried again, a few rounds at most.
// When the window never came, the answer could be theirs: the model's proof stands. Returns the
// driver's last conclusive answer, with t's decision confirmed.
template <class Begin, class Prove, class Calls>
DriverView confirm_ticket(VmmTicket &t, Begin &&begin, Prove &&prove, Calls &calls) {
  if (!t.finding || !t.decision.confirm) return {};
  DriverView view{DriverView::Live::No, nullptr};
  for (int round = 0; round < 4; ++round) {
    const auto mark = calls.mark();
    t = begin();  // judged again: the model may have heard of the calls meanwhile
    if (!t.finding || !t.decision.confirm) return {};
    const DriverView v = prove();
    if (v.live != DriverView::Live::Yes || calls.quiet_since(mark)) {
      view = v;
      break;
    }
    calls.settle();
  }
  confirmed(view, t.decision);
  return view;
}

// `view`: what confirm_ticket found; a decision still waiting for it is not proven, and forwarded.
template <class Driver>
VmmOutcome run_transaction(VmmModel &m, VmmTicket &t, Driver &&driver, const DriverView &view) {
  VmmOutcome o;
  if (t.finding && t.decision.confirm) confirmed(view, t.decision);
  if (t.skip()) {
    o.report = true;
    return o;
  }
  if (t.finding && t.decision.abort_first) {
    o.abort_first = o.report = true;
    return o;
  }
  o.called = true;
  o.status = static_cast<int>(driver());
  o.freed = m.end(t, o.status == 0);
  if (t.decision.unseen && o.status == 0) {
    // The driver released a value the model held as released: it had been issued again unseen.
    t.finding = vmm_findings::unseen_release(t.value, *t.finding, view);
    t.decision.action = Action::Forward;
    o.report = true;
    return o;
  }
  o.report = t.finding && t.decision.stands(o.status == 0);
  return o;
}

}  // namespace cmg
