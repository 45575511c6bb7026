// SPDX-License-Identifier: Apache-2.0
// What is still resident, the pure parts: the snapshot table that adds rows up in fixed storage,
// the sleep and wake-up runs and where each ends (policy/boundaries.h), and the devices a rank uses
// (policy/device_use.h).
#include <catch2/catch.hpp>

#include <vector>

#include "boundaries.h"
#include "device_use.h"
#include "resident_table.h"

using namespace cmg;

namespace {

EventRef ev(std::uint64_t seq, std::uint32_t tid, const char *api = "cuMemUnmap") {
  EventRef e;
  e.seq = seq;
  e.tid = tid;
  e.api = api;
  e.stack = static_cast<std::uint32_t>(seq);
  return e;
}

ResidentKey key(std::uint32_t stack, Residence st = Residence::Live, int dev = 0) {
  return ResidentKey{dev, MemKind::Linear, st, stack, 0};
}

}  // namespace

TEST_CASE("The snapshot table adds objects up by key and refuses a new key when full") {
  ResidentTable t(2);
  REQUIRE(t.capacity() == 2);
  CHECK(t.add(key(1), 100));
  CHECK(t.add(key(1), 50));
  CHECK(t.add(key(2), 7));
  CHECK_FALSE(t.add(key(3), 9));             // full: nothing added
  CHECK(t.add(key(2, Residence::Live), 1));  // a known key still adds
  REQUIRE(t.size() == 2);
  std::vector<ResidentRow> rows;
  t.drain([&](const ResidentRow &r) { rows.push_back(r); });
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].key == key(1));
  CHECK(rows[0].count == 2);
  CHECK(rows[0].bytes == 150);
  CHECK(rows[1].key == key(2));
  CHECK(rows[1].count == 2);
  CHECK(rows[1].bytes == 8);
  CHECK(t.empty());
  CHECK(t.add(key(3), 9));  // drained: room again
  CHECK(t.rows().front().bytes == 9);
}

TEST_CASE("Keys that differ in device, state or graph are rows of their own") {
  ResidentTable t(8);
  CHECK(t.add(key(1, Residence::Live, 0), 1));
  CHECK(t.add(key(1, Residence::Live, 1), 1));
  CHECK(t.add(key(1, Residence::Asleep, 0), 1));
  ResidentKey g = key(1);
  g.graph = 3;
  CHECK(t.add(g, 1));
  CHECK(t.size() == 4);
}

TEST_CASE("A sleep goes on while its thread takes memory away and ends at its next other call") {
  Boundaries b;
  CHECK_FALSE(b.open());
  const std::uintptr_t site = 0x1234;
  auto e = b.on_sleep_unmap(ev(1, 7), 0x1000, 0x200000, 1, 0x200000, &site, 1);
  CHECK_FALSE(e.any());
  CHECK(b.open());
  CHECK_FALSE(b.on_call(7, CallRole::Takes).any());  // a release of the same allocator
  CHECK_FALSE(b.on_call(8, CallRole::Other).any());  // another thread's call
  b.on_sleep_unmap(ev(3, 7), 0x400000, 0x200000, 1, 0x200000, &site, 1);
  e = b.on_call(7, CallRole::Wakes);  // the wake-up's first cuMemCreate
  REQUIRE(e.sleep);
  CHECK_FALSE(e.wake);
  CHECK(e.sleep->first.seq == 1);
  CHECK(e.sleep->ranges == 2);
  CHECK(e.sleep->bytes == 0x400000);
  REQUIRE(e.sleep->sites.size() == 1);
  CHECK(e.sleep->sites[0] == site);
  CHECK(e.sleep->sites_known);
  CHECK(e.sleep->seen.size() == 2);
  CHECK_FALSE(b.open());
}

TEST_CASE("ends_run, read without the lock, is false exactly when on_call would end no run") {
  // Each state the runs can be in, made afresh: none, a sleep, a wake-up, a failed wake-up, and
  // after a wake-up's failure its rollback; thread 7 owns the runs, thread 8 is another thread.
  enum class St { None, Sleep, Wake, Failed, SleepOther };
  const auto make = [](Boundaries &b, St st) {
    if (st == St::Sleep) b.on_sleep_unmap(ev(1, 7), 0x1000, 0x2000, 1, 0x2000, nullptr, 0);
    if (st == St::SleepOther) b.on_sleep_unmap(ev(1, 8), 0x1000, 0x2000, 1, 0x2000, nullptr, 0);
    if (st == St::Wake || st == St::Failed)
      b.on_wake_map(ev(2, 7, "cuMemMap"), 0x1000, 0x2000, 0x77, 1, 0x2000, 0);
    if (st == St::Failed) b.on_refused(ev(3, 7, "cuMemMap"), 2);
  };
  int ends = 0;
  for (St st : {St::None, St::Sleep, St::Wake, St::Failed, St::SleepOther})
    for (CallRole role : {CallRole::Takes, CallRole::Wakes, CallRole::Other})
      for (std::uint32_t tid : {7u, 8u}) {
        Boundaries b;
        make(b, st);
        const bool fast = b.ends_run(tid, role);
        const bool ended = b.on_call(tid, role).any();
        INFO("state " << static_cast<int>(st) << " role " << static_cast<int>(role) << " tid "
                      << tid);
        CHECK(fast == ended);
        ends += ended;
      }
  // Thread 7's sleep ends at its Wakes and Other calls, its wake-up at Takes and Other, the failed
  // one only at Other; thread 8's sleep at thread 8's Wakes and Other.
  CHECK(ends == 7);
}

TEST_CASE("A failed wake-up's rollback goes on without the lock; its next other call ends it") {
  Boundaries b;
  b.on_wake_map(ev(2, 7, "cuMemMap"), 0x1000, 0x2000, 0x77, 1, 0x2000, 0);
  CHECK(b.ends_run(7, CallRole::Takes));  // an unmap ends a wake-up that has not failed
  b.on_refused(ev(3, 7, "cuMemSetAccess"), 2);
  CHECK_FALSE(b.ends_run(7, CallRole::Takes));  // the rollback's unmap is the wake-up's
  CHECK_FALSE(b.ends_run(8, CallRole::Other));  // another thread's call ends nothing
  CHECK(b.ends_run(7, CallRole::Other));
  const auto e = b.on_call(7, CallRole::Other);
  REQUIRE(e.wake);
  CHECK(e.wake->failed);
  CHECK(e.wake->failed_call.seq == 3);
  CHECK_FALSE(b.ends_run(7, CallRole::Other));
  CHECK_FALSE(b.open());
}

TEST_CASE("A wake-up's creates and maps are noted only on its own thread") {
  Boundaries b;
  b.on_wake_map(ev(2, 7, "cuMemMap"), 0x1000, 0x2000, 0x77, 1, 0x2000, 0);
  b.on_create(ev(3, 8, "cuMemCreate"), 0x88, 0x2000);  // another thread's
  b.on_create(ev(4, 7, "cuMemCreate"), 0x99, 0x2000);
  b.on_map(ev(5, 8, "cuMemMap"), 0x9000, 0x2000, 0x88, 0);
  b.on_refused(ev(6, 8, "cuMemMap"), 2);  // another thread's refusal fails nothing
  const auto e = b.end_all();
  REQUIRE(e.wake);
  CHECK_FALSE(e.wake->failed);
  REQUIRE(e.wake->made.size() == 2);
  CHECK(e.wake->made[1].handle == 0x99);
  CHECK(e.wake->made[1].ev.seq == 4);
}

TEST_CASE("Freeing a range the sleep unmapped is part of a free; freeing another ends the sleep") {
  Boundaries b;
  b.on_sleep_unmap(ev(1, 7), 0x1000, 0x2000, 1, 0x2000, nullptr, 0);
  CHECK_FALSE(b.on_address_free(7, 0x1000).any());
  CHECK(b.open());
  const auto e = b.on_address_free(7, 0x900000);
  REQUIRE(e.sleep);
  CHECK_FALSE(b.open());
}

TEST_CASE("A wake-up collects what it creates and maps; a refused call marks it failed") {
  Boundaries b;
  b.on_sleep_unmap(ev(1, 7), 0x1000, 0x200000, 1, 0x200000, nullptr, 0);
  b.on_call(7, CallRole::Wakes);  // cuMemCreate ends the sleep
  auto e = b.on_wake_map(ev(3, 7, "cuMemMap"), 0x1000, 0x200000, 0xA, 1, 0x200000, 0x55);
  CHECK_FALSE(e.sleep);  // already ended
  b.on_create(ev(4, 7, "cuMemCreate"), 0xB, 0x200000);
  b.on_map(ev(5, 7, "cuMemMap"), 0x201000, 0x200000, 0xB, 0x55);  // the create becomes the map
  b.on_create(ev(6, 7, "cuMemCreate"), 0xC, 0x200000);
  b.on_refused(ev(7, 7, "cuMemCreate"), 2);
  b.on_refused(ev(8, 7, "cuMemMap"), 1);             // the first refusal is the one named
  CHECK_FALSE(b.on_call(7, CallRole::Takes).any());  // the rollback belongs to it
  e = b.on_call(7, CallRole::Other);
  REQUIRE(e.wake);
  const WakeRun &w = *e.wake;
  CHECK(w.first.seq == 3);
  CHECK(w.woken == 1);
  CHECK(w.failed);
  CHECK(w.failed_call.seq == 7);
  CHECK(w.failed_res == 2);
  REQUIRE(w.made.size() == 3);
  CHECK(w.made[0].va == 0x1000);
  CHECK(w.made[1].va == 0x201000);
  CHECK(w.made[1].handle == 0xB);
  CHECK(w.made[2].va == 0);
  CHECK(w.made[2].handle == 0xC);
}

TEST_CASE("A failed wake-up's rollback unmaps are no sleep; another thread's unmap ends a sleep") {
  Boundaries b;
  b.on_sleep_unmap(ev(1, 7), 0x1000, 0x1000, 1, 0x1000, nullptr, 0);
  b.on_wake_map(ev(2, 7, "cuMemMap"), 0x1000, 0x1000, 0xA, 1, 0x1000, 0);
  b.on_refused(ev(3, 7, "cuMemSetAccess"), 1);
  CHECK_FALSE(b.on_sleep_unmap(ev(4, 7), 0x1000, 0x1000, 1, 0x1000, nullptr, 0).any());
  const auto all = b.end_all();
  REQUIRE(all.wake);
  CHECK_FALSE(all.sleep);

  b.on_sleep_unmap(ev(5, 7), 0x1000, 0x1000, 1, 0x1000, nullptr, 0);
  const auto e = b.on_sleep_unmap(ev(6, 8), 0x9000, 0x1000, 1, 0x1000, nullptr, 0);
  REQUIRE(e.sleep);
  CHECK(e.sleep->tid == 7);
  CHECK(b.open());  // thread 8's sleep is open now
}

TEST_CASE("A mapping without a stack makes the sleep's sites unknown") {
  Boundaries b;
  const std::uintptr_t sites[] = {0x10, 0};
  b.on_sleep_unmap(ev(1, 7), 0x1000, 0x1000, 2, 0x2000, sites, 2);
  const auto e = b.end_all();
  REQUIRE(e.sleep);
  CHECK_FALSE(e.sleep->sites_known);
  REQUIRE(e.sleep->sites.size() == 1);
  CHECK(e.sleep->sites[0] == 0x10);
}

TEST_CASE("A sleep keeps every range and site past the inline ones, up to its bounds") {
  // The first few ranges and sites are kept inline, the rest on the heap: all of them count.
  Boundaries b;
  constexpr std::uint64_t kRes = 0x100000000, kStep = 0x200000;
  for (std::uint64_t i = 0; i < 9; ++i) {
    const std::uintptr_t site = 0x1000 + i;
    b.on_sleep_unmap(ev(1 + i, 7), kRes + i * kStep, kStep, 1, kStep, &site, 1);
  }
  // A free of the reservation holding the ninth range is part of the allocator's free, not the
  // end of the sleep; one of memory the sleep never unmapped ends it.
  CHECK_FALSE(b.on_address_free(7, kRes + 8 * kStep).any());
  const auto e = b.on_address_free(7, 0x900000000);
  REQUIRE(e.sleep);
  CHECK(e.sleep->ranges == 9);
  REQUIRE(e.sleep->seen.size() == 9);
  CHECK(e.sleep->seen[8].va == kRes + 8 * kStep);
  CHECK(e.sleep->seen[8].size == kStep);
  REQUIRE(e.sleep->sites.size() == 9);
  for (std::size_t i = 0; i < 9; ++i) CHECK(e.sleep->sites[i] == 0x1000 + i);
  CHECK(e.sleep->sites.contains(0x1008));
  CHECK_FALSE(e.sleep->sites.contains(0x1009));
  CHECK(e.sleep->seen_all);
}

TEST_CASE("Leftovers of a failed wake-up are kept for the next sleep, bounded") {
  Boundaries b;
  CHECK_FALSE(b.has_leftovers());
  std::vector<Leftover> l(Boundaries::kMaxLeftovers + 5);
  b.keep(std::move(l));
  CHECK(b.has_leftovers());
  CHECK(b.take_leftovers().size() == Boundaries::kMaxLeftovers);
  CHECK_FALSE(b.has_leftovers());
}

TEST_CASE("A rank's second device is stray; a process that is no rank may use any") {
  DeviceUse rank;
  CHECK_FALSE(rank.seen(1));
  CHECK_FALSE(rank.first_use(1, ev(1, 7, "cudaMalloc"), false, true).stray);
  CHECK(rank.seen(1));
  const auto v = rank.first_use(0, ev(2, 9, "cuDevicePrimaryCtxRetain"), true, true);
  CHECK(v.stray);
  CHECK(v.home == 1);
  CHECK(v.home_first.ev.seq == 1);
  CHECK_FALSE(rank.first_use(0, ev(3, 9), false, true).stray);  // said once

  DeviceUse single;
  single.first_use(0, ev(1, 7), false, false);
  CHECK_FALSE(single.first_use(1, ev(2, 7), false, false).stray);
}

TEST_CASE("A communicator on another device makes the earlier device stray then") {
  DeviceUse d;
  d.first_use(0, ev(1, 7, "cudaMalloc"), false, false);
  const int devs[] = {1};
  const auto out = d.communicators(devs);
  REQUIRE(out.size() == 1);
  CHECK(out[0].dev == 0);
  CHECK(out[0].ev.seq == 1);
  CHECK(d.communicators(devs).empty());  // said once
  const auto v = d.first_use(2, ev(2, 7), false, false);
  CHECK(v.stray);  // a rank now: its device is the communicator's
  CHECK(v.home == 1);
  CHECK_FALSE(d.first_use(1, ev(3, 7), false, false).stray);
}
