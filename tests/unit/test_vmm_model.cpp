// SPDX-License-Identifier: Apache-2.0
// The VMM model without preload: the lifecycle cases of bug-patterns.md (P01-P10) and the
// transaction rules (vmm_model.h). Each call goes through run_transaction(), the sequence the hooks
// run, with the driver's answer given by the test.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>

#include "tracker.h"

using namespace cmg;

namespace {

constexpr std::uint64_t G = 2ull << 20;  // granularity (real-driver.md D19)

struct Clock {
  std::uint64_t seq = 0;
  EventRef next(const char *api, std::uint32_t tid = 1) {
    ++seq;
    return EventRef{seq, seq * 1000, tid, 0, api};
  }
};

// What one call did, as the hook sees it.
struct Result {
  std::optional<Finding> finding;  // the finding, whether or not it stands
  bool skipped = false;            // answered without the driver
  bool reported = false;           // the finding stands and is reported
  bool noted = false;              // the model applied the call before the driver answered
  int status = 0;
  VmmFreed freed;
  // A map's result reads as its finding: REQUIRE_FALSE(t.map(...)) is "no finding".
  explicit operator bool() const { return finding.has_value(); }
  const Finding *operator->() const { return &*finding; }
};

struct Vmm {
  ByteCounters counters;
  VmmModel m{counters};
  Clock clk;
  ThreadVmmState ts;
  Options opts;  // guard mode, no overrides
  std::uint32_t tid = 1;
  // What the driver says of a value the model holds as released, when the model asks: by default
  // it agrees (the value is not live); `proves` counts the questions.
  DriverView::Live at_driver = DriverView::Live::No;
  int proves = 0;

  Result run(VmmTicket t, bool driver_ok) {
    Result r;
    // One thread: no call of another is ever in flight, every window is quiet.
    struct Quiet {
      int mark() const { return 0; }
      bool quiet_since(int) const { return true; }
      void settle() {}
    } calls;
    const VmmTicket judged = t;
    const DriverView view = confirm_ticket(
        t, [&] { return judged; },
        [&] {
          ++proves;
          return DriverView{at_driver, nullptr};
        },
        calls);
    VmmOutcome o = run_transaction(m, t, [&] { return driver_ok ? 0 : 1; }, view);
    r.finding = t.finding;
    r.skipped = !o.called;
    r.reported = o.report;
    r.noted = t.noted;
    r.status = o.status;
    r.freed = o.freed;
    return r;
  }
  void create(std::uint64_t h, std::uint64_t size = G, Location loc = Location::Device) {
    m.on_create(h, size, loc, 0, 1, false, clk.next("cuMemCreate", tid), ts);
  }
  void reserve(std::uint64_t v, std::uint64_t size) {
    m.on_reserve(v, size, clk.next("cuMemAddressReserve", tid), ts);
  }
  void retain(std::uint64_t h, std::uint64_t va) {
    m.on_retain(h, va, clk.next("cuMemRetainAllocationHandle", tid), ts);
  }
  Result map(std::uint64_t v, std::uint64_t size, std::uint64_t h, bool driver_ok = true) {
    return run(m.begin_map(v, size, 0, h, clk.next("cuMemMap", tid), ts, opts), driver_ok);
  }
  Result unmap(std::uint64_t v, std::uint64_t size, bool driver_ok = true) {
    return run(m.begin_unmap(v, size, clk.next("cuMemUnmap", tid), ts, opts), driver_ok);
  }
  // An unmap the caller proved is the reservation's maker tearing it down (NcclHolds).
  Result unmap_owner_teardown(std::uint64_t v, std::uint64_t size) {
    return run(m.begin_unmap(v, size, clk.next("cuMemUnmap", tid), ts, opts, true), true);
  }
  Result release(std::uint64_t h, bool driver_ok = true) {
    return run(m.begin_release(h, clk.next("cuMemRelease", tid), ts, opts), driver_ok);
  }
  Result address_free(std::uint64_t v, std::uint64_t size, bool driver_ok = true) {
    return run(m.begin_address_free(v, size, clk.next("cuMemAddressFree", tid), ts, opts),
               driver_ok);
  }
  std::int64_t vmm_bytes() const {
    for (const auto &r : counters.snapshot())
      if (r.kind == MemKind::Vmm && r.dev == 0) return r.current;
    return 0;
  }
};

FindingClass cls(const Result &v) {
  REQUIRE(v.finding.has_value());
  return v.finding->cls;
}

}  // namespace

TEST_CASE("A reservation's maker unmapping all of it with nothing mapped is its teardown") {
  // NCCL 2.28.9's window range (docs/gpu/nccl-window/): reserved, a window mapped and unmapped in
  // it, then unmapped whole and freed by ncclDevrFinalize.
  Vmm t;
  const std::uint64_t V = 0x4900000000, S = 64 * G, H = 0x55d0c0b0;
  t.reserve(V, S);
  t.create(H);
  REQUIRE_FALSE(t.map(V, G, H));
  CHECK_FALSE(t.unmap(V, G).finding);
  CHECK_FALSE(t.release(H).finding);
  SECTION("judged as usual without the proof") {
    auto u = t.unmap(V, S);
    CHECK(cls(u) == FindingClass::UnmapUnmapped);
    CHECK(u.skipped);
    CHECK(t.ts.pending);
  }
  SECTION("a part of it, even with the proof, is still a second unmap of a sleeping range") {
    auto u = t.unmap_owner_teardown(V, G);
    CHECK(cls(u) == FindingClass::UnmapUnmapped);
    CHECK(u.skipped);
  }
  SECTION("the whole of it with the proof: forwarded, no finding, nothing to pair") {
    auto u = t.unmap_owner_teardown(V, S);
    CHECK_FALSE(u.finding);
    CHECK_FALSE(u.skipped);
    CHECK(u.status == 0);
    CHECK_FALSE(t.ts.pending);
    CHECK_FALSE(t.address_free(V, S).finding);
    CHECK(t.m.counts().reservations == 0);
  }
}

TEST_CASE("P01: free while asleep - second unmap and release are proven redundant") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  REQUIRE_FALSE(t.map(V, G, H));
  // sleep(): unmap + release
  CHECK_FALSE(t.unmap(V, G).finding);
  CHECK_FALSE(t.release(H).finding);
  CHECK(t.vmm_bytes() == 0);
  CHECK(t.m.counts().phys == 0);
  // free while asleep
  auto u = t.unmap(V, G);
  CHECK(cls(u) == FindingClass::UnmapUnmapped);
  CHECK(u.skipped);
  CHECK(u.finding->msg.find("asleep") != std::string::npos);
  REQUIRE(u.finding->related.size() >= 1);
  CHECK(u.finding->related[0].ev.seq == 4);  // the sleep-time unmap
  auto r = t.release(H);
  CHECK(cls(r) == FindingClass::DoubleRelease);
  CHECK(r.skipped);
  CHECK(r.finding->related[0].what == "first release");
  CHECK(r.finding->related[0].ev.seq == 5);
  auto a = t.address_free(V, G);
  CHECK_FALSE(a.finding);
  CHECK(a.noted);
  auto c = t.m.counts();
  CHECK(c.phys == 0);
  CHECK(c.handles == 0);
  CHECK(c.reservations == 0);
}

TEST_CASE("P02: stale release after the handle value was re-issued to another allocation") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, V2 = 0x7f0000400000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  t.unmap(V, G);
  t.release(H);
  // Another allocation while asleep gets the same handle value (real-driver.md D18).
  t.reserve(V2, G);
  t.create(H);
  REQUIRE_FALSE(t.map(V2, G, H));
  auto u = t.unmap(V, G);
  CHECK(cls(u) == FindingClass::UnmapUnmapped);
  auto r = t.release(H);
  CHECK(cls(r) == FindingClass::StaleRelease);
  CHECK(r.skipped);
  // The newer allocation is intact in the model: still mapped at V2, its handle still live.
  auto at = t.m.mapped_at(V2);
  REQUIRE(at.has_value());
  auto h = t.m.handle(H);
  REQUIRE(h.has_value());
  CHECK(h->refs == 1);
  CHECK(t.vmm_bytes() == static_cast<std::int64_t>(G));
}

TEST_CASE("Pairing rule needs the no-op unmap right before the release on the same thread") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, V2 = 0x7f0000400000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  t.unmap(V, G);
  t.release(H);
  t.reserve(V2, G);
  t.create(H);
  t.map(V2, G, H);
  t.unmap(V, G);  // no-op
  t.create(0x55d0d000);  // any other VMM call on this thread breaks the pairing
  auto r = t.release(H);
  CHECK_FALSE(r.finding);  // a legitimate-looking release of the live value: forwarded
}

TEST_CASE("P03: sleeping twice makes the second pass a no-op per allocation") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, 2 * G);
  t.create(H, 2 * G);
  t.map(V, 2 * G, H);
  CHECK_FALSE(t.unmap(V, 2 * G).finding);
  CHECK_FALSE(t.release(H).finding);
  CHECK(cls(t.unmap(V, 2 * G)) == FindingClass::UnmapUnmapped);
  CHECK(cls(t.release(H)) == FindingClass::DoubleRelease);
}

TEST_CASE("P04: wake without sleep maps over a mapped range") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0, H2 = 0x55d0c100;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  t.create(H2);
  auto f = t.map(V, G, H2, /*driver_ok=*/false);
  REQUIRE(f);
  CHECK(f->cls == FindingClass::MapOverMapped);
  CHECK(f->msg.find("0x55d0c0a0") != std::string::npos);  // the current handle
  CHECK(f->msg.find("0x55d0c100") != std::string::npos);  // the handle that will leak
  CHECK(f->state_json.find("\"current_handle\":\"0x55d0c0a0\"") != std::string::npos);
}

TEST_CASE("P05: wake after OOM - teardown releases the kept value again") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H1 = 0x55d0c0a0;
  t.reserve(V, 2 * G);
  t.create(H1);
  // create H2 fails with OOM: nothing enters the model. Cleanup releases H1.
  CHECK_FALSE(t.release(H1).finding);
  auto u = t.unmap(V, 2 * G);
  CHECK(cls(u) == FindingClass::UnmapUnmapped);
  CHECK(u.finding->state_json.find("reserved, never mapped") != std::string::npos);
  CHECK(cls(t.release(H1)) == FindingClass::DoubleRelease);
}

TEST_CASE("P06: teardown unmaps a range that is only partly mapped") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, 3 * G);
  t.create(0x100);
  t.create(0x200);
  t.create(0x300);
  t.map(V, G, 0x100);
  t.map(V + G, G, 0x200, /*driver_ok=*/false);  // injected failure: not in the model
  auto u = t.unmap(V, 3 * G, /*driver_ok=*/false);
  CHECK(cls(u) == FindingClass::PartialUnmap);
  CHECK_FALSE(u.skipped);
  CHECK(u.finding->state_json.find("{\"offset\":0,\"size\":2097152,\"mapped\":true") !=
        std::string::npos);
  CHECK(u.finding->state_json.find("{\"offset\":2097152,\"size\":4194304,\"mapped\":false}") !=
        std::string::npos);
  // Nothing changed: V+0 is still mapped.
  CHECK(t.m.mapped_at(V).has_value());
}

TEST_CASE("P07: a failed unmap leaves the range mapped; the wake maps over it") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  auto u = t.unmap(V, G, /*driver_ok=*/false);
  CHECK_FALSE(u.finding);
  CHECK(t.m.mapped_at(V).has_value());  // state changes only on driver success
  CHECK_FALSE(t.release(H).finding);    // legal: the memory lives while mapped (D13)
  CHECK(t.m.counts().phys == 1);
  t.create(H);  // the driver re-issues the value
  auto f = t.map(V, G, H, /*driver_ok=*/false);
  REQUIRE(f);
  CHECK(f->cls == FindingClass::MapOverMapped);
}

TEST_CASE("P08: owner releases a value a pause layer released and replaced at the same range") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0, H2 = 0x55d0c200;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  // pause/resume layer
  t.unmap(V, G);
  t.release(H);
  t.create(H2);
  t.map(V, G, H2);
  // owner
  CHECK_FALSE(t.unmap(V, G).finding);
  auto r = t.release(H);
  CHECK(cls(r) == FindingClass::StaleRelease);
  CHECK(r.skipped);
}

// Found by tests/stress (seed 3959, report mode): the stale release of the pairing rule, forwarded
// instead of skipped, released the value in the driver but not in the model, which then showed the
// allocation live until exit and lost it when the value was issued again.
TEST_CASE("P02 in report mode: a forwarded stale release is followed by the model") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, V2 = 0x7f0000400000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  t.unmap(V, G);
  t.release(H);
  t.reserve(V2, G);
  t.create(H);  // B gets A's value
  REQUIRE_FALSE(t.map(V2, G, H));
  t.unmap(V, G);
  t.opts.mode = Mode::Report;
  auto r = t.release(H);
  CHECK_FALSE(r.skipped);
  CHECK(cls(r) == FindingClass::StaleRelease);
  // The driver released B's handle: the value is not live, B lives on through its mapping only.
  auto h = t.m.handle(H);
  REQUIRE(h.has_value());
  CHECK(h->refs == 0);
  auto a = t.m.mapped_at(V2);
  REQUIRE(a.has_value());
  CHECK(a->first.handle_refs == 0);
  // Unmapping B frees it; nothing is left.
  t.unmap(V2, G);
  CHECK(t.m.counts().phys == 0);
  CHECK(t.vmm_bytes() == 0);
  // Forwarded and refused by the driver, the release changes nothing.
  t.create(H);
  t.reserve(0x7f0000800000, G);
  t.map(0x7f0000800000, G, H);
  t.unmap(0x7f0000800000, G);
  t.release(H);
  t.create(H);  // D gets the value, and is mapped (a stale release needs a victim in use)
  t.reserve(0x7f0000c00000, G);
  REQUIRE_FALSE(t.map(0x7f0000c00000, G, H));
  t.unmap(0x7f0000800000, G);
  auto refused = t.release(H, /*driver_ok=*/false);
  CHECK(cls(refused) == FindingClass::StaleRelease);
  CHECK(t.m.handle(H)->refs == 1);
}

TEST_CASE("P09: address free while a granule is still mapped") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, 2 * G);
  t.create(0x100);
  t.map(V, G, 0x100);
  auto a = t.address_free(V, 2 * G, /*driver_ok=*/false);  // real-driver.md D11
  CHECK(cls(a) == FindingClass::FreeMappedVa);
  CHECK(a.reported);
  CHECK_FALSE(a.noted);
  CHECK(t.m.counts().reservations == 1);
  // A driver that accepts it proves the model wrong, not the program: no finding stands, and the
  // model follows the driver (the mapping and its allocation go with the reservation).
  t.release(0x100);
  auto b = t.address_free(V, 2 * G, /*driver_ok=*/true);
  CHECK(cls(b) == FindingClass::FreeMappedVa);
  CHECK_FALSE(b.reported);
  CHECK(t.m.counts().reservations == 0);
  CHECK(t.m.counts().phys == 0);
  CHECK(t.vmm_bytes() == 0);
}

TEST_CASE("P10: NCCL's release-at-once and retain pattern gives no finding") {
  for (Location loc : {Location::Device, Location::HostNuma}) {
    Vmm t;
    const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
    t.create(H, G, loc);
    t.reserve(V, G);
    REQUIRE_FALSE(t.map(V, G, H));
    t.m.on_set_access(V, G);
    CHECK_FALSE(t.release(H).finding);  // released at once; the mapping keeps it alive
    CHECK(t.m.counts().phys == 1);
    t.retain(H, V);  // value reused by the driver
    CHECK_FALSE(t.unmap(V, G).finding);
    CHECK(t.m.counts().phys == 1);      // the retained handle keeps it
    CHECK_FALSE(t.release(H).finding);
    CHECK_FALSE(t.address_free(V, G).finding);
    auto c = t.m.counts();
    CHECK(c.phys == 0);
    CHECK(c.handles == 0);
    CHECK(c.reservations == 0);
    CHECK(t.vmm_bytes() == 0);
  }
}

TEST_CASE("Retain that returns a live value counts references (real-driver.md D16)") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.create(H);
  t.reserve(V, G);
  t.map(V, G, H);
  t.retain(H, V);
  CHECK(t.m.handle(H)->refs == 2);
  CHECK_FALSE(t.release(H).finding);
  CHECK_FALSE(t.release(H).finding);  // both releases are legitimate
  CHECK(cls(t.release(H)) == FindingClass::DoubleRelease);
}

TEST_CASE("Sleep/wake cycles rebind the range to each new handle") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  for (std::uint64_t i = 0; i < 100; ++i) {
    const std::uint64_t h = 0x55d0c0a0 + (i % 3) * 0x40;  // values reused
    t.create(h);
    REQUIRE_FALSE(t.map(V, G, h));
    REQUIRE_FALSE(t.unmap(V, G).finding);
    REQUIRE_FALSE(t.release(h).finding);
  }
  CHECK_FALSE(t.address_free(V, G).finding);
  CHECK(t.m.counts().phys == 0);
}

TEST_CASE("Release of an unknown value and of zero") {
  Vmm t;
  CHECK(cls(t.release(0)) == FindingClass::ReleaseUnknown);
  CHECK(cls(t.release(0x1234)) == FindingClass::ReleaseUnknown);
  CHECK_FALSE(t.release(0x1234).skipped);
}

TEST_CASE("Double address free and rollback of a refused address free") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  auto a = t.address_free(V, G, /*driver_ok=*/false);
  REQUIRE(a.noted);
  CHECK(a.status == 1);
  CHECK(t.m.counts().reservations == 1);
  a = t.address_free(V, G);
  REQUIRE(a.noted);
  CHECK(cls(t.address_free(V, G)) == FindingClass::DoubleAddressFree);
}

TEST_CASE("A refused release is rolled back") {
  Vmm t;
  t.create(0x100);
  auto v = t.release(0x100, /*driver_ok=*/false);
  CHECK_FALSE(v.finding);
  CHECK(t.m.handle(0x100)->refs == 1);
  CHECK(t.m.counts().phys == 1);
}

TEST_CASE("VMM model: odd sizes are left to the driver") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  t.create(0x100);
  t.map(V, G, 0x100);
  CHECK_FALSE(t.map(V, 0, 0x100, /*driver_ok=*/false).finding);  // size 0: no claim
  auto u = t.unmap(V, ~0ull - 5, /*driver_ok=*/false);  // would wrap
  CHECK_FALSE(u.finding);
  CHECK_FALSE(u.skipped);
  CHECK(t.m.mapped_at(V).has_value());
}

TEST_CASE("VMM model: a wake-up whose map failed releases its fresh handle legitimately") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  t.map(V, G, H);
  t.unmap(V, G);
  t.release(H);
  t.create(H);  // wake-up: the value is re-issued, then its map fails
  CHECK(cls(t.unmap(V, G)) == FindingClass::UnmapUnmapped);
  auto r = t.release(H);
  CHECK_FALSE(r.finding);  // not stale: nothing of the value's allocation is mapped anywhere
  CHECK(t.m.counts().phys == 0);
}

TEST_CASE("An imported handle gets its size from its first mapping; a refused map gives it back") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.m.on_create(H, 0, Location::Device, 0, 1, /*imported=*/true, t.clk.next("cuMemImport"), t.ts);
  CHECK(t.vmm_bytes() == 0);
  t.reserve(V, 2 * G);
  REQUIRE_FALSE(t.map(V, G, H, /*driver_ok=*/false));
  CHECK(t.vmm_bytes() == 0);
  REQUIRE_FALSE(t.map(V, G, H));
  CHECK(t.vmm_bytes() == static_cast<std::int64_t>(G));
  auto at = t.m.mapped_at(V);
  REQUIRE(at.has_value());
  CHECK(at->first.size == G);
  CHECK(at->first.dev() == 0);
  CHECK_FALSE(t.unmap(V, G).finding);
  CHECK_FALSE(t.release(H).finding);
  CHECK(t.vmm_bytes() == 0);
  CHECK(t.m.counts().phys == 0);
}

TEST_CASE("A handle released twice that was never mapped is named as such") {
  Vmm t;
  t.create(0x100);
  CHECK_FALSE(t.release(0x100).finding);
  auto r = t.release(0x100);
  CHECK(cls(r) == FindingClass::DoubleRelease);
  CHECK(r.skipped);
  CHECK(r->msg.find("never mapped") != std::string::npos);
  CHECK(r->state_json.find("\"never_mapped\":true") != std::string::npos);
}

TEST_CASE("A skipped release changes nothing, whatever other threads do meanwhile") {
  // Thread 1's release of a value that is not live is skipped without touching the model, so
  // thread 2's retain and release of the same allocation's value are counted exactly.
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  REQUIRE_FALSE(t.map(V, G, H));
  CHECK_FALSE(t.release(H).finding);
  VmmTicket stale = t.m.begin_release(H, t.clk.next("cuMemRelease"), t.ts, t.opts);
  REQUIRE(stale.skip());
  CHECK_FALSE(stale.noted);
  t.tid = 2;
  ThreadVmmState other;
  std::swap(other, t.ts);
  t.retain(H, V);
  CHECK(t.m.handle(H)->refs == 1);
  CHECK_FALSE(t.release(H).finding);
  CHECK(t.m.handle(H)->refs == 0);
  CHECK(t.m.counts().phys == 1);  // the mapping keeps the allocation (D13)
}

TEST_CASE("Every release after a no-op unmap of several sleeping ranges is paired with it") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, W = 0x7f1000000000;
  // Ten ranges: more than any fixed per-thread record would keep.
  constexpr int kRanges = 10;
  auto handle = [](int i) { return 0x55d0c0a0ull + 0x10ull * static_cast<unsigned>(i); };
  t.reserve(V, kRanges * G);
  for (int i = 0; i < kRanges; ++i) {
    t.create(handle(i));
    REQUIRE_FALSE(t.map(V + i * G, G, handle(i)));
  }
  // Thread 1 sleeps: one unmap of the whole tiled range, one release per handle.
  REQUIRE_FALSE(t.unmap(V, kRanges * G).finding);
  for (int i = 0; i < kRanges; ++i) REQUIRE_FALSE(t.release(handle(i)).finding);
  // Thread 2 gets every value again from the driver and maps it elsewhere.
  ThreadVmmState thread1 = t.ts;
  t.ts = ThreadVmmState{};
  t.tid = 2;
  t.reserve(W, kRanges * G);
  for (int i = 0; i < kRanges; ++i) {
    t.create(handle(i));
    REQUIRE_FALSE(t.map(W + i * G, G, handle(i)));
  }
  // Thread 1 frees while asleep: a no-op unmap, then every release is stale.
  t.ts = thread1;
  t.tid = 1;
  CHECK(cls(t.unmap(V, kRanges * G)) == FindingClass::UnmapUnmapped);
  for (int i = 0; i < kRanges; ++i) {
    auto r = t.release(handle(i));
    CHECK(cls(r) == FindingClass::StaleRelease);
    CHECK(r.skipped);
  }
  // Thread 2's memory is whole: every handle live and mapped.
  for (int i = 0; i < kRanges; ++i) {
    auto h = t.m.handle(handle(i));
    REQUIRE(h.has_value());
    CHECK(h->refs == 1);
    CHECK(t.m.mapped_at(W + i * G).has_value());
  }
  CHECK(t.vmm_bytes() == static_cast<std::int64_t>(kRanges * G));
}

// --- The driver's view (architecture.md: a skip is proven with it) ------------------------------

TEST_CASE("A double release is skipped on the model's proof: the driver's view of a handle proves nothing") {
  // cuMemGetAllocationPropertiesFromHandle answers a released value with SUCCESS (real-driver.md
  // D23, measured): a driver that says "live" must not turn the skip into a forward.
  Vmm t;
  t.create(0x100);
  REQUIRE_FALSE(t.release(0x100).finding);
  t.at_driver = DriverView::Live::Yes;
  auto r = t.release(0x100);
  CHECK(cls(r) == FindingClass::DoubleRelease);
  CHECK(r.skipped);
  CHECK(r.status == 0);
  CHECK(t.proves == 0);  // never asked
  t.at_driver = DriverView::Live::Unknown;
  auto n = t.release(0x100);
  CHECK(n.skipped);
  CHECK(cls(n) == FindingClass::DoubleRelease);
  CHECK(t.proves == 0);
}

TEST_CASE("The common release path never asks the driver") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  t.create(0x100);
  REQUIRE_FALSE(t.map(V, G, 0x100));
  REQUIRE_FALSE(t.unmap(V, G).finding);
  REQUIRE_FALSE(t.release(0x100).finding);
  REQUIRE_FALSE(t.address_free(V, G).finding);
  CHECK(t.proves == 0);
}

TEST_CASE("Report mode: a double release the driver accepts was an unseen re-issue") {
  Vmm t;
  t.opts.mode = Mode::Report;
  t.create(0x100);
  REQUIRE_FALSE(t.release(0x100).finding);
  auto r = t.release(0x100, /*driver_ok=*/true);
  CHECK(cls(r) == FindingClass::UnseenReissue);
  CHECK(r.reported);
  auto d = t.release(0x100, /*driver_ok=*/false);
  CHECK(cls(d) == FindingClass::DoubleRelease);
  CHECK(d.reported);
  CHECK(t.proves == 0);  // forwarded anyway: the driver's answer is its view
}

// --- Bounded state -----------------------------------------------------------------------------

TEST_CASE("Released values are remembered by age, a bounded number of them") {
  Vmm t;
  const std::size_t n = VmmModel::kReleasedKept + 100;
  auto value = [](std::size_t i) { return 0x55d0c0a00000ull + 0x100ull * i; };
  for (std::size_t i = 0; i < n; ++i) {
    t.create(value(i));
    REQUIRE_FALSE(t.release(value(i)).finding);
  }
  CHECK(t.m.counts().released_kept == VmmModel::kReleasedKept);
  // The oldest are forgotten (a release of one is the driver's to answer), the newest known.
  auto old = t.release(value(0), /*driver_ok=*/false);
  CHECK(cls(old) == FindingClass::ReleaseUnknown);
  CHECK_FALSE(old.skipped);
  auto recent = t.release(value(n - 1));
  CHECK(cls(recent) == FindingClass::DoubleRelease);
  CHECK(recent.skipped);
}

TEST_CASE("A free while asleep is a double release even after the value's record aged out") {
  // tests/stress/vmm_race: a sleeper thread descheduled between its sleep (unmap, release) and its
  // free while asleep (unmap again, release again) while the other threads made kReleasedKept
  // releases. The value's record was forgotten; the sleeping range still names it. Forwarded, the
  // release failed (the driver no longer knew the value) or freed the value's next owner.
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  REQUIRE_FALSE(t.map(V, G, H));
  REQUIRE_FALSE(t.unmap(V, G).finding);
  REQUIRE_FALSE(t.release(H).finding);
  auto value = [](std::size_t i) { return 0x66d0c0a00000ull + 0x100ull * i; };
  for (std::size_t i = 0; i < VmmModel::kReleasedKept; ++i) {
    t.create(value(i));
    REQUIRE_FALSE(t.release(value(i)).finding);
  }
  REQUIRE_FALSE(t.m.handle(H).has_value());  // forgotten
  auto u = t.unmap(V, G);
  CHECK(cls(u) == FindingClass::UnmapUnmapped);
  CHECK(u.skipped);
  auto r = t.release(H, /*driver_ok=*/false);
  CHECK(cls(r) == FindingClass::DoubleRelease);
  CHECK(r.skipped);
  REQUIRE(r.finding->related.size() >= 1);
  CHECK(r.finding->related[0].what == "sleep-time unmap");
  CHECK(r.finding->related[0].ev.seq == 4);
  SECTION("unpaired, the same release is the driver's to answer") {
    Vmm f;
    f.reserve(V, G);
    f.create(H);
    REQUIRE_FALSE(f.map(V, G, H));
    REQUIRE_FALSE(f.unmap(V, G).finding);
    REQUIRE_FALSE(f.release(H).finding);
    for (std::size_t i = 0; i < VmmModel::kReleasedKept; ++i) {
      f.create(value(i));
      REQUIRE_FALSE(f.release(value(i)).finding);
    }
    auto unpaired = f.release(H, false);
    CHECK(cls(unpaired) == FindingClass::ReleaseUnknown);
    CHECK_FALSE(unpaired.skipped);
  }
}

TEST_CASE("Freed reservations are remembered by age, not by address") {
  Vmm t;
  const std::size_t n = VmmModel::kFreedResKept + 10;
  // Freed from the highest address down: the most recent free has the lowest address.
  auto base = [&](std::size_t i) { return 0x7f0000000000ull + (n - i) * 4 * G; };
  for (std::size_t i = 0; i < n; ++i) {
    t.reserve(base(i), G);
    REQUIRE_FALSE(t.address_free(base(i), G).finding);
  }
  CHECK(t.m.counts().freed_res_kept == VmmModel::kFreedResKept);
  CHECK(cls(t.address_free(base(n - 1), G, false)) == FindingClass::DoubleAddressFree);
  CHECK_FALSE(t.address_free(base(0), G, false).finding);  // the oldest: forgotten
}

// --- Refused calls undo exactly what they did -------------------------------------------------

TEST_CASE("A refused unmap racing an address free leaves no allocation behind without mappings") {
  // The handle was released while mapped (D13), so the unmap drops the allocation; the address
  // free noted meanwhile is refused (the range is still mapped). Either order of the two ends.
  for (bool unmap_ends_first : {true, false}) {
    Vmm t;
    const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
    t.reserve(V, G);
    t.create(H);
    REQUIRE_FALSE(t.map(V, G, H));
    REQUIRE_FALSE(t.release(H).finding);
    VmmTicket u = t.m.begin_unmap(V, G, t.clk.next("cuMemUnmap"), t.ts, t.opts);
    REQUIRE(u.noted);
    ThreadVmmState other;
    VmmTicket f = t.m.begin_address_free(V, G, t.clk.next("cuMemAddressFree", 2), other, t.opts);
    REQUIRE(f.noted);
    if (unmap_ends_first) {
      t.m.end(u, false);
      t.m.end(f, false);
    } else {
      t.m.end(f, false);
      t.m.end(u, false);
    }
    INFO("the unmap's end first: " << unmap_ends_first);
    auto c = t.m.counts();
    CHECK(c.reservations == 1);
    CHECK(c.mappings == 1);
    CHECK(c.phys == 1);
    REQUIRE(t.m.mapped_at(V).has_value());
    // The legitimate teardown: the mapping is judged mapped, and everything goes.
    auto un = t.unmap(V, G);
    CHECK_FALSE(un.finding);
    CHECK_FALSE(un.skipped);
    CHECK_FALSE(t.address_free(V, G).finding);
    c = t.m.counts();
    CHECK(c.phys == 0);
    CHECK(c.reservations == 0);
    CHECK(t.vmm_bytes() == 0);
  }
}

TEST_CASE("A refused address free keeps a map made meanwhile") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  VmmTicket f = t.m.begin_address_free(V, G, t.clk.next("cuMemAddressFree"), t.ts, t.opts);
  REQUIRE(f.noted);
  t.tid = 2;
  ThreadVmmState other;
  std::swap(other, t.ts);
  REQUIRE_FALSE(t.map(V, G, H));  // the driver maps: the free has not reached it yet
  t.m.end(f, false);              // and then refuses the free (still mapped, D11)
  CHECK(t.m.counts().reservations == 1);
  REQUIRE(t.m.mapped_at(V).has_value());
  auto un = t.unmap(V, G);  // the legitimate unmap reaches the driver
  CHECK_FALSE(un.finding);
  CHECK_FALSE(un.skipped);
  CHECK(t.m.counts().mappings == 0);
}

TEST_CASE("An accepted address free takes a map made meanwhile with it (the driver refused it)") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000, H = 0x55d0c0a0;
  t.reserve(V, G);
  t.create(H);
  VmmTicket f = t.m.begin_address_free(V, G, t.clk.next("cuMemAddressFree"), t.ts, t.opts);
  REQUIRE(f.noted);
  ThreadVmmState other;
  VmmTicket m = t.m.begin_map(V, G, 0, H, t.clk.next("cuMemMap", 2), other, t.opts);
  REQUIRE(m.noted);
  t.m.end(f, true);   // the driver freed the range first
  t.m.end(m, false);  // so it refused the map
  auto c = t.m.counts();
  CHECK(c.reservations == 0);
  CHECK(c.mappings == 0);
  CHECK(c.phys == 1);  // the handle is live
  CHECK_FALSE(t.release(H).finding);
  CHECK(t.m.counts().phys == 0);
}

// --- The no-op unmap path ------------------------------------------------------------------------

namespace {
std::atomic<long> g_news{0};
}  // namespace

// Counting replacements of the global operators. Once this delete is inlined into a vector's
// deallocation, GCC 12 pairs its free() with the allocator's operator new and calls that a
// mismatch (-Wmismatched-new-delete); the replacements themselves are a matched malloc/free pair.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void *operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void *p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
// The nothrow form too (Catch2 allocates its test invokers with it): a sanitizer's own nothrow
// new paired with the free above is an alloc-dealloc mismatch to AddressSanitizer.
void *operator new(std::size_t n, const std::nothrow_t &) noexcept {
  g_news.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n ? n : 1);
}
void operator delete(void *p, const std::nothrow_t &) noexcept { std::free(p); }
#pragma GCC diagnostic pop

TEST_CASE("A no-op unmap costs the same over one sleeping range as over thousands") {
  // An expandable segment keeps thousands of granules in one reservation; a free while asleep of
  // all of it is one no-op unmap. Its allocations (its finding's text, after the model's lock) do
  // not grow with the ranges it covers, and the releases after it are still paired past eight.
  auto allocations = [](std::size_t ranges) {
    Vmm t;
    const std::uint64_t V = 0x7f0000000000;
    auto value = [](std::size_t i) { return 0x55d0c0a00000ull + 0x100ull * i; };
    t.reserve(V, ranges * G);
    for (std::size_t i = 0; i < ranges; ++i) {
      t.create(value(i));
      REQUIRE_FALSE(t.map(V + i * G, G, value(i)));
      REQUIRE_FALSE(t.unmap(V + i * G, G).finding);
      REQUIRE_FALSE(t.release(value(i)).finding);
    }
    VmmTicket u;
    const long before = g_news.load();
    u = t.m.begin_unmap(V, ranges * G, t.clk.next("cuMemUnmap"), t.ts, t.opts);
    const long n = g_news.load() - before;
    REQUIRE(u.skip());
    CHECK(u.finding->state_json.find(ranges > 8 ? "\"more_asleep\":true" : "\"last_handles\"") !=
          std::string::npos);
    // Another thread gets the last value again: this thread's release of it is stale (paired
    // with a range past the eighth).
    t.tid = 2;
    ThreadVmmState mine;
    std::swap(mine, t.ts);
    t.create(value(ranges - 1));
    std::swap(mine, t.ts);
    t.tid = 1;
    auto r = t.release(value(ranges - 1));
    CHECK(cls(r) == FindingClass::StaleRelease);
    CHECK(r.skipped);
    return n;
  };
  // Past the eight ranges it names, nothing more: nine ranges or 4,096 cost the same.
  const long nine = allocations(9), many = allocations(4096);
  INFO("allocations of a no-op unmap over 9 ranges: " << nine << ", over 4096: " << many);
  CHECK(many == nine);
  CHECK(allocations(1) < nine);
}

TEST_CASE("A ticket's inline lists keep what was pushed, past the inline slot, across copy and move") {
  InlineVec<Mapping, 1> v;
  CHECK(v.empty());
  for (std::uint64_t i = 1; i <= 3; ++i) {
    Mapping m;
    m.off = i * 0x1000;
    m.size = i;
    m.mapped.seq = 10 + i;
    v.push_back(m);
  }
  REQUIRE(v.size() == 3);
  const auto same = [](const InlineVec<Mapping, 1> &w) {
    REQUIRE(w.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
      CHECK(w[i].off == (i + 1) * 0x1000);
      CHECK(w[i].size == i + 1);
      CHECK(w[i].mapped.seq == 11 + i);
    }
  };
  same(v);
  InlineVec<Mapping, 1> copy(v);
  same(copy);
  InlineVec<Mapping, 1> moved(std::move(copy));
  same(moved);
  // A moved-from list is empty and takes new elements (its heap part went with the move).
  CHECK(copy.empty());  // NOLINT(bugprone-use-after-move)
  Mapping extra;
  extra.off = 0x9000;
  copy.push_back(extra);
  copy.push_back(extra);
  REQUIRE(copy.size() == 2);
  CHECK(copy[1].off == 0x9000);
  InlineVec<Mapping, 1> assigned;
  assigned = moved;
  same(assigned);
  InlineVec<Mapping, 1> move_assigned;
  move_assigned = std::move(moved);
  same(move_assigned);
  CHECK(moved.empty());  // NOLINT(bugprone-use-after-move)
  std::uint64_t bytes = 0;
  assigned.each([&](const Mapping &m) { bytes += m.size; });
  CHECK(bytes == 6);
  VmmTicket t;  // nothing pushed: nothing there
  CHECK(t.unmapped.empty());
  CHECK(t.woken.size() == 0);
  CHECK(t.dropped.empty());
}
