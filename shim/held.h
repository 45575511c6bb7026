// SPDX-License-Identifier: Apache-2.0
// Frees the shim holds back instead of passing them to the driver at once: the quarantine
// (CUMEMGUARD_QUARANTINE: freed linear memory kept FIFO so a stale free of an address the driver
// would have re-issued is still caught, bug-patterns.md P30) and deferred cache flushes
// (CUMEMGUARD_OPPORTUNISTIC=defer). Nothing held is ever dropped: it is released in FIFO order
// when over its limit, when an allocation fails with out-of-memory (then the allocation is retried
// once), on request, and at exit.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>

#include "cuda_api.h"
#include "event.h"

namespace cmg::shim {

enum class HoldReason : std::uint8_t { Quarantine, Deferred };

struct Held {
  std::uint64_t ptr = 0, size = 0;
  int dev = -1;
  MemKind kind = MemKind::Linear;
  Api api{};  // the free the program called; the same one releases it
  HoldReason why = HoldReason::Quarantine;
  EventRef freed;
};

class HeldFrees {
 public:
  // Holds h; false once exit has begun (close()): the caller frees it itself then.
  bool hold(const Held &h);
  // Holds h only if the bytes held for its reason stay within `limit`; false when they would not,
  // or once exit has begun (closed() tells which).
  bool hold_within(const Held &h, std::uint64_t limit);
  // Releases the oldest entries of `why` until at most `keep_bytes` of it remain; returns bytes.
  std::uint64_t release_down_to(HoldReason why, std::uint64_t keep_bytes, bool at_exit = false);
  // Releases everything (out-of-memory, explicit request, exit); returns bytes released.
  std::uint64_t release_all();
  std::uint64_t release_all(HoldReason why);
  // The same at exit, never waiting long for the lock (close() uses it).
  std::uint64_t release_all_at_exit();
  std::uint64_t bytes(HoldReason why) const;
  // The entry holding ptr, if the shim holds it (a free of it is then a proven double free).
  std::optional<Held> find(std::uint64_t ptr) const;
  // Releases the entry holding ptr now (its real free), if there is one: a second free of it that
  // is forwarded (report mode) then meets the driver as it would without the shim.
  bool release(std::uint64_t ptr);
  std::uint64_t released_bytes(HoldReason why) const;  // all released so far
  bool empty() const;
  // Exit: releases everything and holds nothing more (frees from library destructors come after
  // the exit handlers: nothing would release them).
  void close();
  bool closed() const;
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child();  // the child owns none of the parent's memory: forget, do not free

 private:
  void really_free(const Held &h);
  mutable std::mutex mu_;
  std::deque<Held> q_;
  std::uint64_t bytes_[2] = {0, 0};
  std::atomic<std::uint64_t> released_[2] = {0, 0};  // read without the lock (exit summary)
  bool closed_ = false;
  std::atomic<bool> gave_up_{false};
};

HeldFrees &held();

// The quarantine in force, in bytes (CUMEMGUARD_QUARANTINE, `auto` resolved from the memory of the
// device of the first free it holds; dev -1: device 0).
std::uint64_t quarantine_limit(int dev);

}  // namespace cmg::shim
