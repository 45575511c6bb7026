// SPDX-License-Identifier: Apache-2.0
// Stream capture and graph memory in the model: which captures are open (per thread, with their
// stream, mode and where they began), which calls they prohibit, and which device addresses CUDA
// graphs own. Pure C++, thread-safe; the shim tells it what the driver did and asks it questions.
//
//  * The prohibition rule is NVIDIA's (cuda.h 13.0, cuThreadExchangeStreamCaptureMode): a thread in
//    global or thread-local interaction mode may not make a potentially unsafe call (an allocation
//    or free that is not stream-ordered) while it has a capture open that was not begun relaxed; in
//    global mode also not while another thread has a global-mode capture open. The driver then
//    refuses the call and invalidates those captures (docs/reference/real-driver.md C2-C7).
//  * Graph allocations (allocation nodes: a captured cudaMallocAsync, cudaGraphAddMemAllocNode) get
//    their address when the node is made and their memory at each launch; a launch allocates again
//    without any call the shim sees, so a later free of such an address is no double free
//    (cuda.h, cuGraphAddMemAllocNode; real-driver.md C11, C12).
//  * Questions on the call path cost one atomic load while no capture is open and no graph
//    allocation is known.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "event.h"
#include "lock_within.h"

namespace cmg {

// The values of CUstreamCaptureMode and cudaStreamCaptureMode (the same numbers).
enum class CaptureMode : std::uint8_t { Global = 0, ThreadLocal = 1, Relaxed = 2 };
std::string_view capture_mode_name(CaptureMode m);  // "global", "thread-local", "relaxed"
std::optional<CaptureMode> capture_mode_from(int value);

// A stream as the driver tells them apart: its handle, and for the per-thread default stream
// (one handle value, one stream per thread) the thread whose it is.
struct StreamKey {
  std::uint64_t handle = 0;
  std::uint32_t tid = 0;
  bool operator==(const StreamKey &o) const { return handle == o.handle && tid == o.tid; }
};

struct CaptureRec {
  std::uint32_t id = 0;         // the model's number for it, 1, 2, ... (log field `capture`)
  std::uint64_t driver_id = 0;  // the driver's id (cuStreamGetCaptureInfo), 0 when not known
  StreamKey stream;
  std::uint32_t tid = 0;  // the thread that began it
  CaptureMode mode = CaptureMode::Global;
  EventRef begin;           // the call that began it (its stack: where)
  EventRef invalidated_by;  // the first call seen that invalidated it, when one was seen
  std::uint64_t allocs = 0, alloc_bytes = 0;        // made on its thread while it was open
  std::uint64_t graph_allocs = 0, graph_bytes = 0;  // allocation nodes it captured
};

// What a potentially unsafe call of a thread would meet now.
struct UnsafeVerdict {
  bool prohibited = false;
  CaptureRec capture;     // the capture that prohibits it: the thread's own first, else another's
  bool own = false;       // `capture` was begun on the calling thread
  std::size_t count = 0;  // captures the call would invalidate
};

// Whether the shim may make its own CUDA calls (releasing the frees it holds back, the busy
// check's query or synchronisation) now, or must wait for the captures to end.
struct OwnWork {
  bool now = true;
  CaptureRec waits_for;  // when !now: the oldest open capture
};

struct GraphAlloc {
  std::uint64_t ptr = 0, size = 0;
  std::int32_t dev = -1;
  std::uint64_t graph = 0;      // the owning graph; 0 while the capture making it is open
  std::uint32_t capture = 0;    // the capture that made it, 0 for cudaGraphAddMemAllocNode
  EventRef node;                // the call that made the allocation node
  bool freed_in_graph = false;  // a free node of its own graph frees it at every launch
  bool live = false;            // a launch allocated it and no free of it was seen since
  std::uint32_t holders = 0;    // its graph and each executable graph that allocates it
};

// A launch: the allocations it made live, and those of other graphs its free nodes freed.
struct LaunchEffect {
  std::vector<GraphAlloc> allocated, freed;
};

class CaptureModel {
 public:
  bool any_open() const { return open_.load(std::memory_order_acquire) != 0; }

  // ---- captures ----
  // After the driver began a capture of stream s.
  CaptureRec on_begin(const StreamKey &s, std::uint32_t tid, CaptureMode mode, const EventRef &ev,
                      std::uint64_t driver_id);
  // At the end of the capture of s (whatever the driver answered): the capture, now closed.
  std::optional<CaptureRec> on_end(const StreamKey &s);
  // The open capture stream s belongs to: its origin stream, or (a stream that joined it) the
  // driver's capture id.
  std::optional<CaptureRec> capture_of_stream(const StreamKey &s, std::uint64_t driver_id) const;
  // The newest open capture begun on thread tid, 0 for none: an allocation made there while it is
  // open is made for it (PyTorch's graph private pools).
  std::uint32_t capture_of_thread(std::uint32_t tid) const;
  // The documented rule (see the top of this file) for a potentially unsafe call of thread tid in
  // interaction mode `thread_mode`.
  UnsafeVerdict check_unsafe(std::uint32_t tid, CaptureMode thread_mode) const;
  // The driver refused such a call: the captures it prohibits are invalidated, by `by` (the first
  // such call is kept for each).
  void note_invalidated(std::uint32_t tid, CaptureMode thread_mode, const EventRef &by);
  void note_invalidated(std::uint32_t capture, const EventRef &by);
  void note_alloc(std::uint32_t capture, std::uint64_t bytes);
  OwnWork own_work() const;
  std::vector<CaptureRec> open_captures() const;

  // ---- graph memory ----
  // An allocation node of `graph` (0 while `capture` is open: a captured cudaMallocAsync).
  void on_alloc_node(std::uint64_t graph, std::uint32_t capture, std::uint64_t ptr,
                     std::uint64_t size, int dev, const EventRef &ev);
  // A free node (a captured cudaFreeAsync, cudaGraphAddMemFreeNode); false when ptr is no graph
  // allocation the model knows.
  bool on_free_node(std::uint64_t graph, std::uint32_t capture, std::uint64_t ptr);
  // The capture ended with `graph`, or failed (graph 0): its allocations are gone with it.
  void on_capture_ended(std::uint32_t capture, std::uint64_t graph);
  void on_instantiate(std::uint64_t exec, std::uint64_t graph);
  LaunchEffect on_launch(std::uint64_t exec);
  void on_exec_destroy(std::uint64_t exec);
  void on_graph_destroy(std::uint64_t graph);
  // Whether a graph owns ptr (the base of one of its allocations): a free of it is never judged a
  // double free from the linear model, which never saw the launches allocate it.
  std::optional<GraphAlloc> graph_owned(std::uint64_t ptr) const;
  // A free outside any graph (cudaFree, cudaFreeAsync on a stream not capturing): the allocation
  // as it was before (live: the free ended its lifetime), or nullopt when no graph owns ptr.
  std::optional<GraphAlloc> on_free_outside(std::uint64_t ptr);
  // Live graph allocations for exit paths (lock_within.h); false when the lock stayed taken. A
  // template, not a std::function: a lambda of more than two references would be copied to the
  // heap, and nothing may allocate once exit has begun (another thread, interrupted by the signal
  // whose handler called exit(), can hold the allocator's lock).
  template <class Fn>
  bool for_each_live_within(Fn &&fn, std::uint64_t patience_ns) const {
    if (!lock_within(mu_, patience_ns)) return false;
    std::lock_guard lk(mu_, std::adopt_lock);
    for (const auto &[p, a] : allocs_)
      if (a.live) fn(a);
    return true;
  }

  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child();  // the child has no captures and owns none of the parent's graphs
  void clear();

 private:
  struct Graph {
    std::vector<std::uint64_t> allocs;       // its allocation nodes
    std::vector<std::uint64_t> frees_other;  // allocations of other graphs it frees
  };
  struct Exec {
    std::vector<std::uint64_t> kept;   // allocated at each launch and not freed in the graph
    std::vector<std::uint64_t> frees;  // allocations of other graphs freed at each launch
  };
  static std::uint64_t pending_key(std::uint32_t capture) { return (1ULL << 63) | capture; }
  void drop_holder(std::uint64_t ptr);
  CaptureRec *find_open(std::uint32_t id);

  mutable MarkedMutex mu_;  // its holder is known (exit paths, lock_within.h)
  std::atomic<int> open_{0};
  std::atomic<std::size_t> known_allocs_{0};
  std::vector<CaptureRec> open_list_;
  std::uint32_t next_id_ = 1;
  std::map<std::uint64_t, Graph> graphs_;  // by handle; a capture's with pending_key until it ends
  std::map<std::uint64_t, Exec> execs_;
  std::map<std::uint64_t, GraphAlloc> allocs_;
};

}  // namespace cmg
