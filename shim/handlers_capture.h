// SPDX-License-Identifier: Apache-2.0
// Stream capture and graphs in the hooks: the capture and graph calls themselves, and the pieces
// the memory handlers (handlers.h) ask while a capture is open or a graph owns an address. The
// model and the findings are in policy/capture_model.h and capture_findings.h; the decisions the
// shim's own work takes against open captures (hold or forward a free, release held frees on an
// out-of-memory answer, the busy check) are CaptureModel::own_work.
#pragma once

#include <cstdint>

#include "capture_model.h"
#include "decide.h"
#include "state.h"

namespace cmg::shim {

// The calling thread's stream capture interaction mode, as the program last set it
// (cuThreadExchangeStreamCaptureMode, cudaThreadExchangeStreamCaptureMode).
CMG_HOT_TLS inline CaptureMode t_capture_mode = CaptureMode::Global;

inline bool capture_open(const State &s) {
  return s.capture.any_open();
}
inline bool capture_open() {
  return capture_open(state());
}

// The model's name of a stream handle: `per_thread_variant` (a _ptsz export) reads a null handle
// as the calling thread's per-thread default stream.
StreamKey stream_key(std::uint64_t stream, bool per_thread_variant);

// ---- the memory handlers' questions
// --------------------------------------------------------------

// A synchronous allocation or free the driver is about to be asked for while a capture is open:
// whether an open capture prohibits it (capture-unsafe). The hooks keep only the answer (a bool:
// this is on every synchronous allocation and free while a capture is open).
bool unsafe_before(const Call &c);
// After the driver answered `res`: reports the finding when it stands (the driver refused as the
// rule says) and notes the captures the call invalidated. The verdict is asked again: the refused
// call changed nothing the rule reads.
void unsafe_after(const Call &c, int res, std::uint64_t ptr, std::uint64_t size, const Args &args);

// An allocation the driver made on the calling thread while a capture is open there: the capture
// it was made for (0: none), counted for it.
std::uint32_t capture_for_alloc(std::uint64_t size);

// A stream-ordered allocation: when `stream` is capturing, the driver made an allocation node, not
// memory. Records the graph allocation and writes the call record; false when not captured.
bool captured_alloc(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t ptr, std::uint64_t size,
                    Args &args);
// A stream-ordered free on a capturing stream becomes a free node. `forward` makes the call and
// returns its status; false when the stream is not capturing (the caller goes on as usual).
bool captured_free(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t ptr, Args &args,
                   int (*forward)(void *), void *arg, int &res);

// A free of a graph allocation outside any graph: true when a graph owns ptr; then `forward` was
// called, the model and the counters follow its answer and the call record is written.
bool graph_owned_free(Call &c, std::uint64_t ptr, Args &args, int (*forward)(void *), void *arg,
                      int &res);

// free-kind-mismatch: a synchronous free (`sync_api`) of stream-ordered memory whose stream still
// has work queued, or a stream-ordered free of synchronously allocated memory while the legacy
// default stream has work queued. Asked before the driver frees (afterwards it means nothing);
// strict mode aborts there. The finding is reported after the driver answered (kind_mismatch_after).
bool kind_mismatch_before(const Call &c, bool sync_api, const LinearRec &rec,
                          std::uint64_t free_stream, const Args &args);
void kind_mismatch_after(const Call &c, bool sync_api, const LinearRec &rec,
                         std::uint64_t free_stream, int res, const Args &args);

// The shim's own work against open captures (CaptureModel::own_work): whether frees may be held
// now (while a capture is open they are forwarded, so nothing is held that would have to be
// released inside it), and whether the held frees may be released on an out-of-memory answer (if
// not, that waits for the end of the captures and a note says so once per capture).
bool may_hold_frees();
bool may_release_held(const char *api);
// The busy check's query or synchronisation would be refused and invalidate the capture.
bool may_check_busy();

// ---- the capture and graph calls
// -----------------------------------------------------------------

// Before the driver begins a capture: the frees the shim holds go back to the driver now, while
// no capture is open, so that the capture never meets an out-of-memory answer the program would
// not have met (nothing is held while it is open).
std::uint64_t capture_before_begin(Call &c);  // bytes released
void capture_after_begin(Call &c, std::uint64_t stream, bool ptsz, int mode, int res,
                         std::uint64_t released);
void capture_after_end(Call &c, std::uint64_t stream, bool ptsz, std::uint64_t graph, int res);
void capture_after_exchange(Call &c, int asked, int previous, int res);
void graph_after_instantiate(Call &c, std::uint64_t exec, std::uint64_t graph, int res);
void graph_after_launch(Call &c, std::uint64_t exec, std::uint64_t stream, bool ptsz, int res);
void graph_after_exec_destroy(Call &c, std::uint64_t exec, int res);
void graph_after_destroy(Call &c, std::uint64_t graph, int res);
void graph_after_alloc_node(Call &c, std::uint64_t graph, std::uint64_t ptr, std::uint64_t size,
                            int dev, int res);
void graph_after_free_node(Call &c, std::uint64_t graph, std::uint64_t ptr, int res);
void graph_after_mem_trim(Call &c, int dev, int res);

// One hook body for each kind of call: Call, forward, tell the model, return the real status.
template <class R, class Real>
R capture_begin(Api api, std::uint64_t stream, bool ptsz, int mode, Real &&real) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  const std::uint64_t released = capture_before_begin(c);
  const R r = real();
  capture_after_begin(c, stream, ptsz, mode, static_cast<int>(r), released);
  return r;
}

template <class R, class Real, class Graph>
R capture_end(Api api, std::uint64_t stream, bool ptsz, Real &&real, Graph &&graph) {
  Call c(api, StackWhen::Always);
  if (!c.tracked()) return real();
  const R r = real();
  capture_after_end(c, stream, ptsz, r == R(0) ? graph() : 0, static_cast<int>(r));
  return r;
}

// A graph call whose record and model update happen after the driver answered: `after(c, res)`.
template <class R, class Real, class After>
R graph_call(Api api, StackWhen stack, Real &&real, After &&after) {
  Call c(api, stack);
  if (!c.tracked()) return real();
  const R r = real();
  after(c, static_cast<int>(r));
  return r;
}

}  // namespace cmg::shim
