// SPDX-License-Identifier: Apache-2.0
// The state model without preload: the VMM lifecycle cases of bug-patterns.md (P01-P10) at the
// model level, and the linear model's free classification.
#include <catch2/catch.hpp>

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

struct Vmm {
  ByteCounters counters;
  VmmModel m{counters};
  Clock clk;
  ThreadVmmState ts;

  void create(std::uint64_t h, std::uint64_t size = G, Location loc = Location::Device) {
    m.on_create(h, size, loc, 0, 1, false, clk.next("cuMemCreate"));
    VmmModel::break_pairing(ts);
  }
  void reserve(std::uint64_t v, std::uint64_t size) {
    m.on_reserve(v, size, clk.next("cuMemAddressReserve"));
  }
  std::optional<Finding> map(std::uint64_t v, std::uint64_t size, std::uint64_t h,
                             bool driver_ok = true) {
    auto verdict = m.check_map(v, size, 0, h, ts);
    EventRef e = clk.next("cuMemMap");
    if (driver_ok && !verdict.finding) m.on_map_ok(v, size, 0, h, e);
    return verdict.finding;
  }
  // Returns the verdict; the driver's result decides commit or rollback. Skippable ones are
  // skipped (rolled back, as the shim does) unless `forward` (report mode).
  VmmVerdict unmap(std::uint64_t v, std::uint64_t size, bool driver_ok = true, bool forward = false) {
    VmmVerdict verdict = m.begin_unmap(v, size, clk.next("cuMemUnmap"), ts);
    if (verdict.finding && verdict.skippable && !forward) {
      m.rollback_unmap(verdict);
      return verdict;
    }
    if (driver_ok)
      m.commit_unmap(verdict);
    else
      m.rollback_unmap(verdict);
    return verdict;
  }
  VmmVerdict release(std::uint64_t h, bool driver_ok = true, bool forward = false) {
    VmmVerdict verdict = m.begin_release(h, clk.next("cuMemRelease"), ts);
    if (verdict.finding && verdict.skippable && !forward) {
      m.rollback_release(verdict);
      return verdict;
    }
    if (driver_ok)
      m.commit_release(verdict);
    else
      m.rollback_release(verdict);
    return verdict;
  }
  VmmVerdict address_free(std::uint64_t v, std::uint64_t size) {
    return m.begin_address_free(v, size, clk.next("cuMemAddressFree"), ts);
  }
  std::int64_t vmm_bytes() const {
    for (const auto &r : counters.snapshot())
      if (r.kind == MemKind::Vmm && r.dev == 0) return r.current;
    return 0;
  }
};

FindingClass cls(const VmmVerdict &v) {
  REQUIRE(v.finding.has_value());
  return v.finding->cls;
}

}  // namespace

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
  CHECK(u.skippable);
  CHECK(u.finding->msg.find("asleep") != std::string::npos);
  REQUIRE(u.finding->related.size() >= 1);
  CHECK(u.finding->related[0].ev.seq == 4);  // the sleep-time unmap
  auto r = t.release(H);
  CHECK(cls(r) == FindingClass::DoubleRelease);
  CHECK(r.skippable);
  CHECK(r.finding->related[0].what == "first release");
  CHECK(r.finding->related[0].ev.seq == 5);
  auto a = t.address_free(V, G);
  CHECK_FALSE(a.finding);
  CHECK(a.changed);
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
  CHECK(r.skippable);
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
  CHECK_FALSE(u.skippable);
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
  CHECK(r.skippable);
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
  auto r = t.release(H, /*driver_ok=*/true, /*forward=*/true);
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
  auto refused = t.release(H, /*driver_ok=*/false, /*forward=*/true);
  CHECK(cls(refused) == FindingClass::StaleRelease);
  CHECK(t.m.handle(H)->refs == 1);
}

TEST_CASE("P09: address free while a granule is still mapped") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, 2 * G);
  t.create(0x100);
  t.map(V, G, 0x100);
  auto a = t.address_free(V, 2 * G);
  CHECK(cls(a) == FindingClass::FreeMappedVa);
  CHECK_FALSE(a.changed);
  CHECK(t.m.counts().reservations == 1);
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
    t.m.on_retain(H, V, t.clk.next("cuMemRetainAllocationHandle"));  // value reused by the driver
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
  t.m.on_retain(H, V, t.clk.next("cuMemRetainAllocationHandle"));
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
  CHECK_FALSE(t.release(0x1234).skippable);
}

TEST_CASE("Double address free and rollback of a refused address free") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  auto a = t.address_free(V, G);
  REQUIRE(a.changed);
  t.m.rollback_address_free(a);
  CHECK(t.m.counts().reservations == 1);
  a = t.address_free(V, G);
  REQUIRE(a.changed);
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

TEST_CASE("Linear model: free classification") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear) | kind_bit(MemKind::Async);
  m.on_alloc(LinearRec{0x1000, 4096, 0, MemKind::Linear, clk.next("cudaMalloc")});
  m.on_alloc(LinearRec{0x9000, 64, -1, MemKind::Host, clk.next("cudaMallocHost")});

  CHECK(m.begin_free(0, dev, clk.next("cudaFree")).cls == FreeClass::Null);
  auto in = m.begin_free(0x1010, dev, clk.next("cudaFree"));
  CHECK(in.cls == FreeClass::Interior);
  CHECK(in.rec.ptr == 0x1000);
  CHECK(m.begin_free(0x9000, dev, clk.next("cudaFree")).cls == FreeClass::WrongKind);
  CHECK(m.begin_free(0x5000, dev, clk.next("cudaFree")).cls == FreeClass::Unknown);

  auto ok = m.begin_free(0x1000, dev, clk.next("cudaFree"));
  REQUIRE(ok.cls == FreeClass::Live);
  auto again = m.begin_free(0x1000, dev, clk.next("cudaFree"));
  CHECK(again.cls == FreeClass::DoubleFree);
  CHECK(again.first_free.seq == ok.rec.alloc.seq + 6);
  CHECK(again.rec.alloc.seq == 1);

  // The address is issued again: the old free says nothing any more.
  m.on_alloc(LinearRec{0x1000, 4096, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.begin_free(0x1000, dev, clk.next("cudaFree")).cls == FreeClass::Live);

  // A refused free is rolled back.
  m.on_alloc(LinearRec{0x2000, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto v = m.begin_free(0x2000, dev, clk.next("cudaFree"));
  m.rollback(v);
  CHECK(m.begin_free(0x2000, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  CHECK(m.live_count() == 1);  // the host allocation
}

TEST_CASE("Linear model: a freed address inside a newer live allocation is not a double free") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  m.on_alloc(LinearRec{0x2000, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
  REQUIRE(m.begin_free(0x2000, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  m.on_alloc(LinearRec{0x1000, 0x4000, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.begin_free(0x2000, dev, clk.next("cudaFree")).cls == FreeClass::Interior);
}

TEST_CASE("Byte counters: current, peak and total per device and kind") {
  ByteCounters c;
  c.add(0, MemKind::Linear, 100);
  c.add(0, MemKind::Linear, 50);
  c.add(0, MemKind::Linear, -100);
  c.add(-1, MemKind::Host, 7);
  auto rows = c.snapshot();
  REQUIRE(rows.size() == 2);
  auto lin = rows[1].kind == MemKind::Linear ? rows[1] : rows[0];
  CHECK(lin.dev == 0);
  CHECK(lin.current == 50);
  CHECK(lin.peak == 150);
  CHECK(lin.total == 150);
}

TEST_CASE("finding_for_free names the allocation and the first free") {
  FreeVerdict v;
  v.cls = FreeClass::DoubleFree;
  v.rec = LinearRec{0x1000, 4096, 0, MemKind::Linear, EventRef{3, 30, 7, 0, "cudaMalloc"}};
  v.first_free = EventRef{5, 50, 7, 0, "cudaFree"};
  Finding f = finding_for_free(v, "cudaFree", 0x1000);
  CHECK(f.cls == FindingClass::DoubleFree);
  CHECK(f.msg == "cudaFree of 0x1000, which was already freed at seq 5 (cudaFree, thread 7); it "
                 "was allocated at seq 3 (cudaMalloc, thread 7) (4096 bytes, linear)");
  REQUIRE(f.related.size() == 2);
  CHECK(f.related[1].ev.seq == 5);
}

TEST_CASE("Linear model: the bounded history forgets a free only through its own entry") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::uint64_t P = 0x7f0000100000;
  m.on_alloc(LinearRec{P, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
  REQUIRE(m.begin_free(P, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  m.on_alloc(LinearRec{P, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});  // re-issued
  REQUIRE(m.begin_free(P, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  // Enough frees in P's shard to push P's *first* free out of the ring, but not its second.
  const std::size_t shard = LinearModel::shard_of(P);
  std::size_t n = 0;
  for (std::uint64_t a = 0x100000000; n < LinearModel::kFreedPerShard - 10; a += 0x200) {
    if (LinearModel::shard_of(a) != shard) continue;
    m.on_alloc(LinearRec{a, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
    REQUIRE(m.begin_free(a, dev, clk.next("cudaFree")).cls == FreeClass::Live);
    ++n;
  }
  CHECK(m.begin_free(P, dev, clk.next("cudaFree")).cls == FreeClass::DoubleFree);
}

TEST_CASE("VMM model: odd sizes are left to the driver") {
  Vmm t;
  const std::uint64_t V = 0x7f0000000000;
  t.reserve(V, G);
  t.create(0x100);
  t.map(V, G, 0x100);
  CHECK_FALSE(t.m.check_map(V, 0, 0, 0x100, t.ts).finding);  // size 0: no claim
  auto u = t.m.begin_unmap(V, ~0ull - 5, t.clk.next("cuMemUnmap"), t.ts);  // would wrap
  CHECK_FALSE(u.finding);
  CHECK_FALSE(u.skippable);
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
