// SPDX-License-Identifier: Apache-2.0
// policy/transport: the communicator registry, sticky suppression and its serialization with a
// running flush (also run under ThreadSanitizer, docs/transport.md), flush classification and
// the flush policy.
#include <catch2/catch.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "options.h"
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

Options opts(std::vector<std::pair<std::string_view, std::string_view>> env) {
  return parse_options(env).options;
}

void noop(void *arg) {
  ++*static_cast<int *>(arg);
}

}  // namespace

TEST_CASE("Communicators count per device from init entry to destroy") {
  Transport t;
  CHECK_FALSE(t.suppressed());
  CHECK(t.on_create_enter(ev(1)));  // suppressed before the real init runs
  CHECK(t.suppressed());
  CHECK(t.live() == 0);
  const CommOnDevice made[] = {{0x1000, 0}, {0x2000, 1}, {0x3000, 1}};
  t.on_create_exit(made);
  CHECK(t.live() == 3);
  CHECK(t.live_on(0) == 1);
  CHECK(t.live_on(1) == 2);
  CHECK(t.device_of(0x2000) == 1);
  CHECK(t.created_total() == 3);
  CHECK(t.live_by_device() == std::vector<std::pair<int, int>>{{0, 1}, {1, 2}});
  CHECK(t.on_destroy(0x2000) == 1);
  CHECK(t.on_destroy(0x2000) == -1);  // unknown now: nothing changes
  CHECK(t.on_destroy(0x9999) == -1);
  CHECK(t.live() == 2);
  CHECK(t.live_on(1) == 1);
  // A second create does not turn suppression on again, and a repeated value is not counted twice.
  CHECK_FALSE(t.on_create_enter(ev(2)));
  const CommOnDevice again[] = {{0x1000, 0}, {0, 0}};
  t.on_create_exit(again);
  CHECK(t.live() == 2);
  CHECK(t.suppressed_by().seq == 1);
  CHECK(std::string(t.suppressed_by().api) == "ncclCommInitRank");
}

TEST_CASE("Communicators on devices out of range count as unknown device") {
  Transport t;
  t.on_create_enter(ev(1));
  const CommOnDevice made[] = {{0x10, -1}, {0x20, 200}};
  t.on_create_exit(made);
  CHECK(t.live() == 2);
  CHECK(t.live_on(-1) == 2);
  CHECK(t.live_by_device() == std::vector<std::pair<int, int>>{{-1, 2}});
}

TEST_CASE("Suppression is sticky after destroy and after a failed setup") {
  SECTION("destroy") {
    Transport t;
    t.on_create_enter(ev(1));
    const CommOnDevice made[] = {{0x1000, 0}};
    t.on_create_exit(made);
    t.on_destroy(0x1000);
    CHECK(t.live() == 0);
    CHECK(t.suppressed());
  }
  SECTION("failed init") {
    Transport t;
    t.on_create_enter(ev(1));
    t.on_create_exit({});  // the init failed: nothing was created
    CHECK(t.live() == 0);
    CHECK(t.suppressed());
    int ran = 0;
    CHECK_FALSE(t.run_flush(noop, &ran));
    CHECK(ran == 0);
  }
  SECTION("announced transport") {
    Transport t;
    CHECK(t.suppress_external(ev(7, "cumemguard_suppress_opportunistic_cleanup")));
    CHECK_FALSE(t.suppress_external(ev(8, "cumemguard_suppress_opportunistic_cleanup")));
    CHECK(t.suppressed());
    CHECK(t.suppressed_by().seq == 7);
  }
  SECTION("after fork the child keeps suppression but no communicator") {
    Transport t;
    t.on_create_enter(ev(1));
    const CommOnDevice made[] = {{0x1000, 0}};
    t.on_create_exit(made);
    t.reset();
    CHECK(t.live() == 0);
    CHECK(t.live_on(0) == 0);
    CHECK(t.device_of(0x1000) == -1);
    CHECK(t.suppressed());
  }
}

TEST_CASE("run_flush runs the flush only while not suppressed") {
  Transport t;
  int ran = 0;
  CHECK(t.run_flush(noop, &ran));
  CHECK(ran == 1);
  CHECK_FALSE(t.run_flush(nullptr, nullptr));
  t.suppress_external(ev(1));
  CHECK_FALSE(t.run_flush(noop, &ran));
  CHECK(ran == 1);
  CHECK(t.flushes_run() == 1);
  CHECK(t.flushes_declined() == 1);
}

TEST_CASE("A flush that itself starts a transport does not wait for itself") {
  struct Ctx {
    Transport *t;
    bool inside = false, turned_on = false, nested_ran = true;
    int n = 0;
  };
  Transport t;
  Ctx ctx{&t};
  CHECK(t.run_flush(
      [](void *p) {
        auto *c = static_cast<Ctx *>(p);
        c->inside = c->t->flushing_here();
        c->turned_on = c->t->on_create_enter(ev(3));  // would deadlock if it waited here
        c->nested_ran = c->t->run_flush(noop, &c->n);
      },
      &ctx));
  CHECK(ctx.inside);
  CHECK(ctx.turned_on);
  CHECK_FALSE(ctx.nested_ran);
  CHECK_FALSE(t.flushing_here());
  CHECK(t.suppressed());
}

// The cleanup contract's startup race: an init that begins while a flush runs returns only after the flush
// has finished, and no flush request after the init's entry runs. Ordered by events, not by time:
// the flush runs until it sees the init turn suppression on (the init has entered), then keeps
// running while it watches for the init to return (it must not), and only then ends; the order of
// the end and the init's return is read from one counter.
TEST_CASE("The transition waits for a flush already running") {
  Transport t;
  std::atomic<std::uint64_t> order{0};
  std::atomic<bool> started{false}, init_returned{false};
  std::uint64_t flush_end = 0, init_return = 0;
  bool saw_suppression = false, returned_during_flush = false;
  struct Ctx {
    Transport *t;
    std::atomic<bool> *started, *init_returned;
    std::atomic<std::uint64_t> *order;
    std::uint64_t *end;
    bool *saw, *returned;
  } ctx{&t, &started, &init_returned, &order, &flush_end, &saw_suppression, &returned_during_flush};
  bool ran = false;  // Catch's assertions are not thread-safe: checked after the join
  std::thread flusher([&] {
    ran = t.run_flush(
        [](void *p) {
          auto *c = static_cast<Ctx *>(p);
          c->started->store(true);
          while (!c->t->suppressed()) std::this_thread::yield();
          *c->saw = true;
          // A transition that did not wait would return now: give it every chance to.
          for (int i = 0; i < 20000 && !c->init_returned->load(); ++i) std::this_thread::yield();
          *c->returned = c->init_returned->load();
          *c->end = c->order->fetch_add(1) + 1;
        },
        &ctx);
  });
  while (!started.load()) std::this_thread::yield();
  CHECK(t.on_create_enter(ev(1)));
  init_return = order.fetch_add(1) + 1;
  init_returned.store(true);
  flusher.join();
  CHECK(ran);
  CHECK(saw_suppression);
  CHECK_FALSE(returned_during_flush);
  CHECK(init_return > flush_end);
  int calls = 0;
  CHECK_FALSE(t.run_flush(noop, &calls));  // sticky from here on
  CHECK(calls == 0);
}

// Many threads request flushes while one starts a communicator: every flush that ran ended before
// the transition returned, and requests after it declined. The transition comes once every thread
// has run flushes, and the threads stop once each has been declined. Run under TSan for races.
TEST_CASE("Concurrent flush requests and a transition") {
  Transport t;
  constexpr int kThreads = 4;
  std::atomic<std::uint64_t> clock{0};
  std::atomic<std::uint64_t> transition_done{UINT64_MAX};
  std::atomic<int> late_runs{0}, ran{0}, declined{0}, running{0}, stopped{0};
  std::atomic<bool> go{false};
  struct Ctx {
    std::atomic<std::uint64_t> *clock, *done;
    std::atomic<int> *late;
  } ctx{&clock, &transition_done, &late_runs};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      bool counted = false;
      for (;;) {
        bool r = t.run_flush(
            [](void *p) {
              auto *c = static_cast<Ctx *>(p);
              for (int k = 0; k < 50; ++k) std::this_thread::yield();  // a flush takes a while
              const std::uint64_t end = c->clock->fetch_add(1) + 1;
              if (end > c->done->load()) c->late->fetch_add(1);
            },
            &ctx);
        (r ? ran : declined).fetch_add(1);
        if (r && !counted) {
          counted = true;
          running.fetch_add(1);
        }
        if (!r) break;  // declined: suppression is on, and stays on
      }
      stopped.fetch_add(1);
    });
  go.store(true);
  while (running.load() < kThreads) std::this_thread::yield();  // every thread is flushing
  t.on_create_enter(ev(1));
  transition_done.store(clock.fetch_add(1) + 1);
  for (auto &th : threads) th.join();
  CHECK(stopped.load() == kThreads);
  CHECK(late_runs.load() == 0);
  CHECK(ran.load() >= kThreads);
  CHECK(declined.load() == kThreads);
  CHECK(t.flushes_run() == static_cast<std::uint64_t>(ran.load()));
  CHECK(t.flushes_declined() == static_cast<std::uint64_t>(declined.load()));
}

// Several setups begin at once while other threads read who turned suppression on: exactly one
// caller turns it on, and readers see either nothing yet or that caller's event, never a torn one.
TEST_CASE("Concurrent transitions publish one event") {
  Transport t;
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> turned{0}, torn{0};
  std::atomic<std::uint64_t> winner{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&] {
      while (!stop.load()) {
        const EventRef e = t.suppressed_by();
        if (e.known() && (e.ts != e.seq * 10 || e.tid != 1)) torn.fetch_add(1);
      }
    });
  std::vector<std::thread> setters;
  for (int i = 0; i < 4; ++i)
    setters.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      if (t.on_create_enter(ev(100 + i))) {
        turned.fetch_add(1);
        winner.store(100 + i);
      }
    });
  go.store(true);
  for (auto &th : setters) th.join();
  stop.store(true);
  for (auto &th : threads) th.join();
  CHECK(turned.load() == 1);
  CHECK(torn.load() == 0);
  CHECK(t.suppressed_by().seq == winner.load());
}

TEST_CASE("Concurrent creates and destroys keep the counts exact") {
  Transport t;
  std::vector<std::thread> threads;
  std::atomic<int> wrong_device{0};
  for (int i = 0; i < 4; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 500; ++k) {
        const std::uint64_t comm = (static_cast<std::uint64_t>(i) << 32) | (k + 1);
        t.on_create_enter(ev(1));
        const CommOnDevice c[] = {{comm, i % 2}};
        t.on_create_exit(c);
        if (k % 2 && t.on_destroy(comm) != i % 2) wrong_device.fetch_add(1);
      }
    });
  for (auto &th : threads) th.join();
  CHECK(wrong_device.load() == 0);
  CHECK(t.live() == 4 * 250);
  CHECK(t.live_on(0) == 2 * 250);
  CHECK(t.live_on(1) == 2 * 250);
  CHECK(t.created_total() == 4 * 500);
}

// ---- classification ------------------------------------------------------------------------

TEST_CASE("Built-in patterns recognise PyTorch's flush and OOM-retry frames") {
  const FlushPatterns p = FlushPatterns::from_option("");
  const char *lib = "/venv/lib/python3.12/site-packages/torch/lib/libc10_cuda.so";
  // Demangled names as in the torch 2.11 wheel (nccl-and-cleanup.md 0.4), with arguments.
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache("
                   "c10::cuda::MempoolId_t)",
                   lib) == FrameKind::Flush);
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::CudaMallocAsync::CudaMallocAsyncAllocator::"
                   "emptyCache(std::pair<unsigned long long, unsigned long long>)",
                   lib) == FrameKind::Flush);
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed "
                   "char, unsigned long, CUstream_st*)",
                   lib) == FrameKind::Retry);
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::Native::(anonymous "
                   "namespace)::DeviceCachingAllocator::release_available_cached_blocks(...)",
                   lib) == FrameKind::Retry);
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::garbage_"
                   "collect_cached_blocks()",
                   lib) == FrameKind::Retry);
  // release_cached_blocks and release_block lie on both paths: they decide nothing.
  CHECK(p.classify("",
                   "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_"
                   "cached_blocks(c10::cuda::MempoolId_t)",
                   lib) == FrameKind::Other);
  CHECK(
      p.classify(
          "",
          "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_block(Block*)",
          lib) == FrameKind::Other);
  // Mangled names match the patterns without "::".
  CHECK(p.classify("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator31release_"
                   "available_cached_blocksERKNS2_10AllocParamsE",
                   "", lib) == FrameKind::Retry);
  CHECK(p.classify("THCPModule_emptyCache", "THCPModule_emptyCache", "/x/libtorch_python.so") ==
        FrameKind::Other);
  // libnccl's own frames, whatever their names.
  CHECK(p.classify("ncclCommDestroy", "ncclCommDestroy",
                   "/usr/lib/x86_64-linux-gnu/libnccl.so.2") == FrameKind::Nccl);
  CHECK(p.classify("", "", "/opt/nvidia/nccl/lib/libnccl.so.2.28.9") == FrameKind::Nccl);
  CHECK(p.classify("", "", "") == FrameKind::Other);
}

TEST_CASE("CUMEMGUARD_FLUSH_FRAMES adds flush and intentional patterns") {
  const FlushPatterns p =
      FlushPatterns::from_option(" my_pool_trim , !MyAllocator::grow,, ! , flushAll");
  CHECK(p.flush().size() == FlushPatterns::builtin_flush().size() + 2);
  CHECK(p.retry().size() == FlushPatterns::builtin_retry().size() + 1);
  CHECK(p.classify("my_pool_trim_v2", "my_pool_trim_v2", "/a/lib.so") == FrameKind::Flush);
  CHECK(p.classify("", "ns::flushAll()", "/a/lib.so") == FrameKind::Flush);
  CHECK(p.classify("", "ns::MyAllocator::grow(unsigned long)", "/a/lib.so") == FrameKind::Retry);
}

TEST_CASE("A stack is opportunistic with a flush frame and no retry or NCCL frame") {
  using K = FrameKind;
  using W = FlushVerdict::Why;
  SECTION("flush, called from the program") {
    const K s[] = {K::Other, K::Other, K::Flush, K::Flush, K::Other, K::Other};
    const FlushVerdict v = classify_stack(s);
    CHECK(v.opportunistic());
    CHECK(v.flush_frame == 2);
    CHECK(v.caller_frame == 4);
  }
  SECTION("flush frame outermost") {
    const K s[] = {K::Other, K::Flush};
    const FlushVerdict v = classify_stack(s);
    CHECK(v.opportunistic());
    CHECK(v.caller_frame == -1);
  }
  SECTION("OOM retry below a flush frame still intentional") {
    const K s[] = {K::Other, K::Retry, K::Flush};
    CHECK(classify_stack(s).why == W::RetryFrame);
  }
  SECTION("from libnccl") {
    const K s[] = {K::Nccl, K::Flush};
    CHECK(classify_stack(s).why == W::FromNccl);
  }
  SECTION("no flush frame") {
    const K s[] = {K::Other, K::Other};
    CHECK(classify_stack(s).why == W::NoFlushFrame);
    CHECK(classify_stack({}).why == W::NoFlushFrame);
  }
}

TEST_CASE("The flush policy follows OPPORTUNISTIC, the mode and the class override") {
  CHECK(decide_flush(opts({}), FlushTarget::Free) == Action::Forward);
  CHECK(decide_flush(opts({}), FlushTarget::Trim) == Action::Forward);
  const Options defer = opts({{"CUMEMGUARD_OPPORTUNISTIC", "defer"}});
  CHECK(decide_flush(defer, FlushTarget::Free) == Action::Defer);
  CHECK(decide_flush(defer, FlushTarget::Trim) == Action::Skip);
  // report mode forwards everything except holds (the table's rule for Defer).
  CHECK(decide_flush(opts({{"CUMEMGUARD_OPPORTUNISTIC", "defer"}, {"CUMEMGUARD_MODE", "report"}}),
                     FlushTarget::Free) == Action::Defer);
  CHECK(decide_flush(opts({{"CUMEMGUARD_MODE", "strict"}}), FlushTarget::Free) == Action::Abort);
  CHECK(decide_flush(opts({{"CUMEMGUARD_OPPORTUNISTIC", "defer"},
                           {"CUMEMGUARD_ACTION_OPPORTUNISTIC_FLUSH", "forward"}}),
                     FlushTarget::Free) == Action::Forward);
  CHECK(decide_flush(opts({{"CUMEMGUARD_ACTION_OPPORTUNISTIC_FLUSH", "abort"}}),
                     FlushTarget::Trim) == Action::Abort);
  // A free is never "proven redundant": skip asked for a class falls back to the policy.
  CHECK(decide_flush(opts({{"CUMEMGUARD_ACTION_OPPORTUNISTIC_FLUSH", "skip"}}),
                     FlushTarget::Free) == Action::Forward);
}

TEST_CASE("The finding names the flush, its site, bytes, blocked time and what suppressed it") {
  FlushEvent e;
  e.api = "cudaFree";
  e.bytes = 8 << 20;
  e.blocked_ns = 301'200'000;
  e.flush_frame = "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache()";
  e.site = "c10::...::emptyCache() <- train_step+0x2a (train)";
  e.live = 1;
  e.suppressed_by = ev(12);
  Finding f = flush_finding(e);
  CHECK(f.cls == FindingClass::OpportunisticFlush);
  CHECK(f.bytes == 8u << 20);
  CHECK(f.blocked_ns == 301'200'000u);
  CHECK(f.msg.find(
            "cudaFree of 8.0 MiB in a cache flush "
            "(c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache())") ==
        0);
  CHECK(f.msg.find("while 1 NCCL communicator is live") != std::string::npos);
  CHECK(f.msg.find("took 301.2 ms") != std::string::npos);
  REQUIRE(f.related.size() == 1);
  CHECK(f.related[0].what == "suppressed from");
  CHECK(f.related[0].ev.seq == 12);
  CHECK(f.state_json.find("\"site\":\"c10::...::emptyCache() <- train_step+0x2a (train)\"") !=
        std::string::npos);

  e.action = Action::Defer;
  e.blocked_ns = 0;
  e.held_bytes = 24 << 20;
  e.live = 0;
  f = flush_finding(e);
  CHECK(f.msg.find("after NCCL was set up (suppression is sticky") != std::string::npos);
  CHECK(f.msg.find("held back (24.0 MiB deferred)") != std::string::npos);

  e.action = Action::Forward;
  e.over_limit = true;
  e.defer_limit = 16 << 20;
  e.blocked_ns = 2'000'000;
  e.suppressed_by = ev(3, "cumemguard_suppress_opportunistic_cleanup");
  f = flush_finding(e);
  CHECK(f.msg.find("after the program announced a transport") != std::string::npos);
  CHECK(f.msg.find("CUMEMGUARD_DEFER_LIMIT (16.0 MiB; 24.0 MiB held)") != std::string::npos);
  CHECK(f.state_json.find("\"over_limit\":true") != std::string::npos);

  e.target = FlushTarget::Trim;
  e.action = Action::Skip;
  e.bytes = 0;
  e.api = "cuMemPoolTrimTo";
  f = flush_finding(e);
  CHECK(f.msg.find("cuMemPoolTrimTo in a cache flush") == 0);
  CHECK(f.msg.find("not made") != std::string::npos);
}

TEST_CASE("Human-readable sizes and durations") {
  CHECK(human_bytes(512) == "512 B");
  CHECK(human_bytes(3 << 20) == "3.0 MiB");
  CHECK(human_ns(999) == "999 ns");
  CHECK(human_ns(1500) == "1.5 us");
  CHECK(human_ns(301'200'000) == "301.2 ms");
  CHECK(human_ns(2'500'000'000ull) == "2.50 s");
}
