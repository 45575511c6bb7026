// SPDX-License-Identifier: Apache-2.0
// Stream capture and graph memory in the model: see capture_model.h for the rules.
#include "capture_model.h"

#include <algorithm>
#include <new>

#include "lock_within.h"

namespace cmg {

std::string_view capture_mode_name(CaptureMode m) {
  switch (m) {
    case CaptureMode::Global:
      return "global";
    case CaptureMode::ThreadLocal:
      return "thread-local";
    case CaptureMode::Relaxed:
      return "relaxed";
  }
  return "?";
}

std::optional<CaptureMode> capture_mode_from(int v) {
  if (v < 0 || v > 2) return std::nullopt;
  return static_cast<CaptureMode>(v);
}

// ---- captures ------------------------------------------------------------------------------

CaptureRec CaptureModel::on_begin(const StreamKey &s, std::uint32_t tid, CaptureMode mode,
                                  const EventRef &ev, std::uint64_t driver_id) {
  std::lock_guard lk(mu_);
  CaptureRec c;
  c.id = next_id_++;
  c.driver_id = driver_id;
  c.stream = s;
  c.tid = tid;
  c.mode = mode;
  c.begin = ev;
  // A begin the driver accepted on a stream the model still thinks captures: its end went by a
  // route the shim does not see. The driver's answer wins.
  open_list_.erase(std::remove_if(open_list_.begin(), open_list_.end(),
                                  [&](const CaptureRec &o) { return o.stream == s; }),
                   open_list_.end());
  open_list_.push_back(c);
  open_.store(static_cast<int>(open_list_.size()), std::memory_order_release);
  return c;
}

std::optional<CaptureRec> CaptureModel::on_end(const StreamKey &s) {
  std::lock_guard lk(mu_);
  auto it = std::find_if(open_list_.begin(), open_list_.end(),
                         [&](const CaptureRec &c) { return c.stream == s; });
  if (it == open_list_.end()) return std::nullopt;
  CaptureRec c = *it;
  open_list_.erase(it);
  open_.store(static_cast<int>(open_list_.size()), std::memory_order_release);
  return c;
}

std::optional<CaptureRec> CaptureModel::capture_of_stream(const StreamKey &s,
                                                          std::uint64_t driver_id) const {
  if (!any_open()) return std::nullopt;
  std::lock_guard lk(mu_);
  for (const CaptureRec &c : open_list_)
    if (c.stream == s || (driver_id && c.driver_id == driver_id)) return c;
  return std::nullopt;
}

std::uint32_t CaptureModel::capture_of_thread(std::uint32_t tid) const {
  if (!any_open()) return 0;
  std::lock_guard lk(mu_);
  for (auto it = open_list_.rbegin(); it != open_list_.rend(); ++it)
    if (it->tid == tid) return it->id;
  return 0;
}

UnsafeVerdict CaptureModel::check_unsafe(std::uint32_t tid, CaptureMode m) const {
  UnsafeVerdict v;
  if (!any_open() || m == CaptureMode::Relaxed) return v;
  std::lock_guard lk(mu_);
  for (const CaptureRec &c : open_list_) {
    const bool own = c.tid == tid;
    const bool hit = own ? c.mode != CaptureMode::Relaxed
                         : m == CaptureMode::Global && c.mode == CaptureMode::Global;
    if (!hit) continue;
    ++v.count;
    // The thread's own capture names the cause first: it is the one the caller can fix there.
    if (!v.prohibited || (own && !v.own)) {
      v.capture = c;
      v.own = own;
    }
    v.prohibited = true;
  }
  return v;
}

void CaptureModel::note_invalidated(std::uint32_t tid, CaptureMode m, const EventRef &by) {
  if (!any_open() || m == CaptureMode::Relaxed) return;
  std::lock_guard lk(mu_);
  for (CaptureRec &c : open_list_) {
    const bool own = c.tid == tid;
    const bool hit = own ? c.mode != CaptureMode::Relaxed
                         : m == CaptureMode::Global && c.mode == CaptureMode::Global;
    if (hit && !c.invalidated_by.known()) c.invalidated_by = by;
  }
}

CaptureRec *CaptureModel::find_open(std::uint32_t id) {
  for (CaptureRec &c : open_list_)
    if (c.id == id) return &c;
  return nullptr;
}

void CaptureModel::note_invalidated(std::uint32_t capture, const EventRef &by) {
  std::lock_guard lk(mu_);
  if (CaptureRec *c = find_open(capture); c && !c->invalidated_by.known()) c->invalidated_by = by;
}

void CaptureModel::note_alloc(std::uint32_t capture, std::uint64_t bytes) {
  std::lock_guard lk(mu_);
  if (CaptureRec *c = find_open(capture)) {
    ++c->allocs;
    c->alloc_bytes += bytes;
  }
}

OwnWork CaptureModel::own_work() const {
  OwnWork w;
  if (!any_open()) return w;
  std::lock_guard lk(mu_);
  if (open_list_.empty()) return w;
  w.now = false;
  w.waits_for = open_list_.front();
  return w;
}

std::vector<CaptureRec> CaptureModel::open_captures() const {
  std::lock_guard lk(mu_);
  return open_list_;
}

// ---- graph memory ---------------------------------------------------------------------------

void CaptureModel::on_alloc_node(std::uint64_t graph, std::uint32_t capture, std::uint64_t ptr,
                                 std::uint64_t size, int dev, const EventRef &ev) {
  std::lock_guard lk(mu_);
  const std::uint64_t key = graph ? graph : pending_key(capture);
  // The driver fixed this address for the new node: whatever the model knew of it before (a graph
  // destroyed through a route the shim does not see) is over.
  if (auto old = allocs_.find(ptr); old != allocs_.end()) allocs_.erase(old);
  GraphAlloc a;
  a.ptr = ptr;
  a.size = size;
  a.dev = dev;
  a.graph = graph;
  a.capture = capture;
  a.node = ev;
  a.holders = 1;
  allocs_[ptr] = a;
  graphs_[key].allocs.push_back(ptr);
  if (!graph) {
    if (CaptureRec *c = find_open(capture)) {
      ++c->graph_allocs;
      c->graph_bytes += size;
    }
  }
  known_allocs_.store(allocs_.size(), std::memory_order_release);
}

bool CaptureModel::on_free_node(std::uint64_t graph, std::uint32_t capture, std::uint64_t ptr) {
  std::lock_guard lk(mu_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return false;
  const std::uint64_t key = graph ? graph : pending_key(capture);
  GraphAlloc &a = it->second;
  const std::uint64_t owner = a.graph ? a.graph : pending_key(a.capture);
  if (owner == key)
    a.freed_in_graph = true;
  else
    graphs_[key].frees_other.push_back(ptr);
  return true;
}

void CaptureModel::drop_holder(std::uint64_t ptr) {
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return;
  if (it->second.holders) --it->second.holders;
  if (!it->second.holders && !it->second.live) allocs_.erase(it);
}

void CaptureModel::on_capture_ended(std::uint32_t capture, std::uint64_t graph) {
  std::lock_guard lk(mu_);
  auto it = graphs_.find(pending_key(capture));
  if (it == graphs_.end()) return;
  Graph g = std::move(it->second);
  graphs_.erase(it);
  if (!graph) {
    // A failed capture returns no graph: its allocation nodes are gone with it.
    for (std::uint64_t p : g.allocs) drop_holder(p);
  } else {
    for (std::uint64_t p : g.allocs)
      if (auto a = allocs_.find(p); a != allocs_.end()) a->second.graph = graph;
    graphs_[graph] = std::move(g);
  }
  known_allocs_.store(allocs_.size(), std::memory_order_release);
}

void CaptureModel::on_instantiate(std::uint64_t exec, std::uint64_t graph) {
  std::lock_guard lk(mu_);
  if (auto old = execs_.find(exec); old != execs_.end()) {
    for (std::uint64_t p : old->second.kept) drop_holder(p);
    execs_.erase(old);
  }
  auto g = graphs_.find(graph);
  if (g == graphs_.end()) return;  // a graph without memory nodes the shim saw
  Exec e;
  for (std::uint64_t p : g->second.allocs) {
    auto a = allocs_.find(p);
    if (a == allocs_.end() || a->second.freed_in_graph) continue;
    e.kept.push_back(p);
    ++a->second.holders;
  }
  e.frees = g->second.frees_other;
  execs_[exec] = std::move(e);
  known_allocs_.store(allocs_.size(), std::memory_order_release);
}

LaunchEffect CaptureModel::on_launch(std::uint64_t exec) {
  LaunchEffect out;
  std::lock_guard lk(mu_);
  auto e = execs_.find(exec);
  if (e == execs_.end()) return out;
  for (std::uint64_t p : e->second.kept) {
    auto a = allocs_.find(p);
    if (a == allocs_.end() || a->second.live) continue;  // live: freed and made again (auto-free)
    a->second.live = true;
    out.allocated.push_back(a->second);
  }
  for (std::uint64_t p : e->second.frees) {
    auto a = allocs_.find(p);
    if (a == allocs_.end() || !a->second.live) continue;
    a->second.live = false;
    out.freed.push_back(a->second);
    if (!a->second.holders) allocs_.erase(a);
  }
  known_allocs_.store(allocs_.size(), std::memory_order_release);
  return out;
}

void CaptureModel::on_exec_destroy(std::uint64_t exec) {
  std::lock_guard lk(mu_);
  auto e = execs_.find(exec);
  if (e == execs_.end()) return;
  for (std::uint64_t p : e->second.kept) drop_holder(p);
  execs_.erase(e);
  known_allocs_.store(allocs_.size(), std::memory_order_release);
}

void CaptureModel::on_graph_destroy(std::uint64_t graph) {
  std::lock_guard lk(mu_);
  auto g = graphs_.find(graph);
  if (g == graphs_.end()) return;
  // cuda.h: destroying the graph does not free a live graph allocation; it stays until freed.
  for (std::uint64_t p : g->second.allocs) drop_holder(p);
  graphs_.erase(g);
  known_allocs_.store(allocs_.size(), std::memory_order_release);
}

std::optional<GraphAlloc> CaptureModel::graph_owned(std::uint64_t ptr) const {
  if (known_allocs_.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard lk(mu_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return std::nullopt;
  return it->second;
}

std::optional<GraphAlloc> CaptureModel::on_free_outside(std::uint64_t ptr) {
  if (known_allocs_.load(std::memory_order_acquire) == 0) return std::nullopt;
  std::lock_guard lk(mu_);
  auto it = allocs_.find(ptr);
  if (it == allocs_.end()) return std::nullopt;
  GraphAlloc before = it->second;
  it->second.live = false;
  if (!it->second.holders) allocs_.erase(it);
  known_allocs_.store(allocs_.size(), std::memory_order_release);
  return before;
}

void CaptureModel::fork_child() {
  // The child owns none of the parent's captures or graphs; the lock was held across fork.
  mu_.unlock();
  clear();
}

void CaptureModel::clear() {
  std::lock_guard lk(mu_);
  open_list_.clear();
  graphs_.clear();
  execs_.clear();
  allocs_.clear();
  open_.store(0, std::memory_order_release);
  known_allocs_.store(0, std::memory_order_release);
}

}  // namespace cmg
