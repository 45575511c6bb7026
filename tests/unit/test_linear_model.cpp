// SPDX-License-Identifier: Apache-2.0
// The linear-memory model and the byte counters without preload: free classification, the bounded
// history of frees, and the finding text for a free the model did not accept.
#include <catch2/catch.hpp>

#include "tracker.h"

using namespace cmg;

namespace {

struct Clock {
  std::uint64_t seq = 0;
  EventRef next(const char *api, std::uint32_t tid = 1) {
    ++seq;
    return EventRef{seq, seq * 1000, tid, 0, api};
  }
};

}  // namespace

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


TEST_CASE("Linear model: freed records kept in place are stepped over, never taken for live") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  // A live allocation and, above it in the same shard, freed records inside its range (the driver
  // issued the big one after the small ones were freed: D18 reuse).
  const std::uint64_t A = 0x7f0000000000;
  const std::size_t shard = LinearModel::shard_of(A);
  std::vector<std::uint64_t> small;
  for (std::uint64_t a = A + 0x200; small.size() < 3; a += 0x200)
    if (LinearModel::shard_of(a) == shard) small.push_back(a);
  for (auto a : small) {
    m.on_alloc(LinearRec{a, 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
    REQUIRE(m.begin_free(a, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  }
  CHECK(m.live_count() == 0);
  m.on_alloc(LinearRec{A, small.back() + 0x1000 - A, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.live_count() == 1);
  // Past the last freed record: the live allocation below it is found.
  auto in = m.begin_free(small.back() + 0x10, dev, clk.next("cudaFree"));
  CHECK(in.cls == FreeClass::Interior);
  CHECK(in.rec.ptr == A);
  // A freed base inside it is an interior pointer of the live one, not a double free.
  CHECK(m.begin_free(small[1], dev, clk.next("cudaFree")).cls == FreeClass::Interior);
  std::size_t visited = 0;
  m.for_each_live([&](const LinearRec &r) {
    CHECK(r.ptr == A);
    ++visited;
  });
  CHECK(visited == 1);
  // Freed, the big one's own record turns freed: its second free is a double free, the small
  // ones' records are still the frees they remember.
  REQUIRE(m.begin_free(A, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  CHECK(m.begin_free(A, dev, clk.next("cudaFree")).cls == FreeClass::DoubleFree);
  auto again = m.begin_free(small[0], dev, clk.next("cudaFree"));
  CHECK(again.cls == FreeClass::DoubleFree);
  CHECK(again.first_free.seq == 2);
  CHECK(m.live_count() == 0);
  // A refused free turns the record live again, once.
  m.on_alloc(LinearRec{small[2], 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto v = m.begin_free(small[2], dev, clk.next("cudaFree"));
  m.rollback(v);
  m.rollback(v);
  CHECK(m.live_count() == 1);
}

TEST_CASE("Linear model: a free forwarded for an unseen re-issue becomes the remembered free") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  m.on_alloc(LinearRec{0x4000, 256, 0, MemKind::Linear, clk.next("cudaMalloc")});
  REQUIRE(m.begin_free(0x4000, dev, clk.next("cudaFree")).cls == FreeClass::Live);
  auto dbl = m.begin_free(0x4000, dev, clk.next("cudaFree"));
  REQUIRE(dbl.cls == FreeClass::DoubleFree);
  CHECK(dbl.first_free.seq == 2);
  const EventRef now = clk.next("cudaFree");
  m.refreed(dbl, now);
  auto again = m.begin_free(0x4000, dev, clk.next("cudaFree"));
  CHECK(again.cls == FreeClass::DoubleFree);
  CHECK(again.first_free.seq == now.seq);
  // A stale verdict (its first free is no longer the remembered one) changes nothing.
  m.refreed(dbl, clk.next("cudaFree"));
  CHECK(m.begin_free(0x4000, dev, clk.next("cudaFree")).first_free.seq == now.seq);
  CHECK(m.live_count() == 0);
}
