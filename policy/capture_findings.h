// SPDX-License-Identifier: Apache-2.0
// The findings of stream capture and stream-ordered memory, phrased from what the models hold:
// capture-unsafe, capture-failed, free-kind-mismatch, and a refused free of a graph allocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "capture_model.h"
#include "linear_model.h"

namespace cmg {

// A potentially unsafe call (`what`: "a synchronous allocation" or "a synchronous free") of thread
// tid in interaction mode `thread_mode` that the open capture v.capture prohibits.
Finding capture_unsafe_finding(const UnsafeVerdict &v, const char *api, const char *what,
                               std::uint32_t tid, CaptureMode thread_mode, std::uint64_t ptr,
                               std::uint64_t size);

// The end of capture c that the driver refused with status `res` (its name: `res_name`), with the
// allocations made for the capture and still live.
Finding capture_failed_finding(const CaptureRec &c, const char *api, int res, const char *res_name,
                               const std::vector<LinearRec> &still_live);

// A synchronous free of stream-ordered memory whose stream still had work queued (`sync_of_async`),
// or a stream-ordered free on stream `free_stream` of memory a synchronous call allocated while the
// legacy default stream still had work queued.
Finding free_kind_mismatch_finding(const LinearRec &rec, const char *api, bool sync_of_async,
                                   std::uint64_t free_stream);

// A free of a graph allocation that the driver refused: the allocation was not live (no launch of
// its graph allocated it since it was last freed). A double free, named as the graph's.
Finding graph_free_refused_finding(const GraphAlloc &a, const char *api);

}  // namespace cmg
