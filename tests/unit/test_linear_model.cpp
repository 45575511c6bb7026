// SPDX-License-Identifier: Apache-2.0
// The linear-memory model and the byte counters without preload: free classification, the bounded
// history of frees, and the finding text for a free the model did not accept.
#include <catch2/catch.hpp>

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

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

// A double free the driver view did not confirm (the address was live there), forwarded and
// accepted: the end() of an unseen re-issue.
void end_unseen(LinearModel &m, LinearTicket &t) {
  t.decision.unseen = true;
  m.end(t, true);
}

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
  m.end(v, false);
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
  CHECK(f.msg ==
        "cudaFree of 0x1000, which was already freed at seq 5 (cudaFree, thread 7); it "
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
  m.end(v, false);
  m.end(v, false);
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
  const EventRef now = dbl.this_free;
  end_unseen(m, dbl);
  auto again = m.begin_free(0x4000, dev, clk.next("cudaFree"));
  CHECK(again.cls == FreeClass::DoubleFree);
  CHECK(again.first_free.seq == now.seq);
  // A stale ticket (its first free is no longer the remembered one) changes nothing.
  end_unseen(m, dbl);
  CHECK(m.begin_free(0x4000, dev, clk.next("cudaFree")).first_free.seq == now.seq);
  CHECK(m.live_count() == 0);
}

namespace {

// Addresses of one shard, 512 bytes apart as the driver's are (D18): they share one table.
std::vector<std::uint64_t> one_shard(std::uint64_t from, std::size_t n) {
  std::vector<std::uint64_t> v;
  const std::size_t shard = LinearModel::shard_of(from);
  for (std::uint64_t a = from; v.size() < n; a += 0x200)
    if (LinearModel::shard_of(a) == shard) v.push_back(a);
  return v;
}

}  // namespace

TEST_CASE("Linear model: records the history forgets leave the table whole") {
  // Twice the history's frees in one shard, with live allocations between them: the oldest
  // frees' records are taken out of the table (each removal moves later entries of its probe run
  // back), and every address is still found as what it is.
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::size_t n = 2 * LinearModel::kFreedPerShard;
  const auto addrs = one_shard(0x7f2000000000, n + n / 4);
  std::vector<std::uint64_t> live, freed;
  std::vector<std::uint64_t> free_seq;
  for (std::size_t i = 0; i < addrs.size(); ++i) {
    m.on_alloc(LinearRec{addrs[i], 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
    if (i % 5 == 4) {
      live.push_back(addrs[i]);
      continue;
    }
    auto v = m.begin_free(addrs[i], dev, clk.next("cudaFree"));
    REQUIRE(v.cls == FreeClass::Live);
    freed.push_back(addrs[i]);
    free_seq.push_back(v.this_free.seq);
  }
  REQUIRE(freed.size() > LinearModel::kFreedPerShard);
  CHECK(m.live_count() == live.size());
  // The history holds the last kFreedPerShard frees: those are double frees naming their first
  // free, the older ones are forgotten (unknown), the live ones are live.
  const std::size_t forgotten = freed.size() - LinearModel::kFreedPerShard;
  for (std::size_t i = 0; i < freed.size(); ++i) {
    auto v = m.begin_free(freed[i], dev, clk.next("cudaFree"));
    if (i < forgotten) {
      CHECK(v.cls == FreeClass::Unknown);
    } else {
      REQUIRE(v.cls == FreeClass::DoubleFree);
      CHECK(v.first_free.seq == free_seq[i]);
    }
  }
  for (auto a : live) {
    auto v = m.begin_free(a, dev, clk.next("cudaFree"));
    CHECK(v.cls == FreeClass::Live);
    m.end(v, false);
  }
  CHECK(m.live_count() == live.size());
  std::size_t visited = 0;
  m.for_each_live([&](const LinearRec &) { ++visited; });
  CHECK(visited == live.size());
}

TEST_CASE("Linear model: a verdict of an earlier life of the address changes nothing") {
  // Each change of a record gives it a new generation: an end() of a refused free or of an
  // unseen re-issue carrying the
  // generation of an allocation since freed and issued again (another thread's) is refused.
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::uint64_t P = 0x7f3000000000;
  m.on_alloc(LinearRec{P, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto first = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(first.cls == FreeClass::Live);
  auto dbl = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(dbl.cls == FreeClass::DoubleFree);
  m.on_alloc(LinearRec{P, 1024, 0, MemKind::Linear, clk.next("cudaMalloc")});  // re-issued
  auto second = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(second.cls == FreeClass::Live);
  CHECK(second.gen != first.gen);
  m.end(first, false);  // the earlier life: nothing
  CHECK(m.live_count() == 0);
  end_unseen(m, dbl);  // nothing either: the remembered free is second's
  auto now = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(now.cls == FreeClass::DoubleFree);
  CHECK(now.first_free.seq == second.this_free.seq);
  CHECK(now.rec.size == 1024);
  m.end(second, false);  // this life's refused free: live again, with its own size
  CHECK(m.live_count() == 1);
  auto again = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(again.cls == FreeClass::Live);
  CHECK(again.rec.size == 1024);
}

TEST_CASE("Linear model: containing look-ups follow every change of the live set") {
  // The slow path's ordered ranges are rebuilt when the shard changed since they were built: an
  // allocation made after a look-up contains the next interior pointer, and one freed since does
  // not.
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const auto a = one_shard(0x7f4000000000, 2);
  CHECK(m.begin_free(a[0] + 0x40, dev, clk.next("cudaFree")).cls == FreeClass::Unknown);
  m.on_alloc(LinearRec{a[1], 0x1000, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.find_containing(a[0] + 0x40) == std::nullopt);
  m.on_alloc(LinearRec{a[0], 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto in = m.begin_free(a[0] + 0x40, dev, clk.next("cudaFree"));
  REQUIRE(in.cls == FreeClass::Interior);
  CHECK(in.rec.ptr == a[0]);
  REQUIRE(m.find_containing(a[1] + 0xfff).has_value());
  CHECK(m.find_containing(a[1] + 0xfff)->ptr == a[1]);
  CHECK(m.find_containing(a[1] + 0x1000) == std::nullopt);  // one past its end
  REQUIRE(m.begin_free(a[0], dev, clk.next("cudaFree")).cls == FreeClass::Live);
  CHECK(m.begin_free(a[0] + 0x40, dev, clk.next("cudaFree")).cls == FreeClass::Unknown);
  // A refused free puts it back: contained again.
  m.on_alloc(LinearRec{a[0], 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto v = m.begin_free(a[0], dev, clk.next("cudaFree"));
  m.end(v, false);
  CHECK(m.begin_free(a[0] + 0x40, dev, clk.next("cudaFree")).cls == FreeClass::Interior);
}

TEST_CASE("Linear model: threads allocating and freeing re-issued addresses keep it exact") {
  // Four threads, each cycling through its own addresses (the driver's last-freed reuse, D18) in
  // shards the others share, with refused frees rolled back: at the end exactly the allocations
  // each thread left live are live.
  LinearModel m;
  const KindMask dev = kind_bit(MemKind::Linear);
  constexpr int kThreads = 4, kRounds = 20000;
  std::vector<std::thread> ts;
  std::atomic<int> wrong{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::uint64_t seq = 0;
      for (int i = 0; i < kRounds; ++i) {
        const std::uint64_t p =
            0x7f5000000000 + (static_cast<std::uint64_t>(i % 37) * kThreads + t) * 0x200;
        EventRef e{++seq, seq, static_cast<std::uint32_t>(t + 1), 0, "cudaMalloc"};
        m.on_alloc(LinearRec{p, 0x200, 0, MemKind::Linear, e});
        auto v = m.begin_free(p, dev, e);
        if (v.cls != FreeClass::Live || v.rec.ptr != p) ++wrong;
        if (i % 3 == 0) m.end(v, false);  // refused: stays live until the next round frees it
        if (i % 3 == 0 && m.begin_free(p, dev, e).cls != FreeClass::Live) ++wrong;
      }
      // The last round's address stays live.
      const std::uint64_t p = 0x7f5000000000 + (37ull * kThreads + t) * 0x200;
      m.on_alloc(LinearRec{p, 0x200, 0, MemKind::Linear, EventRef{1, 1, 1, 0, "cudaMalloc"}});
    });
  for (auto &t : ts) t.join();
  CHECK(wrong.load() == 0);
  CHECK(m.live_count() == kThreads);
}

TEST_CASE("Linear model: a free of a held address is a proven double free, answered by the model") {
  // The shim holds the first free (quarantine, deferred flush): the record is Held, and a second
  // free of the address is a double free the model proves itself, with no look into the shim's
  // queue and no confirmation from the driver (which still has the memory).
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::uint64_t P = 0x7f4000000000;
  m.on_alloc(LinearRec{P, 4096, 0, MemKind::Linear, clk.next("cudaMalloc")});  // seq 1
  auto first = m.begin_free(P, dev, clk.next("cudaFree"));                     // seq 2
  REQUIRE(first.cls == FreeClass::Live);
  CHECK_FALSE(first.finding);
  const std::uint32_t g = m.mark_held(first);
  CHECK(g != 0);
  CHECK(g != first.gen);
  CHECK(m.mark_held(first) == 0);  // a second hold of the same free changes nothing
  auto dbl = m.begin_free(P, dev, clk.next("cudaFree", 2));  // seq 3
  CHECK(dbl.cls == FreeClass::DoubleFree);
  CHECK(dbl.held);
  CHECK(dbl.first_free.seq == 2);
  CHECK(dbl.rec.size == 4096);
  CHECK(dbl.rec.alloc.seq == 1);
  REQUIRE(dbl.finding);
  CHECK(dbl.finding->cls == FindingClass::DoubleFree);
  CHECK(dbl.finding->msg ==
        "cudaFree of 0x7f4000000000, which was already freed at seq 2 (cudaFree, thread 1); it "
        "was allocated at seq 1 (cudaMalloc, thread 1) (4096 bytes, linear)");
  CHECK(dbl.decision.skip);
  CHECK_FALSE(dbl.decision.confirm);  // proven: the shim holds the first free
  CHECK(m.live_count() == 0);
  // A held free is kept out of the bounded history's reach: after a shard's worth of later frees
  // it is still the first free.
  const std::size_t shard = LinearModel::shard_of(P);
  std::size_t n = 0;
  for (std::uint64_t a = 0x100000000; n < LinearModel::kFreedPerShard + 10; a += 0x200) {
    if (LinearModel::shard_of(a) != shard || a == P) continue;
    m.on_alloc(LinearRec{a, 0x100, 0, MemKind::Linear, clk.next("cudaMalloc")});
    REQUIRE(m.begin_free(a, dev, clk.next("cudaFree")).cls == FreeClass::Live);
    ++n;
  }
  auto late = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(late.cls == FreeClass::DoubleFree);
  CHECK(late.held);
  CHECK(late.first_free.seq == 2);
  // The held free goes to the driver: the record is Freed, its free still the one remembered.
  CHECK(m.given_back(P, g) != 0);
  auto after = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(after.cls == FreeClass::DoubleFree);
  CHECK_FALSE(after.held);
  CHECK(after.first_free.seq == 2);
  CHECK(after.decision.confirm);  // the driver may have issued it again unseen: asked first
}

TEST_CASE("Linear model: a held record given back becomes Freed, and issued again, Live") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::uint64_t P = 0x7f4100000000;
  m.on_alloc(LinearRec{P, 512, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto t = m.begin_free(P, dev, clk.next("cudaFree"));
  const std::uint32_t g = m.mark_held(t);
  REQUIRE(g != 0);
  const std::uint32_t freed = m.given_back(P, g);
  CHECK(freed != 0);
  CHECK(m.given_back(P, g) == 0);  // given back once
  auto dbl = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(dbl.cls == FreeClass::DoubleFree);
  CHECK_FALSE(dbl.held);
  CHECK(dbl.gen == freed);
  m.on_alloc(LinearRec{P, 1024, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.live_count() == 1);
  // The driver issued the address again between its real free and the give-back: the late
  // give-back of the earlier life changes nothing.
  auto t2 = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(t2.cls == FreeClass::Live);
  const std::uint32_t g2 = m.mark_held(t2);
  m.on_alloc(LinearRec{P, 2048, 0, MemKind::Linear, clk.next("cudaMalloc")});
  CHECK(m.given_back(P, g2) == 0);
  CHECK(m.live_count() == 1);
  auto t3 = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(t3.cls == FreeClass::Live);
  CHECK(t3.rec.size == 2048);
}

TEST_CASE("Linear model: a refused free's end() with a stale generation changes nothing") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear);
  const std::uint64_t P = 0x7f4200000000;
  m.on_alloc(LinearRec{P, 256, 0, MemKind::Linear, clk.next("cudaMalloc")});
  auto t = m.begin_free(P, dev, clk.next("cudaFree"));
  REQUIRE(t.cls == FreeClass::Live);
  const std::uint32_t g = m.mark_held(t);
  REQUIRE(g != 0);
  m.end(t, false);  // the record is Held now, not the Freed one this ticket made
  auto dbl = m.begin_free(P, dev, clk.next("cudaFree"));
  CHECK(dbl.cls == FreeClass::DoubleFree);
  CHECK(dbl.held);
  CHECK(m.live_count() == 0);
  // Not held after all (exit began): the ticket goes on with the Freed generation, and a refusal
  // by the driver then puts the allocation back.
  t.gen = m.given_back(P, g);
  REQUIRE(t.gen != 0);
  m.end(t, false);
  CHECK(m.live_count() == 1);
  m.end(t, false);  // once
  CHECK(m.live_count() == 1);
  CHECK(m.begin_free(P, dev, clk.next("cudaFree")).cls == FreeClass::Live);
}

TEST_CASE("Linear model: a free of a kind the caller holds goes straight to Held") {
  LinearModel m;
  Clock clk;
  const KindMask dev = kind_bit(MemKind::Linear) | kind_bit(MemKind::Async);
  const Options o;
  const VmmModel *none = nullptr;
  m.on_alloc(LinearRec{0x7f4300000000, 256, 0, MemKind::Linear, clk.next("cudaMalloc")});
  m.on_alloc(LinearRec{0x7f4400000000, 256, 0, MemKind::Async, clk.next("cudaMallocAsync")});
  auto t =
      m.begin_free(0x7f4300000000, dev, clk.next("cudaFree"), o, none, kind_bit(MemKind::Linear));
  REQUIRE(t.cls == FreeClass::Live);
  CHECK(t.holding);
  CHECK(m.mark_held(t) == 0);  // held already
  auto dbl = m.begin_free(0x7f4300000000, dev, clk.next("cudaFree"), o, none);
  CHECK(dbl.cls == FreeClass::DoubleFree);
  CHECK(dbl.held);
  CHECK(dbl.first_free.seq == 3);
  auto a =
      m.begin_free(0x7f4400000000, dev, clk.next("cudaFree"), o, none, kind_bit(MemKind::Linear));
  REQUIRE(a.cls == FreeClass::Live);
  CHECK_FALSE(a.holding);  // not a kind held: Freed, as a forwarded free
  CHECK_FALSE(m.begin_free(0x7f4400000000, dev, clk.next("cudaFree"), o, none).held);
  // Not held after all: given back before forwarding, the ticket's refusal puts it back.
  t.gen = m.given_back(0x7f4300000000, t.gen);
  REQUIRE(t.gen != 0);
  m.end(t, false);
  CHECK(m.live_count() == 1);
}
