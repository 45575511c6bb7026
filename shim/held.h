// SPDX-License-Identifier: Apache-2.0
// Frees the shim holds back instead of passing them to the driver at once: the quarantine
// (CUMEMGUARD_QUARANTINE: freed linear memory kept FIFO so a stale free of an address the driver
// would have re-issued is still caught, bug-patterns.md P30) and deferred cache flushes
// (CUMEMGUARD_OPPORTUNISTIC=defer). Nothing held is dropped while the process runs: it is
// released in FIFO order, one free at a time, when over its limit, when an allocation fails with
// out-of-memory (then the allocation is retried once) and on request. At exit what is still held
// stays held and goes back to the driver with the process: the exit path makes no CUDA call (a
// free synchronises the whole device, real-driver.md section 3, and the exiting thread may have
// been interrupted inside the driver by the signal handler that called exit()).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>

#include "cuda_api.h"
#include "event.h"
#include "lock_within.h"

namespace cmg::shim {

enum class HoldReason : std::uint8_t { Quarantine, Deferred };

struct Held {
  std::uint64_t ptr = 0, size = 0;
  int dev = -1;
  MemKind kind = MemKind::Linear;
  Api api{};  // the free the program called; the same one releases it
  HoldReason why = HoldReason::Quarantine;
  EventRef freed;
  // The linear model's generation of the record held (LinearModel::mark_held): its real free
  // makes that record Freed (given_back); 0: the model has no Held record for it.
  std::uint32_t gen = 0;
};

class HeldFrees {
 public:
  // Holds h; false once exit has begun (close()): the caller frees it itself then.
  bool hold(const Held &h);
  // Holds h only if the bytes held for its reason stay within `limit`; false when they would not,
  // or once exit has begun (closed() tells which).
  bool hold_within(const Held &h, std::uint64_t limit);
  // Releases the oldest entries of `why` until at most `keep_bytes` of it remain; returns bytes.
  std::uint64_t release_down_to(HoldReason why, std::uint64_t keep_bytes);
  // Releases everything (out-of-memory, explicit request); returns bytes released.
  std::uint64_t release_all();
  std::uint64_t release_all(HoldReason why);
  std::uint64_t bytes(HoldReason why) const;
  // Releases the entry holding ptr now (its real free), if there is one: a second free of it that
  // is forwarded (report mode) then meets the driver as it would without the shim.
  bool release(std::uint64_t ptr);
  std::uint64_t released_bytes(HoldReason why) const;  // all released so far
  bool empty() const;
  // Exit: holds nothing more (frees from library destructors come after the exit handlers and go
  // to the driver), and counts what stays held. No CUDA call, no allocation, a bounded wait.
  void close();
  bool closed() const;
  // What close() found held, by reason (the exit summary); known is false when the lock stayed
  // taken (a thread a signal handler interrupted inside it).
  struct AtExit {
    bool known = false;
    std::uint64_t count[2] = {0, 0}, bytes[2] = {0, 0};
  };
  AtExit at_exit() const;
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  void fork_child();  // the child owns none of the parent's memory: forget, do not free

 private:
  void really_free(const Held &h);
  bool pop_oldest(HoldReason why, std::uint64_t keep_bytes, Held &out);
  mutable MarkedMutex mu_;  // its holder is known (exit paths, lock_within.h)
  std::deque<Held> q_;
  std::uint64_t bytes_[2] = {0, 0};
  std::atomic<std::uint64_t> released_[2] = {0, 0};  // read without the lock (exit summary)
  bool closed_ = false;
  AtExit at_exit_;  // written once by close(), read after it
  std::atomic<bool> at_exit_known_{false};
};

HeldFrees &held();

// The quarantine in force, in bytes (CUMEMGUARD_QUARANTINE, `auto` resolved from the memory of the
// device of the first free it holds; dev -1: device 0).
std::uint64_t quarantine_limit(int dev);
// What the exit summary says of the quarantine's size, without asking the driver: the size given,
// the size `auto` resolved to (and whether the device's memory could be read), or that `auto`
// was never resolved because nothing was held.
struct QuarantineSize {
  enum class How : std::uint8_t { Given, Auto, AutoDeviceUnknown, NeverSized };
  How how = How::Given;
  std::uint64_t bytes = 0;
};
QuarantineSize quarantine_size();

}  // namespace cmg::shim
