// SPDX-License-Identifier: Apache-2.0
// policy/transport with suspended communicators: a communicator NCCL suspended is quiet (2.29.7
// synchronizes the device and passes a barrier of all ranks before it releases its memory), so
// while every communicator of the process is suspended an optional flush is not suppressed; an
// ended communicator, a failed setup or an announced transport keep suppression sticky (the cleanup contract);
// a resume is an init-like transition, serialized with a running flush. Also run under TSan.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "transport.h"

using namespace cmg;

namespace {

EventRef ev(std::uint64_t seq, const char *api = "ncclCommInitRank") {
  EventRef e;
  e.seq = seq;
  e.ts = seq * 10;
  e.tid = 1;
  e.api = api;
  return e;
}

void make(Transport &t, std::uint64_t comm, int dev, std::uint64_t seq) {
  t.on_create_enter(ev(seq));
  const CommOnDevice made[] = {{comm, dev}};
  t.on_create_exit(made, ev(seq));
}

void noop(void *arg) {
  ++*static_cast<int *>(arg);
}

}  // namespace

TEST_CASE("A suspended communicator is not live for opportunistic-cleanup suppression") {
  Transport t;
  make(t, 0x1000, 0, 1);
  CHECK(t.suppressed());
  CHECK(t.on_suspended(0x1000, ev(2, "ncclCommSuspend")));
  CHECK_FALSE(t.suppressed());
  CHECK(t.ever_suppressed());
  CHECK(t.suspended_count() == 1);
  CHECK(t.live() == 1);  // still a communicator: only not running
  CHECK(t.comm_state(0x1000)->suspended.seq == 2);
  int ran = 0;
  CHECK(t.run_flush(noop, &ran));  // the program's optional flush may run now
  CHECK(ran == 1);
  t.on_resume_enter(0x1000);
  CHECK(t.suppressed());  // running again from the resume's entry on
  CHECK_FALSE(t.comm_state(0x1000)->suspended.known());
  CHECK_FALSE(t.run_flush(noop, &ran));
  t.on_resume_exit(0x1000, true);
  CHECK(t.suppressed());
  CHECK(t.suspended_count() == 0);
  CHECK(t.suppressed_by().seq == 1);  // the first init stays what turned it on
}

TEST_CASE("Suppression is lifted only while every communicator is suspended") {
  Transport t;
  make(t, 0x1000, 0, 1);
  make(t, 0x2000, 1, 2);
  CHECK(t.on_suspended(0x1000, ev(3)));
  CHECK(t.suppressed());  // 0x2000 still runs
  CHECK(t.on_suspended(0x2000, ev(4)));
  CHECK_FALSE(t.suppressed());
  CHECK(t.on_suspended(0x2000, ev(5)));  // again: counted once
  CHECK(t.suspended_count() == 2);
  SECTION("a new communicator runs from its init's entry") {
    CHECK_FALSE(t.on_create_enter(ev(6)));
    CHECK(t.suppressed());
    const CommOnDevice made[] = {{0x3000, 0}};
    t.on_create_exit(made, ev(6));
    CHECK(t.suppressed());
  }
  SECTION("a failed resume leaves the communicator suspended") {
    t.on_resume_enter(0x1000);
    CHECK(t.suppressed());
    t.on_resume_exit(0x1000, false);
    CHECK_FALSE(t.suppressed());
    CHECK(t.comm_state(0x1000)->suspended.seq == 3);
  }
  SECTION("a destroyed one proves nothing: sticky again") {
    CHECK(t.on_destroy(0x1000, ev(7, "ncclCommDestroy")) == 0);
    CHECK(t.suspended_count() == 1);
    CHECK(t.suppressed());
  }
  SECTION("unknown communicators change nothing") {
    CHECK_FALSE(t.on_suspended(0x9999, ev(8)));
    t.on_resume_enter(0x9999);
    t.on_resume_exit(0x9999, true);
    CHECK_FALSE(t.suppressed());
  }
}

TEST_CASE("Suspension does not lift what an ended communicator, a failure or a transport left") {
  SECTION("an earlier communicator ended") {
    Transport t;
    make(t, 0x1000, 0, 1);
    make(t, 0x2000, 0, 2);
    t.on_destroy(0x1000);
    t.on_suspended(0x2000, ev(3));
    CHECK(t.suppressed());
  }
  SECTION("a setup failed") {
    Transport t;
    t.on_create_enter(ev(1));
    t.on_create_exit({}, ev(1));
    make(t, 0x2000, 0, 2);
    t.on_suspended(0x2000, ev(3));
    CHECK(t.suppressed());
  }
  SECTION("a transport the shim cannot see was announced") {
    Transport t;
    make(t, 0x2000, 0, 1);
    t.suppress_external(ev(2, "cumemguard_suppress_opportunistic_cleanup"));
    t.on_suspended(0x2000, ev(3));
    CHECK(t.suppressed());
  }
  SECTION("after fork the child's inherited state proves nothing") {
    Transport t;
    make(t, 0x2000, 0, 1);
    t.on_suspended(0x2000, ev(2));
    CHECK_FALSE(t.suppressed());
    t.reset();
    CHECK(t.suppressed());
    CHECK(t.suspended_count() == 0);
    make(t, 0x3000, 0, 3);
    t.on_suspended(0x3000, ev(4));
    CHECK(t.suppressed());
  }
}

TEST_CASE("Ended communicators are remembered until the pointer is a communicator again") {
  Transport t;
  make(t, 0x1000, 0, 1);
  CHECK_FALSE(t.ended(0x1000));
  t.on_destroy(0x1000, ev(2, "ncclCommAbort"));
  REQUIRE(t.ended(0x1000));
  CHECK(t.ended(0x1000)->seq == 2);
  CHECK_FALSE(t.comm_state(0x1000));
  make(t, 0x1000, 0, 3);  // NCCL's allocator handed the address out again
  CHECK_FALSE(t.ended(0x1000));
  // Made before the shim saw it: its end is remembered all the same.
  CHECK(t.on_destroy(0x7000, ev(4, "ncclCommDestroy")) == -1);
  CHECK(t.ended(0x7000)->seq == 4);
  for (std::uint64_t i = 0; i < Transport::kEndedKept + 10; ++i) t.on_destroy(0x100000 + i, ev(5));
  CHECK_FALSE(t.ended(0x7000));  // the oldest are forgotten
  CHECK(t.ended(0x100000 + Transport::kEndedKept + 9));
}

// A resume that begins while the program's optional flush runs returns only after that flush has
// finished: the communicator may launch collectives as soon as the resume returns. The flush's
// end is recorded inside it; the resume checks it after it returned (no timing assumption).
TEST_CASE("A resume waits for a flush already running") {
  Transport t;
  make(t, 0x1000, 0, 1);
  t.on_suspended(0x1000, ev(2));
  REQUIRE_FALSE(t.suppressed());
  std::atomic<bool> started{false}, release{false}, flush_done{false};
  struct Ctx {
    std::atomic<bool> *started, *release, *done;
  } ctx{&started, &release, &flush_done};
  bool ran = false;
  std::thread flusher([&] {
    ran = t.run_flush(
        [](void *p) {
          auto *c = static_cast<Ctx *>(p);
          c->started->store(true);
          while (!c->release->load()) std::this_thread::yield();
          c->done->store(true);
        },
        &ctx);
  });
  while (!started.load()) std::this_thread::yield();
  bool done_at_return = false;
  std::atomic<bool> resuming{false};
  std::thread resumer([&] {
    resuming.store(true);
    t.on_resume_enter(0x1000);
    done_at_return = flush_done.load();
    t.on_resume_exit(0x1000, true);
  });
  while (!resuming.load()) std::this_thread::yield();
  release.store(true);
  resumer.join();
  flusher.join();
  CHECK(ran);
  CHECK(done_at_return);
  int calls = 0;
  CHECK_FALSE(t.run_flush(noop, &calls));
  CHECK(calls == 0);
}

// Many threads suspend and resume their own communicators while others request flushes: every
// flush that ran saw a moment where all communicators were suspended; the counts stay exact.
TEST_CASE("Concurrent suspends, resumes and flush requests keep the counts exact") {
  Transport t;
  constexpr int kComms = 4, kRounds = 200;
  for (int i = 0; i < kComms; ++i) make(t, 0x1000 + i, 0, 1 + i);
  std::atomic<bool> stop{false};
  std::atomic<int> ran{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kComms; ++i)
    ts.emplace_back([&, i] {
      for (int k = 0; k < kRounds; ++k) {
        t.on_suspended(0x1000 + i, ev(100 + k));
        t.on_resume_enter(0x1000 + i);
        t.on_resume_exit(0x1000 + i, k % 3 != 0);
        if (k % 3 == 0) {  // the failed resume left it suspended: resume it for real
          t.on_resume_enter(0x1000 + i);
          t.on_resume_exit(0x1000 + i, true);
        }
      }
    });
  std::thread asker([&] {
    int n = 0;
    while (!stop.load())
      if (t.run_flush(noop, &n)) ran.fetch_add(1);
  });
  for (auto &th : ts) th.join();
  stop.store(true);
  asker.join();
  CHECK(t.suspended_count() == 0);
  CHECK(t.suppressed());
  for (int i = 0; i < kComms; ++i) t.on_suspended(0x1000 + i, ev(999));
  CHECK_FALSE(t.suppressed());
  CHECK(t.suspended_count() == kComms);
}
