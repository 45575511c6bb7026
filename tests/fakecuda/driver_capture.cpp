// SPDX-License-Identifier: Apache-2.0
// Fake driver: stream capture, graphs and graph memory nodes. What a capture refuses and when it is
// invalidated follow the documentation (driver_internal.h names the sources; docs/reference/
// real-driver.md section 7 lists the rows the conformance program checks on the GPU). Graphs hold
// only what the memory model needs: their allocation and free nodes and a count of other nodes; a
// launch performs the memory nodes (no kernels, no copies: the fake runs none).
#include <sys/syscall.h>
#include <unistd.h>

#include "driver_internal.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace fc {
namespace {

constexpr unsigned kGraphMagic = 0xfc06a9f1, kExecMagic = 0xfc0e9ec1;

struct Graph {
  unsigned magic = kGraphMagic;
  std::vector<std::uintptr_t> allocs;  // addresses of its allocation nodes
  std::vector<std::uintptr_t> frees;   // addresses its free nodes free
  std::size_t nodes = 0;
  bool instantiated = false;  // cuda.h: one instantiation at a time of a graph with memory nodes
};

struct Exec {
  unsigned magic = kExecMagic;
  Graph *from = nullptr;              // nullptr once that graph is destroyed
  std::vector<std::uintptr_t> kept;   // allocated by the graph and not freed in it
  std::vector<std::uintptr_t> frees;  // allocations of other graphs that this one frees
  bool auto_free = false;             // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH
};

// A graph allocation. Its address is fixed when the node is made; its lifetime begins at a launch
// and ends at its free (cuda.h, cuGraphAddMemAllocNode). It stays known while its graph or an
// executable graph of it exists, or while it is live.
struct GraphAlloc {
  std::size_t size = 0;
  int dev = 0;
  Graph *owner = nullptr;        // nullptr once the owning graph is destroyed
  bool freed_in_owner = false;   // the owning graph frees it (then nothing else may)
  bool freed_elsewhere = false;  // another graph has a free node for it
  bool live = false;
  unsigned refs = 0;  // the owning graph and each executable graph that keeps it
};

struct Capture {
  unsigned long long id = 0;
  const void *key = nullptr;  // StreamId::key of the capturing stream
  pid_t thread = 0;           // the thread that began it
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool blocking = true;
  int dev = 0;
  bool invalidated = false;
  bool wrong_thread_end = false;  // an end from another thread was refused (C16)
  Graph *graph = nullptr;  // being built; handed out by a successful end
};

struct Registry {
  std::mutex mu;
  std::vector<Capture> open;
  unsigned long long next_id = 1;
  std::uintptr_t next_node = 0;
  std::unordered_set<Graph *> graphs;
  std::unordered_set<Exec *> execs;
  std::map<std::uintptr_t, GraphAlloc> allocs;
};

Registry &reg() {
  static Registry *r = new Registry;  // leaked: graphs may be destroyed from static destructors
  return *r;
}

// Open captures, read without the lock: every call that only has to know "none" stays lock-free
// (the stress tests call the fake from many threads).
std::atomic<int> g_open{0};

// The calling thread's stream capture interaction mode (cuThreadExchangeStreamCaptureMode).
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

pid_t self() {
  static thread_local pid_t t = static_cast<pid_t>(syscall(SYS_gettid));
  return t;
}

bool valid_mode(int m) {
  return m == CU_STREAM_CAPTURE_MODE_GLOBAL || m == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         m == CU_STREAM_CAPTURE_MODE_RELAXED;
}

Capture *find(Registry &r, const void *key) {
  for (Capture &c : r.open)
    if (c.key == key) return &c;
  return nullptr;
}

CUgraphNode new_node(Registry &r, Graph *g) {
  ++g->nodes;
  r.next_node += 0x40;
  return reinterpret_cast<CUgraphNode>(0x4e0d00000000ULL + r.next_node);
}

Graph *as_graph(Registry &r, CUgraph h) {
  auto *g = reinterpret_cast<Graph *>(h);
  return r.graphs.count(g) && g->magic == kGraphMagic ? g : nullptr;
}

Exec *as_exec(Registry &r, CUgraphExec h) {
  auto *e = reinterpret_cast<Exec *>(h);
  return r.execs.count(e) && e->magic == kExecMagic ? e : nullptr;
}

// Forgets a graph allocation nothing refers to any more (its address goes back to the arena).
void release_if_unused(Registry &r, std::uintptr_t p) {
  auto it = r.allocs.find(p);
  if (it == r.allocs.end() || it->second.refs || it->second.live) return;
  graph_va_release(p);
  r.allocs.erase(it);
}

void drop_ref(Registry &r, std::uintptr_t p) {
  auto it = r.allocs.find(p);
  if (it == r.allocs.end()) return;
  if (it->second.refs) --it->second.refs;
  release_if_unused(r, p);
}

void destroy_graph(Registry &r, Graph *g) {
  for (std::uintptr_t p : g->allocs) {
    auto it = r.allocs.find(p);
    if (it != r.allocs.end() && it->second.owner == g) it->second.owner = nullptr;
    drop_ref(r, p);
  }
  for (Exec *e : r.execs)
    if (e->from == g) e->from = nullptr;
  g->magic = 0;
  delete g;
}

// Invalidates the open captures `hit` picks; returns whether there was one.
template <class Pred>
bool invalidate(Registry &r, Pred &&hit) {
  bool any = false;
  for (Capture &c : r.open)
    if (hit(c)) {
      c.invalidated = true;
      any = true;
    }
  return any;
}

// cuda.h, cuGraphAddMemFreeNode: INVALID_VALUE for an address no allocation node returned, one
// already freed in this graph, or one another graph frees already.
bool may_free_in(const GraphAlloc &a) {
  return !a.freed_in_owner && !a.freed_elsewhere;
}

void mark_freed(GraphAlloc &a, Graph *g, std::uintptr_t p) {
  (a.owner == g ? a.freed_in_owner : a.freed_elsewhere) = true;
  g->frees.push_back(p);
}

CUresult alloc_node(Registry &r, Graph *g, int dev, std::size_t size, std::uintptr_t *out) {
  if (size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t p = 0;
  if (CUresult e = graph_va_carve(dev, size, &p)) return e;
  GraphAlloc a;
  a.size = size;
  a.dev = dev;
  a.owner = g;
  a.refs = 1;
  r.allocs[p] = a;
  g->allocs.push_back(p);
  *out = p;
  return CUDA_SUCCESS;
}

// ---- the exports' bodies ---------------------------------------------------------------------

CUresult begin_capture(CUstream s, bool per_thread, int mode) {
  if (CUresult e = require_init()) return e;
  if (!valid_mode(mode)) return CUDA_ERROR_INVALID_VALUE;
  StreamId id;
  if (CUresult e = resolve_stream(s, per_thread, &id)) return e;
  // cuda.h: "Capture may not be initiated if stream is CU_STREAM_LEGACY".
  if (id.legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  // "it may only be initiated if the stream is not already in capture mode"
  if (find(r, id.key)) return CUDA_ERROR_ILLEGAL_STATE;
  Capture c;
  c.id = r.next_id++;
  c.key = id.key;
  c.thread = self();
  c.mode = static_cast<CUstreamCaptureMode>(mode);
  c.blocking = id.blocking;
  c.dev = id.dev;
  c.graph = new Graph;
  r.open.push_back(c);
  g_open.fetch_add(1, std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult end_capture(CUstream s, bool per_thread, CUgraph *out) {
  if (CUresult e = require_init()) return e;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  StreamId id;
  if (CUresult e = resolve_stream(s, per_thread, &id)) return e;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Capture *c = find(r, id.key);
  if (!c) return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
  // cuda.h: a capture not begun in relaxed mode must be ended by the thread that began it.
  // On the H200 the begin thread's own end after such a refusal fails with ILLEGAL_STATE
  // (real-driver.md C16, measured): the refused end broke the capture. It is ended then, with no
  // graph (what happens to the stream after that was not measured).
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != self()) {
    c->wrong_thread_end = true;
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  Capture done = *c;
  r.open.erase(r.open.begin() + (c - r.open.data()));
  g_open.fetch_sub(1, std::memory_order_release);
  if (done.wrong_thread_end) {
    destroy_graph(r, done.graph);
    *out = nullptr;
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  if (done.invalidated) {
    // "will also return an error value and a NULL graph": what the capture allocated is gone.
    destroy_graph(r, done.graph);
    *out = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  r.graphs.insert(done.graph);
  *out = reinterpret_cast<CUgraph>(done.graph);
  return CUDA_SUCCESS;
}

CUresult is_capturing(CUstream s, bool per_thread, CUstreamCaptureStatus *status,
                      cuuint64_t *id_out) {
  if (CUresult e = require_init()) return e;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  StreamId id;
  if (CUresult e = resolve_stream(s, per_thread, &id)) return e;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  if (id.legacy) {
    // cuda.h, cuStreamIsCapturing: CAPTURE_IMPLICIT while a blocking stream captures; that
    // capture is not invalidated.
    for (const Capture &c : r.open)
      if (c.blocking && c.dev == id.dev) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    return CUDA_SUCCESS;
  }
  const Capture *c = find(r, id.key);
  *status = !c               ? CU_STREAM_CAPTURE_STATUS_NONE
            : c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                             : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  if (id_out) *id_out = c ? c->id : 0;
  return CUDA_SUCCESS;
}

CUresult exchange_mode(CUstreamCaptureMode *mode) {
  if (CUresult e = require_init()) return e;
  if (!mode) return CUDA_ERROR_INVALID_VALUE;
  // Read as a number: a caller may pass any value, which is no valid enumerator.
  int asked;
  std::memcpy(&asked, mode, sizeof asked);
  if (!valid_mode(asked)) return CUDA_ERROR_INVALID_VALUE;
  *mode = t_mode;
  t_mode = static_cast<CUstreamCaptureMode>(asked);
  return CUDA_SUCCESS;
}

CUresult graph_create(CUgraph *out, unsigned int flags) {
  if (CUresult e = require_init()) return e;
  if (!out || flags) return CUDA_ERROR_INVALID_VALUE;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  auto *g = new Graph;
  r.graphs.insert(g);
  *out = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}

CUresult graph_destroy(CUgraph h) {
  if (CUresult e = require_init()) return e;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Graph *g = as_graph(r, h);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  r.graphs.erase(g);
  destroy_graph(r, g);
  return CUDA_SUCCESS;
}

CUresult add_alloc_node(CUgraphNode *node, CUgraph h, CUDA_MEM_ALLOC_NODE_PARAMS *p) {
  if (CUresult e = require_init()) return e;
  if (!node || !p || p->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(p->poolProps.location.id)) return CUDA_ERROR_INVALID_DEVICE;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Graph *g = as_graph(r, h);
  if (!g || g->instantiated) return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t out = 0;
  if (CUresult e = alloc_node(r, g, p->poolProps.location.id, p->bytesize, &out)) return e;
  p->dptr = out;
  *node = new_node(r, g);
  return CUDA_SUCCESS;
}

CUresult add_free_node(CUgraphNode *node, CUgraph h, CUdeviceptr dptr) {
  if (CUresult e = require_init()) return e;
  if (!node) return CUDA_ERROR_INVALID_VALUE;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Graph *g = as_graph(r, h);
  if (!g || g->instantiated) return CUDA_ERROR_INVALID_VALUE;
  auto it = r.allocs.find(dptr);
  if (it == r.allocs.end() || !may_free_in(it->second)) return CUDA_ERROR_INVALID_VALUE;
  mark_freed(it->second, g, dptr);
  *node = new_node(r, g);
  return CUDA_SUCCESS;
}

CUresult instantiate(CUgraphExec *out, CUgraph h, unsigned long long flags) {
  if (CUresult e = require_init()) return e;
  if (!out) return CUDA_ERROR_INVALID_VALUE;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Graph *g = as_graph(r, h);
  if (!g) return CUDA_ERROR_INVALID_VALUE;
  const bool memory = !g->allocs.empty() || !g->frees.empty();
  if (memory && g->instantiated) return CUDA_ERROR_INVALID_VALUE;
  auto *e = new Exec;
  e->from = g;
  e->auto_free = flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
  for (std::uintptr_t p : g->allocs) {
    GraphAlloc &a = r.allocs.at(p);
    if (a.freed_in_owner) continue;
    e->kept.push_back(p);
    ++a.refs;
  }
  for (std::uintptr_t p : g->frees)
    if (r.allocs.at(p).owner != g) e->frees.push_back(p);
  g->instantiated = memory;
  r.execs.insert(e);
  *out = reinterpret_cast<CUgraphExec>(e);
  return CUDA_SUCCESS;
}

CUresult launch(CUgraphExec h, CUstream s, bool per_thread) {
  if (CUresult e = require_init()) return e;
  StreamId id;
  if (CUresult e = resolve_stream(s, per_thread, &id)) return e;
  // A launch into a capturing stream (a child graph node) is not modelled.
  CUresult cap = capture_node(id);
  if (cap != kNotCapturing) return cap == CUDA_SUCCESS ? CUDA_ERROR_NOT_SUPPORTED : cap;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Exec *e = as_exec(r, h);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  // cuda.h, cuGraphLaunch: allocations of an earlier launch still unfreed make it fail, unless
  // instantiated with AUTO_FREE_ON_LAUNCH.
  for (std::uintptr_t p : e->kept)
    if (r.allocs.at(p).live && !e->auto_free) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::uintptr_t> charged;
  for (std::uintptr_t p : e->kept) {
    GraphAlloc &a = r.allocs.at(p);
    if (a.live) continue;  // auto-free: freed and allocated again at once, charged all along
    if (!graph_va_charge(p, true)) {
      for (std::uintptr_t q : charged) graph_va_charge(q, false);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    charged.push_back(p);
  }
  for (std::uintptr_t p : e->kept) r.allocs.at(p).live = true;
  for (std::uintptr_t p : e->frees) {
    auto it = r.allocs.find(p);
    if (it == r.allocs.end() || !it->second.live) continue;
    it->second.live = false;
    graph_va_charge(p, false);
    release_if_unused(r, p);
  }
  return CUDA_SUCCESS;
}

CUresult exec_destroy(CUgraphExec h) {
  if (CUresult e = require_init()) return e;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Exec *e = as_exec(r, h);
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  r.execs.erase(e);
  if (e->from) e->from->instantiated = false;
  for (std::uintptr_t p : e->kept) drop_ref(r, p);
  e->magic = 0;
  delete e;
  return CUDA_SUCCESS;
}

CUresult graph_mem_trim(CUdevice dev) {
  if (CUresult e = require_init()) return e;
  return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

}  // namespace

// ---- the rules other exports apply (driver_internal.h) ----------------------------------------

CUresult capture_unsafe_call() {
  if (g_open.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  const pid_t me = self();
  const CUstreamCaptureMode m = t_mode;
  // cuda.h, cuThreadExchangeStreamCaptureMode: in global or thread-local mode a thread is
  // prohibited by its own captures not begun relaxed; in global mode also by other threads'
  // global-mode captures; in relaxed mode by none.
  const bool hit = invalidate(r, [&](const Capture &c) {
    if (m == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
    if (c.thread == me) return c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    return m == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  });
  return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Programming guide, "Prohibited and Unhandled Operations": while a blocking stream of the context
// captures, any use of the legacy stream is invalid, and so are synchronous APIs that use it.
CUresult capture_legacy_use(int dev) {
  if (g_open.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  const bool hit = invalidate(r, [&](const Capture &c) { return c.blocking && c.dev == dev; });
  return hit ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

// "It is invalid to synchronize or query the execution status of a stream which is being
// captured."
CUresult capture_stream_wait(const StreamId &id) {
  if (g_open.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  if (id.legacy) return capture_legacy_use(id.dev);
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  const bool hit = invalidate(r, [&](const Capture &c) { return c.key == id.key; });
  return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// "... or synchronize a broader handle which encompasses an active stream capture, such as a
// device or context handle".
CUresult capture_context_wait(int dev) {
  if (g_open.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  const bool hit = invalidate(r, [&](const Capture &c) { return c.dev == dev; });
  return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult capture_node(const StreamId &id) {
  if (g_open.load(std::memory_order_acquire) == 0) return kNotCapturing;
  if (id.legacy) {
    CUresult e = capture_legacy_use(id.dev);
    return e == CUDA_SUCCESS ? kNotCapturing : e;
  }
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Capture *c = find(r, id.key);
  if (!c) return kNotCapturing;
  // Invalidation: "further use of any streams which are being captured ... is invalid".
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  (void)new_node(r, c->graph);
  return CUDA_SUCCESS;
}

// cuda.h, cuMemAllocAsync during capture: an allocation node, whose address is fixed now.
CUresult capture_alloc_node(const StreamId &id, std::size_t size, std::uintptr_t *out) {
  if (g_open.load(std::memory_order_acquire) == 0) return kNotCapturing;
  if (id.legacy) {
    CUresult e = capture_legacy_use(id.dev);
    return e == CUDA_SUCCESS ? kNotCapturing : e;
  }
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Capture *c = find(r, id.key);
  if (!c) return kNotCapturing;
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  if (CUresult e = alloc_node(r, c->graph, c->dev, size, out)) return e;
  (void)new_node(r, c->graph);
  return CUDA_SUCCESS;
}

// cuda.h, cuMemFreeAsync: "During stream capture, this function results in the creation of a free
// node and must therefore be passed the address of a graph allocation." Anything else is refused
// with INVALID_VALUE, and the capture goes on: its end succeeds (real-driver.md C14, measured on the
// H200; the header's wording had suggested an invalidating operation).
CUresult capture_free_node(const StreamId &id, std::uintptr_t p) {
  if (g_open.load(std::memory_order_acquire) == 0) return kNotCapturing;
  if (id.legacy) {
    CUresult e = capture_legacy_use(id.dev);
    return e == CUDA_SUCCESS ? kNotCapturing : e;
  }
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  Capture *c = find(r, id.key);
  if (!c) return kNotCapturing;
  if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  auto it = r.allocs.find(p);
  if (it == r.allocs.end() || !may_free_in(it->second)) return CUDA_ERROR_INVALID_VALUE;
  mark_freed(it->second, c->graph, p);
  (void)new_node(r, c->graph);
  return CUDA_SUCCESS;
}

// cuda.h, cuGraphAddMemAllocNode: an allocation not freed in its graph is freed by cuMemFree or
// cuMemFreeAsync after a launch; one its graph frees cannot be freed outside it.
CUresult graph_free_outside(std::uintptr_t p) {
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.allocs.find(p);
  if (it == r.allocs.end() || it->second.freed_in_owner || !it->second.live)
    return CUDA_ERROR_INVALID_VALUE;
  it->second.live = false;
  graph_va_charge(p, false);
  release_if_unused(r, p);
  return CUDA_SUCCESS;
}

CaptureCounts capture_counts() {
  Registry &r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  CaptureCounts n;
  n.open = r.open.size();
  n.graphs = r.graphs.size();
  n.execs = r.execs.size();
  n.graph_allocs = r.allocs.size();
  for (const auto &[p, a] : r.allocs)
    if (a.live) {
      ++n.graph_live;
      n.graph_live_bytes += a.size;
    }
  return n;
}

}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuStreamBeginCapture(CUstream hStream) {
  // The CUDA 10.0 entry point has no mode: it begins a global-mode capture.
  return FC_CALL(cuStreamBeginCapture,
                 begin_capture(hStream, false, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

FC_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream) {
  return FC_CALL(cuStreamBeginCapture_ptsz,
                 begin_capture(hStream, true, CU_STREAM_CAPTURE_MODE_GLOBAL));
}

FC_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
  return FC_CALL(cuStreamBeginCapture_v2, begin_capture(hStream, false, mode));
}

FC_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
  return FC_CALL(cuStreamBeginCapture_v2_ptsz, begin_capture(hStream, true, mode));
}

FC_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
  return FC_CALL(cuStreamEndCapture, end_capture(hStream, false, phGraph));
}

FC_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
  return FC_CALL(cuStreamEndCapture_ptsz, end_capture(hStream, true, phGraph));
}

FC_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  return FC_CALL(cuStreamIsCapturing, is_capturing(hStream, false, captureStatus, nullptr));
}

FC_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                            CUstreamCaptureStatus *captureStatus) {
  return FC_CALL(cuStreamIsCapturing_ptsz, is_capturing(hStream, true, captureStatus, nullptr));
}

FC_EXPORT CUresult cuStreamGetCaptureInfo(CUstream hStream,
                                          CUstreamCaptureStatus *captureStatus_out,
                                          cuuint64_t *id_out) {
  return FC_CALL(cuStreamGetCaptureInfo, is_capturing(hStream, false, captureStatus_out, id_out));
}

FC_EXPORT CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream,
                                               CUstreamCaptureStatus *captureStatus_out,
                                               cuuint64_t *id_out) {
  return FC_CALL(cuStreamGetCaptureInfo_ptsz,
                 is_capturing(hStream, true, captureStatus_out, id_out));
}

FC_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
  return FC_CALL(cuThreadExchangeStreamCaptureMode, exchange_mode(mode));
}

FC_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags) {
  return FC_CALL(cuGraphCreate, graph_create(phGraph, flags));
}

FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) {
  return FC_CALL(cuGraphDestroy, graph_destroy(hGraph));
}

FC_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                          const CUgraphNode *, size_t,
                                          CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
  return FC_CALL(cuGraphAddMemAllocNode, add_alloc_node(phGraphNode, hGraph, nodeParams));
}

FC_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                         const CUgraphNode *, size_t, CUdeviceptr dptr) {
  return FC_CALL(cuGraphAddMemFreeNode, add_free_node(phGraphNode, hGraph, dptr));
}

// The CUDA 10.0 and 11.0 entry points (error node and log buffer) instantiate without flags.
FC_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *,
                                      char *, size_t) {
  return FC_CALL(cuGraphInstantiate, instantiate(phGraphExec, hGraph, 0));
}

FC_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *,
                                         char *, size_t) {
  return FC_CALL(cuGraphInstantiate_v2, instantiate(phGraphExec, hGraph, 0));
}

FC_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                               unsigned long long flags) {
  return FC_CALL(cuGraphInstantiateWithFlags, instantiate(phGraphExec, hGraph, flags));
}

FC_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  return FC_CALL(cuGraphInstantiateWithParams, params
                                                   ? instantiate(phGraphExec, hGraph, params->flags)
                                                   : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                     CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  return FC_CALL(
      cuGraphInstantiateWithParams_ptsz,
      params ? instantiate(phGraphExec, hGraph, params->flags) : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
  return FC_CALL(cuGraphLaunch, launch(hGraphExec, hStream, false));
}

FC_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
  return FC_CALL(cuGraphLaunch_ptsz, launch(hGraphExec, hStream, true));
}

FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) {
  return FC_CALL(cuGraphExecDestroy, exec_destroy(hGraphExec));
}

FC_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  return FC_CALL(cuDeviceGraphMemTrim, graph_mem_trim(device));
}
