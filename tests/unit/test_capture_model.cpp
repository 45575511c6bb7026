// SPDX-License-Identifier: Apache-2.0
// The capture model: the documented prohibition rule in every mode combination, the captures'
// bookkeeping, the shim's own work against open captures, graph ownership across capture, launch,
// free and destruction, and the capture findings' texts.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "capture_findings.h"
#include "capture_model.h"
#include "decide.h"

using namespace cmg;

namespace {

EventRef ev(std::uint64_t seq, std::uint32_t tid = 1, const char *api = "cudaStreamBeginCapture") {
  EventRef e;
  e.seq = seq;
  e.tid = tid;
  e.api = api;
  e.stack = static_cast<std::uint32_t>(seq * 10);
  return e;
}

constexpr StreamKey kS1{0x1000, 0}, kS2{0x2000, 0};

}  // namespace

TEST_CASE("the prohibition rule of cuThreadExchangeStreamCaptureMode, mode by mode") {
  using M = CaptureMode;
  // Rows: (capture mode, same thread?, calling thread's mode) -> prohibited.
  struct Row {
    M capture;
    bool same;
    M thread;
    bool prohibited;
  } rows[] = {
      {M::Global, true, M::Global, true},
      {M::Global, true, M::ThreadLocal, true},
      {M::Global, true, M::Relaxed, false},
      {M::Global, false, M::Global, true},
      {M::Global, false, M::ThreadLocal, false},
      {M::Global, false, M::Relaxed, false},
      {M::ThreadLocal, true, M::Global, true},
      {M::ThreadLocal, true, M::ThreadLocal, true},
      {M::ThreadLocal, true, M::Relaxed, false},
      {M::ThreadLocal, false, M::Global, false},
      {M::ThreadLocal, false, M::ThreadLocal, false},
      {M::Relaxed, true, M::Global, false},
      {M::Relaxed, false, M::Global, false},
      {M::Relaxed, true, M::ThreadLocal, false},
  };
  for (const Row &r : rows) {
    CaptureModel m;
    m.on_begin(kS1, 7, r.capture, ev(1, 7), 0);
    const UnsafeVerdict v = m.check_unsafe(r.same ? 7 : 8, r.thread);
    INFO("capture " << capture_mode_name(r.capture) << (r.same ? " same" : " other") << " thread "
                    << capture_mode_name(r.thread));
    CHECK(v.prohibited == r.prohibited);
    if (v.prohibited) {
      CHECK(v.capture.id == 1);
      CHECK(v.own == r.same);
      CHECK(v.count == 1);
    }
  }
}

TEST_CASE("captures: begin, end, per thread and per stream; the own capture is named first") {
  CaptureModel m;
  CHECK_FALSE(m.any_open());
  CHECK(m.own_work().now);
  const CaptureRec a = m.on_begin(kS1, 7, CaptureMode::Global, ev(1, 7), 41);
  const CaptureRec b = m.on_begin(kS2, 8, CaptureMode::Global, ev(2, 8), 42);
  CHECK(a.id == 1);
  CHECK(b.id == 2);
  CHECK(m.any_open());
  CHECK(m.capture_of_thread(7) == 1);
  CHECK(m.capture_of_thread(8) == 2);
  CHECK(m.capture_of_thread(9) == 0);
  // A stream that joined capture 2 is found by the driver's id.
  CHECK(m.capture_of_stream(StreamKey{0x3000, 0}, 42)->id == 2);
  CHECK_FALSE(m.capture_of_stream(StreamKey{0x3000, 0}, 0));
  // Thread 8 in global mode is prohibited by both; its own capture is the one named.
  UnsafeVerdict v = m.check_unsafe(8, CaptureMode::Global);
  CHECK(v.count == 2);
  CHECK(v.own);
  CHECK(v.capture.id == 2);
  // The shim's own work waits for the oldest capture.
  OwnWork w = m.own_work();
  CHECK_FALSE(w.now);
  CHECK(w.waits_for.id == 1);
  m.note_invalidated(8, CaptureMode::Global, ev(5, 8, "cudaFree"));
  m.note_invalidated(8, CaptureMode::Global, ev(6, 8, "cudaMalloc"));  // the first is kept
  m.note_alloc(2, 4096);
  auto end_b = m.on_end(kS2);
  REQUIRE(end_b);
  CHECK(end_b->invalidated_by.seq == 5);
  CHECK(end_b->allocs == 1);
  CHECK(end_b->alloc_bytes == 4096);
  auto end_a = m.on_end(kS1);
  REQUIRE(end_a);
  CHECK(end_a->invalidated_by.seq == 5);  // global mode: thread 8's call invalidated it too
  CHECK_FALSE(m.on_end(kS1));
  CHECK_FALSE(m.any_open());
  CHECK(m.own_work().now);
  // The per-thread default stream of two threads are two streams.
  m.on_begin(StreamKey{2, 7}, 7, CaptureMode::ThreadLocal, ev(9, 7), 0);
  CHECK_FALSE(m.on_end(StreamKey{2, 8}));
  CHECK(m.on_end(StreamKey{2, 7}));
}

TEST_CASE("a begin on a stream the model thinks still captures: the driver's answer wins") {
  CaptureModel m;
  m.on_begin(kS1, 7, CaptureMode::Global, ev(1, 7), 0);
  m.on_begin(kS1, 7, CaptureMode::Relaxed, ev(2, 7), 0);
  CHECK(m.open_captures().size() == 1);
  CHECK_FALSE(m.check_unsafe(7, CaptureMode::Global).prohibited);
}

TEST_CASE("graph allocations: a capture's, through launch, free, relaunch and destruction") {
  CaptureModel m;
  m.on_begin(kS1, 7, CaptureMode::Global, ev(1, 7), 0);
  CHECK_FALSE(m.graph_owned(0xa000));
  m.on_alloc_node(0, 1, 0xa000, 1 << 20, 0, ev(2, 7, "cudaMallocAsync"));
  m.on_alloc_node(0, 1, 0xb000, 4096, 0, ev(3, 7, "cudaMallocAsync"));
  CHECK(m.on_free_node(0, 1, 0xb000));        // freed in its own graph
  CHECK_FALSE(m.on_free_node(0, 1, 0xc000));  // not a graph allocation
  REQUIRE(m.graph_owned(0xa000));
  CHECK(m.graph_owned(0xa000)->graph == 0);
  auto c = m.on_end(kS1);
  REQUIRE(c);
  CHECK(c->graph_allocs == 2);
  m.on_capture_ended(1, 0x6000);
  CHECK(m.graph_owned(0xa000)->graph == 0x6000);
  m.on_instantiate(0xe000, 0x6000);
  LaunchEffect l = m.on_launch(0xe000);
  // Only the allocation the graph does not free stays live after the launch.
  REQUIRE(l.allocated.size() == 1);
  CHECK(l.allocated[0].ptr == 0xa000);
  CHECK(m.graph_owned(0xa000)->live);
  auto f = m.on_free_outside(0xa000);
  REQUIRE(f);
  CHECK(f->live);
  CHECK_FALSE(m.graph_owned(0xa000)->live);
  // A second free without a launch in between finds it not live: the driver refuses it.
  CHECK_FALSE(m.on_free_outside(0xa000)->live);
  CHECK(m.on_launch(0xe000).allocated.size() == 1);
  // Graph and executable graph destroyed: a live allocation stays owned until it is freed.
  m.on_graph_destroy(0x6000);
  m.on_exec_destroy(0xe000);
  CHECK(m.graph_owned(0xa000));
  CHECK_FALSE(m.graph_owned(0xb000));
  std::vector<std::uint64_t> live;
  CHECK(m.for_each_live_within([&](const GraphAlloc &a) { live.push_back(a.ptr); }, 1000));
  CHECK(live == std::vector<std::uint64_t>{0xa000});
  CHECK(m.on_free_outside(0xa000)->live);
  CHECK_FALSE(m.graph_owned(0xa000));
}

TEST_CASE("a failed capture takes its allocation nodes with it") {
  CaptureModel m;
  m.on_begin(kS1, 7, CaptureMode::Global, ev(1, 7), 0);
  m.on_alloc_node(0, 1, 0xa000, 4096, 0, ev(2, 7));
  m.on_end(kS1);
  m.on_capture_ended(1, 0);
  CHECK_FALSE(m.graph_owned(0xa000));
}

TEST_CASE("a free node in another graph ends the allocation's lifetime at that graph's launch") {
  CaptureModel m;
  m.on_alloc_node(0x6000, 0, 0xa000, 4096, 0, ev(1));
  m.on_free_node(0x7000, 0, 0xa000);
  m.on_instantiate(0xe000, 0x6000);
  m.on_instantiate(0xf000, 0x7000);
  CHECK(m.on_launch(0xe000).allocated.size() == 1);
  LaunchEffect l = m.on_launch(0xf000);
  REQUIRE(l.freed.size() == 1);
  CHECK(l.freed[0].ptr == 0xa000);
  CHECK_FALSE(m.graph_owned(0xa000)->live);
}

TEST_CASE("fork: the child has no captures and no graphs") {
  CaptureModel m;
  m.on_begin(kS1, 7, CaptureMode::Global, ev(1, 7), 0);
  m.on_alloc_node(0x6000, 0, 0xa000, 4096, 0, ev(2));
  m.fork_prepare();
  m.fork_child();
  CHECK_FALSE(m.any_open());
  CHECK_FALSE(m.graph_owned(0xa000));
}

TEST_CASE("many threads begin, ask and end at once") {
  CaptureModel m;
  std::vector<std::thread> ts;
  // Catch2's assertions are not thread-safe: the threads count what went wrong, checked after.
  std::atomic<int> not_own{0}, not_ended{0}, other_prohibited{0};
  for (std::uint32_t t = 1; t <= 8; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) {
        const StreamKey s{0x1000u * t, 0};
        m.on_begin(s, t, CaptureMode::ThreadLocal, ev(i + 1, t), 0);
        if (!m.check_unsafe(t, CaptureMode::Global).own) ++not_own;
        // Thread-local captures of other threads never prohibit a thread without its own.
        if (m.check_unsafe(100 + t, CaptureMode::Global).prohibited) ++other_prohibited;
        m.on_alloc_node(0, m.capture_of_thread(t), (std::uint64_t{t} << 32) + i, 64, 0, ev(1, t));
        auto c = m.on_end(s);
        if (!c) {
          ++not_ended;
          continue;
        }
        m.on_capture_ended(c->id, 0);
      }
    });
  for (auto &t : ts) t.join();
  CHECK(not_own == 0);
  CHECK(other_prohibited == 0);
  CHECK(not_ended == 0);
  CHECK_FALSE(m.any_open());
  for (std::uint32_t t = 1; t <= 8; ++t) CHECK_FALSE(m.graph_owned((std::uint64_t{t} << 32) + 5));
}

TEST_CASE("the findings' texts name the capture, its stream, mode, thread and begin") {
  CaptureModel m;
  const CaptureRec c = m.on_begin(kS1, 7, CaptureMode::Global, ev(3, 7), 0);
  const UnsafeVerdict v = m.check_unsafe(8, CaptureMode::Global);
  Finding f = capture_unsafe_finding(v, "cudaFree", "a synchronous free", 8, CaptureMode::Global,
                                     0xabc000, 4096);
  CHECK(f.cls == FindingClass::CaptureUnsafe);
  CHECK(f.msg.find("capture 1 of stream 0x1000 (global mode), begun at seq 3") !=
        std::string::npos);
  CHECK(f.msg.find("on another thread") != std::string::npos);
  REQUIRE(f.related.size() == 1);
  CHECK(f.related[0].what == "capture begin");
  CHECK(f.related[0].ev.stack == 30);
  CHECK(f.state_json.find("\"capture_tid\":7") != std::string::npos);

  CaptureRec failed = c;
  failed.invalidated_by = ev(5, 8, "cudaFree");
  LinearRec r{0xd000, 8192, 0, MemKind::Linear, ev(4, 7, "cudaMalloc")};
  r.capture = 1;
  Finding g = capture_failed_finding(failed, "cudaStreamEndCapture", 901,
                                     "cudaErrorStreamCaptureInvalidated", {r});
  CHECK(g.cls == FindingClass::CaptureFailed);
  CHECK(g.msg.find("returned 901 (cudaErrorStreamCaptureInvalidated)") != std::string::npos);
  CHECK(g.msg.find("invalidated at seq 5") != std::string::npos);
  CHECK(g.msg.find("1 allocation made for it (8192 bytes) are still live: 0xd000") !=
        std::string::npos);
  CHECK(g.related.size() == 3);
  CHECK(g.bytes == 8192);

  LinearRec a{0xe000, 4096, 0, MemKind::Async, ev(6, 7, "cudaMallocAsync")};
  a.stream = 0x2000;
  Finding k = free_kind_mismatch_finding(a, "cudaFree", true, 0);
  CHECK(k.cls == FindingClass::FreeKindMismatch);
  CHECK(k.msg.find("allocated on stream 0x2000") != std::string::npos);
  CHECK(k.state_json.find("sync-free-of-stream-ordered") != std::string::npos);
}

TEST_CASE("the new classes: capture-unsafe and capture-failed stand only when the driver refuses") {
  Options o;
  Decision d = decide(o, FindingClass::CaptureUnsafe, false);
  CHECK_FALSE(d.skip);
  CHECK(d.if_refused);
  CHECK_FALSE(d.stands(true));
  CHECK(d.stands(false));
  d = decide(o, FindingClass::CaptureFailed, false);
  CHECK(d.if_refused);
  d = decide(o, FindingClass::FreeKindMismatch, false);
  CHECK_FALSE(d.if_refused);
  CHECK(d.action == Action::Forward);
}

TEST_CASE("the exit visit of graph allocations gives up at once on a lock this thread holds") {
  // A SIGTERM handler that calls exit() can interrupt this thread inside the capture model; the
  // summary's visit must return at once, not wait out its patience and make every later exit
  // path try only once (lock_within.h).
  exit_wait_reset();
  CaptureModel m;
  m.fork_prepare();  // takes the model's lock on this thread, as an interrupted hook would hold it
  int visited = 0;
  CHECK_FALSE(m.for_each_live_within([&](const GraphAlloc &) { ++visited; }, 1'000'000));
  CHECK(visited == 0);
  CHECK_FALSE(exit_wait_gave_up());
  m.fork_parent();
  CHECK(m.for_each_live_within([&](const GraphAlloc &) { ++visited; }, 1'000'000));
  exit_wait_reset();
}
