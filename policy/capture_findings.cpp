// SPDX-License-Identifier: Apache-2.0
// Capture and stream-ordered memory findings: see capture_findings.h.
#include "capture_findings.h"

#include "text.h"

namespace cmg {
namespace {

std::string stream_text(const StreamKey &s) {
  std::string out = hex(s.handle);
  if (s.tid) out += " (the per-thread default stream of thread " + std::to_string(s.tid) + ")";
  return out;
}

std::string capture_state(const CaptureRec &c) {
  return "\"capture\":" + std::to_string(c.id) + ",\"stream\":\"" + hex(c.stream.handle) +
         "\",\"mode\":\"" + std::string(capture_mode_name(c.mode)) +
         "\",\"capture_tid\":" + std::to_string(c.tid) +
         ",\"begin_seq\":" + std::to_string(c.begin.seq);
}

}  // namespace

Finding capture_unsafe_finding(const UnsafeVerdict &v, const char *api, const char *what,
                               std::uint32_t tid, CaptureMode thread_mode, std::uint64_t ptr,
                               std::uint64_t size) {
  const CaptureRec &c = v.capture;
  Finding f;
  f.cls = FindingClass::CaptureUnsafe;
  const std::string a = api ? api : "the call";
  f.msg = a + (ptr ? " of " + hex(ptr) : std::string()) + " is " + what +
          " during an open stream capture: capture " + std::to_string(c.id) + " of stream " +
          stream_text(c.stream) + " (" + std::string(capture_mode_name(c.mode)) +
          " mode), begun at " + at_seq(c.begin) +
          (v.own ? " on this thread" : " on another thread") +
          ", prohibits it while this thread is in " + std::string(capture_mode_name(thread_mode)) +
          " mode; the driver refuses the call and invalidates the capture, whose end then fails " +
          "(cudaErrorStreamCaptureInvalidated)" +
          (v.count > 1 ? " (" + std::to_string(v.count) + " open captures prohibit it)" : "") +
          ". Make the call before the capture begins or after it ends, use the stream-ordered "
          "call on the capturing stream, or call it from a thread in relaxed mode "
          "(cudaThreadExchangeStreamCaptureMode)";
  f.related.push_back({"capture begin", c.begin});
  f.state_json = "{" + capture_state(c) + ",\"tid\":" + std::to_string(tid) +
                 ",\"thread_mode\":\"" + std::string(capture_mode_name(thread_mode)) +
                 "\",\"own_thread\":" + (v.own ? "true" : "false") +
                 ",\"captures\":" + std::to_string(v.count) + "}";
  f.bytes = size;
  return f;
}

Finding capture_failed_finding(const CaptureRec &c, const char *api, int res, const char *res_name,
                               const std::vector<LinearRec> &still_live) {
  Finding f;
  f.cls = FindingClass::CaptureFailed;
  std::uint64_t bytes = 0;
  for (const LinearRec &r : still_live) bytes += r.size;
  f.msg = std::string(api ? api : "the end of capture") + " of stream " + stream_text(c.stream) +
          " returned " + std::to_string(res) +
          (res_name ? std::string(" (") + res_name + ")" : "") + ": capture " +
          std::to_string(c.id) + " (" + std::string(capture_mode_name(c.mode)) +
          " mode), begun at " + at_seq(c.begin) + ", gave no graph";
  if (c.invalidated_by.known())
    f.msg += "; it was invalidated at " + at_seq(c.invalidated_by) +
             ", a call the driver refused while it was open";
  if (!still_live.empty()) {
    f.msg += "; " + std::to_string(still_live.size()) + " allocation" +
             (still_live.size() == 1 ? "" : "s") + " made for it (" + std::to_string(bytes) +
             " bytes) are still live:";
    std::size_t shown = 0;
    for (const LinearRec &r : still_live) {
      if (shown++ == 4) {
        f.msg += " ...";
        break;
      }
      f.msg += std::string(shown > 1 ? "," : "") + " " + hex(r.ptr) + " (" +
               std::to_string(r.size) + " bytes, " + at_seq(r.alloc) + ")";
    }
    f.msg +=
        ". They are the graph's memory (PyTorch's private pool keeps it cached): free them "
        "or capture again";
  }
  f.related.push_back({"capture begin", c.begin});
  if (c.invalidated_by.known()) f.related.push_back({"invalidated by", c.invalidated_by});
  for (std::size_t i = 0; i < still_live.size() && i < 8; ++i)
    f.related.push_back({"allocation", still_live[i].alloc});
  f.state_json = "{" + capture_state(c) + ",\"res\":" + std::to_string(res) +
                 ",\"live_allocs\":" + std::to_string(still_live.size()) +
                 ",\"live_bytes\":" + std::to_string(bytes) +
                 ",\"graph_allocs\":" + std::to_string(c.graph_allocs) + "}";
  f.bytes = bytes;
  return f;
}

Finding free_kind_mismatch_finding(const LinearRec &rec, const char *api, bool sync_of_async,
                                   std::uint64_t free_stream) {
  Finding f;
  f.cls = FindingClass::FreeKindMismatch;
  const std::string a = api ? api : "the free";
  const std::string made = rec.alloc.api ? rec.alloc.api : "an earlier call";
  if (sync_of_async) {
    // cuda.h, cuMemFree/cudaFree: no implicit synchronisation for stream-ordered memory.
    f.msg = a + " of " + hex(rec.ptr) + ", which " + made + " allocated on stream " +
            hex(rec.stream) + " at " + at_seq(rec.alloc) +
            ", while that stream still has work "
            "queued: a synchronous free does not wait for stream-ordered memory (cuda.h: \"will "
            "not perform any implicit synchronization\"), so work still using it can read freed "
            "memory. Free it with the stream-ordered free on that stream, or synchronize the "
            "stream first";
  } else {
    f.msg = a + " on stream " + hex(free_stream) + " of " + hex(rec.ptr) + ", which " + made +
            " allocated at " + at_seq(rec.alloc) +
            ", while the legacy default stream still has work queued: "
            "the free is ordered only after the work of stream " +
            hex(free_stream) +
            ", where a synchronous free would have waited for all of it, so work on another "
            "stream still using it can read freed memory. Free it with the synchronous free, or "
            "order the other streams' work before the free";
  }
  f.related.push_back({"allocation", rec.alloc});
  f.state_json = "{\"ptr\":\"" + hex(rec.ptr) + "\",\"alloc_stream\":\"" + hex(rec.stream) +
                 "\",\"free_stream\":\"" + hex(free_stream) + "\",\"direction\":\"" +
                 (sync_of_async ? "sync-free-of-stream-ordered" : "stream-ordered-free-of-sync") +
                 "\"}";
  f.bytes = rec.size;
  return f;
}

Finding graph_free_refused_finding(const GraphAlloc &a, const char *api) {
  Finding f;
  f.cls = FindingClass::DoubleFree;
  f.msg =
      std::string(api ? api : "the free") + " of " + hex(a.ptr) + ", a graph allocation (" +
      std::to_string(a.size) + " bytes, allocation node made at " + at_seq(a.node) +
      (a.graph ? ", graph " + hex(a.graph) : std::string()) +
      ") that no launch allocated since it was last freed" +
      (a.freed_in_graph ? " (its own graph frees it; it cannot be freed outside the graph)" : "");
  f.related.push_back({"allocation node", a.node});
  f.state_json = "{\"graph\":\"" + hex(a.graph) + "\",\"capture\":" + std::to_string(a.capture) +
                 ",\"freed_in_graph\":" + (a.freed_in_graph ? "true" : "false") + "}";
  f.bytes = a.size;
  return f;
}

}  // namespace cmg
