// SPDX-License-Identifier: Apache-2.0
// Stream capture and graphs in the hooks: see handlers_capture.h. The shim's own calls to the
// driver here are its queries of a stream (cuStreamGetCaptureInfo, cuStreamQuery), made through
// the driver's own exports so that they are never recorded as the program's.
#include "handlers_capture.h"

#include <atomic>
#include <string>
#include <vector>

#include "capture_findings.h"
#include "errors.h"
#include "held.h"
#include "loader.h"
#include "stacks.h"

namespace cmg::shim {
namespace {

// cudaErrorStreamCaptureUnsupported and CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: the answer to a call
// an open capture prohibits (real-driver.md C2-C6).
constexpr int kCaptureUnsupported = 900;
static_assert(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED == kCaptureUnsupported &&
              cudaErrorStreamCaptureUnsupported == kCaptureUnsupported);

std::uint64_t handle_of(CUstream s) {
  return reinterpret_cast<std::uintptr_t>(s);
}

CUstream stream_of(std::uint64_t s, bool ptsz) {
  // The shim asks through the legacy-stream exports: a null handle of a _ptsz call is named
  // explicitly as the per-thread default stream.
  if (s == 0 && ptsz) return CU_STREAM_PER_THREAD;
  return reinterpret_cast<CUstream>(static_cast<std::uintptr_t>(s));
}

struct StreamCapture {
  bool capturing = false;
  std::uint64_t id = 0;
};

// The driver's view of a stream (cuda.h: cuStreamGetCaptureInfo). Asked only while the model has
// a capture open; a query of the legacy stream while a blocking stream captures is refused
// without invalidating anything (real-driver.md C9), and counts as "not capturing".
StreamCapture driver_capture(std::uint64_t stream, bool ptsz) {
  static std::atomic<void *> slot{nullptr};
  StreamCapture out;
  auto f = driver_fn<PFN_cuStreamGetCaptureInfo_v10010>(slot, "cuStreamGetCaptureInfo");
  if (!f) return out;
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (f(stream_of(stream, ptsz), &st, &id) != CUDA_SUCCESS) return out;
  out.capturing = st != CU_STREAM_CAPTURE_STATUS_NONE;
  out.id = id;
  return out;
}

// The open capture a stream-ordered call on `stream` is captured into, when it is.
std::optional<CaptureRec> capture_of(std::uint64_t stream, bool ptsz) {
  if (!capture_open()) return std::nullopt;
  const StreamCapture d = driver_capture(stream, ptsz);
  if (!d.capturing) return std::nullopt;
  if (auto c = state().capture.capture_of_stream(stream_key(stream, ptsz), d.id)) return c;
  // Capturing by the driver's word, into a capture the shim did not see begin.
  CaptureRec unknown;
  unknown.driver_id = d.id;
  return unknown;
}

bool is_free_api(Api a) {
  return a == Api::cudaFree || a == Api::cuMemFree_v2 || a == Api::cudaFreeHost ||
         a == Api::cuMemFreeHost;
}

std::string stream_text(const CaptureRec &c) {
  return hex(c.stream.handle) + " (capture " + std::to_string(c.id) + ", " +
         std::string(capture_mode_name(c.mode)) + " mode, begun at " + at_seq(c.begin) + ")";
}

// Once per capture, the note that the shim's own work waits for it.
std::atomic<std::uint32_t> g_noted_oom{0}, g_noted_busy{0}, g_noted_hold{0};
bool first_for(std::atomic<std::uint32_t> &noted, std::uint32_t capture) {
  std::uint32_t prev = noted.load(std::memory_order_relaxed);
  while (prev < capture)
    if (noted.compare_exchange_weak(prev, capture)) return true;
  return false;
}

// Held frees whose release had to wait for the end of the open captures.
std::atomic<bool> g_release_pending{false};

void release_pending_after_captures() {
  if (!g_release_pending.exchange(false)) return;
  const std::uint64_t n = held().release_all();
  if (n)
    note(LogLevel::Info, "the last stream capture ended: released " + std::to_string(n) +
                             " bytes of frees held back while it was open");
}

}  // namespace

StreamKey stream_key(std::uint64_t stream, bool per_thread_variant) {
  const auto pt = handle_of(CU_STREAM_PER_THREAD);
  if (stream == pt || (stream == 0 && per_thread_variant)) return StreamKey{pt, thread_id()};
  return StreamKey{stream, 0};
}

// ---- the memory handlers' questions ---------------------------------------------------------

bool unsafe_before(const Call &c) {
  if (!c.tracked() || !capture_open()) return false;
  // capture-unsafe stands only when the driver refuses: nothing is decided before the call.
  return state().capture.check_unsafe(thread_id(), t_capture_mode).prohibited;
}

void unsafe_after(const Call &c, int res, std::uint64_t ptr, std::uint64_t size,
                  const Args &args) {
  // The finding stands only when the driver refused the call as the rule says it does: any other
  // answer means the model missed something (a capture that ended by a route the shim does not
  // see), and it keeps quiet.
  if (res != kCaptureUnsupported) return;
  State &s = state();
  const UnsafeVerdict v = s.capture.check_unsafe(thread_id(), t_capture_mode);
  if (!v.prohibited) return;
  s.capture.note_invalidated(thread_id(), t_capture_mode, c.ev());
  const Decision d = decide(s.opts, FindingClass::CaptureUnsafe, false);
  const char *what = is_free_api(c.api()) ? "a synchronous free" : "a synchronous allocation";
  report_finding(
      c, capture_unsafe_finding(v, api_name(c.api()), what, thread_id(), t_capture_mode, ptr, size),
      d.action, res, args);
}

std::uint32_t capture_for_alloc(std::uint64_t size) {
  CaptureModel &m = state().capture;
  const std::uint32_t id = m.capture_of_thread(thread_id());
  if (id) m.note_alloc(id, size);
  return id;
}

bool captured_alloc(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t ptr, std::uint64_t size,
                    Args &args) {
  const auto cap = capture_of(stream, ptsz);
  if (!cap) return false;
  const int dev = current_device();
  // Into a capture the shim saw begin: the graph's allocation from now on. Otherwise the address
  // is still a graph's: it is not recorded as memory the program holds.
  if (cap->id) state().capture.on_alloc_node(0, cap->id, ptr, size, dev, c.ev());
  args.u("capture", cap->id).u("graph_alloc", 1);
  Call::Extra x;
  x.dev = dev;
  x.mem = MemKind::Graph;
  c.log(0, args, x);
  return true;
}

bool captured_free(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t ptr, Args &args,
                   int (*forward)(void *), void *arg, int &res) {
  const auto cap = capture_of(stream, ptsz);
  if (!cap) return false;
  CaptureModel &m = state().capture;
  res = forward(arg);
  if (res == 0) {
    if (cap->id) m.on_free_node(0, cap->id, ptr);
    args.u("free_node", 1);
  } else if (cap->id) {
    // cuda.h, cuMemFreeAsync: a captured free must name a graph allocation; the driver refuses
    // any other and invalidates the capture (real-driver.md C14).
    m.note_invalidated(cap->id, c.ev());
  }
  args.u("capture", cap->id);
  c.log(res, args);
  return true;
}

bool graph_owned_free(Call &c, std::uint64_t ptr, Args &args, int (*forward)(void *), void *arg,
                      int &res) {
  State &s = state();
  const auto g = s.capture.graph_owned(ptr);
  if (!g) return false;
  args.u("size", g->size).u("graph_alloc", 1);
  res = forward(arg);
  if (res != 0) {
    // Refused: no launch allocated it since it was last freed (or its own graph frees it).
    const Decision d = decide(s.opts, FindingClass::DoubleFree, false, /*if_refused=*/true);
    if (d.stands(false))
      report_finding(c, graph_free_refused_finding(*g, api_name(c.api())), d.action, res, args);
    c.log(res, args);
    return true;
  }
  Call::Extra x;
  const auto before = s.capture.on_free_outside(ptr);
  if (before && before->live) {
    const auto delta = -static_cast<std::int64_t>(before->size);
    s.counters.add(before->dev, MemKind::Graph, delta);
    x.dev = before->dev;
    x.mem = MemKind::Graph;
    x.delta = delta;
  }
  c.log(0, args, x);
  return true;
}

bool kind_mismatch_before(const Call &c, bool sync_api, const LinearRec &rec,
                          std::uint64_t free_stream, const Args &args) {
  const bool mismatch = sync_api ? rec.kind == MemKind::Async
                                 : rec.kind == MemKind::Linear || rec.kind == MemKind::Managed;
  if (!mismatch || !may_check_busy()) return false;
  static std::atomic<void *> slot{nullptr};
  auto query = driver_fn<PFN_cuStreamQuery_v2000>(slot, "cuStreamQuery");
  if (!query) return false;
  // A synchronous free of stream-ordered memory: is its stream still working? A stream-ordered
  // free of other memory: is the legacy default stream still working (the stream of programs
  // that name none; work on other streams is not seen, as in the busy check: busy.h)? One query
  // that never waits, only on this path.
  const CUstream which = sync_api ? stream_of(rec.stream, false) : CU_STREAM_LEGACY;
  if (query(which) != CUDA_ERROR_NOT_READY) return false;
  const Decision d = decide(state().opts, FindingClass::FreeKindMismatch, false);
  if (d.abort_first)
    report_finding(c, free_kind_mismatch_finding(rec, api_name(c.api()), sync_api, free_stream),
                   d.action, -1, args);
  return true;
}

void kind_mismatch_after(const Call &c, bool sync_api, const LinearRec &rec,
                         std::uint64_t free_stream, int res, const Args &args) {
  const Decision d = decide(state().opts, FindingClass::FreeKindMismatch, false);
  report_finding(c, free_kind_mismatch_finding(rec, api_name(c.api()), sync_api, free_stream),
                 d.action, res, args);
}

bool may_hold_frees() {
  const OwnWork w = state().capture.own_work();
  if (w.now) return true;
  if (first_for(g_noted_hold, w.waits_for.id))
    note(LogLevel::Info, "frees go to the driver at once while stream capture " +
                             std::to_string(w.waits_for.id) + " of stream " +
                             stream_text(w.waits_for) +
                             " is open: the shim holds nothing back that it would have to give "
                             "back inside a capture");
  return false;
}

bool may_release_held(const char *api) {
  const OwnWork w = state().capture.own_work();
  if (w.now) return true;
  g_release_pending.store(true);
  if (first_for(g_noted_oom, w.waits_for.id)) {
    const std::uint64_t bytes =
        held().bytes(HoldReason::Quarantine) + held().bytes(HoldReason::Deferred);
    note(
        LogLevel::Warn,
        std::string(api ? api : "an allocation") + " ran out of memory while stream capture " +
            std::to_string(w.waits_for.id) + " of stream " + stream_text(w.waits_for) +
            " on thread " + std::to_string(w.waits_for.tid) + " is open: the " +
            std::to_string(bytes) +
            " bytes of frees the shim holds back are not released to "
            "retry it (a free inside the capture would invalidate it, and its cudaStreamEndCapture "
            "would fail with cudaErrorStreamCaptureInvalidated); they are released when the last "
            "capture ends");
  }
  return false;
}

bool may_check_busy() {
  const OwnWork w = state().capture.own_work();
  if (w.now) return true;
  if (first_for(g_noted_busy, w.waits_for.id))
    note(LogLevel::Info, "the busy check is skipped while stream capture " +
                             std::to_string(w.waits_for.id) + " of stream " +
                             stream_text(w.waits_for) +
                             " is open: querying or synchronizing the device's streams would "
                             "invalidate it (real-driver.md C10, C17)");
  return false;
}

// ---- the capture and graph calls --------------------------------------------------------------

std::uint64_t capture_before_begin(Call &) {
  if (held().empty() || !state().capture.own_work().now) return 0;
  return held().release_all();
}

void capture_after_begin(Call &c, std::uint64_t stream, bool ptsz, int mode, int res,
                         std::uint64_t released) {
  State &s = state();
  const CaptureMode m = capture_mode_from(mode).value_or(CaptureMode::Global);
  Args args;
  args.hex("stream", stream).s("mode", capture_mode_name(m).data());
  if (released) args.u("released_held", released);
  if (res != 0) {
    c.log(res, args);
    return;
  }
  // Every finding about this capture names where it began: its stack is taken even with stacks
  // off (captures are begun a few dozen times per process).
  if (s.log.is_open() && !c.ev().stack) c.set_stack(capture_stack(kFindingFrames));
  const StreamCapture d = driver_capture(stream, ptsz);
  const CaptureRec r = s.capture.on_begin(stream_key(stream, ptsz), thread_id(), m, c.ev(), d.id);
  args.u("capture", r.id);
  c.log(0, args);
}

void capture_after_end(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t graph, int res) {
  State &s = state();
  Args args;
  args.hex("stream", stream);
  const auto rec = s.capture.on_end(stream_key(stream, ptsz));
  if (rec) {
    args.u("capture", rec->id).u("allocs", rec->allocs).u("graph_allocs", rec->graph_allocs);
    s.capture.on_capture_ended(rec->id, res == 0 ? graph : 0);
  }
  if (res == 0) args.hex("graph", graph);
  if (res != 0 && rec) {
    std::vector<LinearRec> live;
    s.linear.for_each_live([&](const LinearRec &r) {
      if (r.capture == rec->id) live.push_back(r);
    });
    const Decision d = decide(s.opts, FindingClass::CaptureFailed, false);
    if (d.stands(false))
      report_finding(c,
                     capture_failed_finding(
                         *rec, api_name(c.api()), res,
                         status_name(kApis[static_cast<std::size_t>(c.api())].family, res), live),
                     d.action, res, args);
  }
  c.log(res, args);
  if (!s.capture.any_open()) release_pending_after_captures();
}

void capture_after_exchange(Call &c, int asked, int previous, int res) {
  Args args;
  if (const auto m = capture_mode_from(asked)) args.s("mode", capture_mode_name(*m).data());
  if (res == 0) {
    if (const auto m = capture_mode_from(asked)) t_capture_mode = *m;
    if (const auto p = capture_mode_from(previous))
      args.s("previous", capture_mode_name(*p).data());
  }
  c.log(res, args);
}

void graph_after_instantiate(Call &c, std::uint64_t exec, std::uint64_t graph, int res) {
  Args args;
  args.hex("graph", graph);
  if (res == 0) {
    state().capture.on_instantiate(exec, graph);
    args.hex("exec", exec);
  }
  c.log(res, args);
}

void graph_after_launch(Call &c, std::uint64_t exec, std::uint64_t stream, bool ptsz, int res) {
  State &s = state();
  Args args;
  args.hex("exec", exec).hex("stream", stream);
  Call::Extra x;
  // A launch into a capturing stream is a node of that capture: it allocates nothing now.
  if (res == 0 && !capture_of(stream, ptsz)) {
    const LaunchEffect e = s.capture.on_launch(exec);
    for (const GraphAlloc &a : e.allocated) {
      s.counters.add(a.dev, MemKind::Graph, static_cast<std::int64_t>(a.size));
      x.dev = a.dev;
      x.delta += static_cast<std::int64_t>(a.size);
    }
    for (const GraphAlloc &a : e.freed) {
      s.counters.add(a.dev, MemKind::Graph, -static_cast<std::int64_t>(a.size));
      x.dev = a.dev;
      x.delta -= static_cast<std::int64_t>(a.size);
    }
    if (!e.allocated.empty() || !e.freed.empty()) x.mem = MemKind::Graph;
  }
  c.log(res, args, x);
}

void graph_after_exec_destroy(Call &c, std::uint64_t exec, int res) {
  Args args;
  args.hex("exec", exec);
  if (res == 0) state().capture.on_exec_destroy(exec);
  c.log(res, args);
}

void graph_after_destroy(Call &c, std::uint64_t graph, int res) {
  Args args;
  args.hex("graph", graph);
  if (res == 0) state().capture.on_graph_destroy(graph);
  c.log(res, args);
}

void graph_after_alloc_node(Call &c, std::uint64_t graph, std::uint64_t ptr, std::uint64_t size,
                            int dev, int res) {
  Args args;
  args.hex("graph", graph).u("size", size);
  if (res == 0) {
    state().capture.on_alloc_node(graph, 0, ptr, size, dev, c.ev());
    args.hex("ptr", ptr);
  }
  Call::Extra x;
  x.dev = dev;
  x.mem = MemKind::Graph;
  c.log(res, args, x);
}

void graph_after_free_node(Call &c, std::uint64_t graph, std::uint64_t ptr, int res) {
  Args args;
  args.hex("graph", graph).hex("ptr", ptr);
  if (res == 0) state().capture.on_free_node(graph, 0, ptr);
  c.log(res, args);
}

void graph_after_mem_trim(Call &c, int dev, int res) {
  Args args;
  args.i("dev", dev);
  c.log(res, args);
}

}  // namespace cmg::shim
