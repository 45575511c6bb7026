// SPDX-License-Identifier: Apache-2.0
// What NCCL and the driver's multicast objects hold of the program's memory, beyond "a
// communicator is live": registrations (ncclCommRegister), windows (ncclCommWindowRegister),
// multicast bindings (cuMulticastBindMem/BindAddr), NCCL's own ranges asleep while a communicator
// is suspended, and the peer memory NCCL imported for a communicator. Pure C++, thread-safe, one
// mutex (these calls are rare; the free paths ask only while something is held: one atomic load
// otherwise).
//
// Sources of each rule: registration and windows from NCCL 2.28.9 (src/register/register.cc,
// src/dev_runtime.cc: a registration and a window end with their communicator, ncclRegCleanup and
// ncclDevrFinalize); suspend from 2.29.7 (src/mem_manager.cc); multicast from cuda.h 13.0 (group
// CUDA_MULTICAST); the abort that keeps peer imports mapped from NVIDIA/nccl#1968.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "event.h"

namespace cmg {

enum class HoldKind : std::uint8_t { Registration, Window, BindMem, BindAddr };
std::string_view hold_kind_name(HoldKind k);  // "registration", "window", "multicast binding"

// One thing that holds memory of the program.
struct Hold {
  HoldKind kind = HoldKind::Registration;
  std::uint64_t owner = 0;         // the communicator (registration, window) or multicast object
  std::uint64_t handle = 0;        // registration handle or window; multicast: the object again
  std::uint64_t va = 0, size = 0;  // the program's range (BindMem: 0, its allocation names it)
  std::uint64_t alloc_id = 0;  // multicast: the physical allocation bound (VMM model id; 0 unknown)
  std::uint64_t mc_offset = 0;
  int dev = -1;       // multicast: the device the memory is on
  unsigned refs = 1;  // registrations of a range inside a slot share its handle
  EventRef made;
  bool reported = false;  // a free already named it: later calls of that teardown do not
};

// A range NCCL unmapped while suspending a communicator (its address range kept).
struct SleepingRange {
  std::uint64_t va = 0, size = 0;
  EventRef unmapped;
};

// Peer memory NCCL imported (cuMemImportFromShareableHandle from libnccl).
struct PeerImport {
  std::uint64_t alloc_id = 0;  // VMM model id
  std::uint64_t handle = 0;
  int dev = -1;  // the importing thread's device (-1: none)
  EventRef imported;
  bool reported = false;
};

class NcclHolds {
 public:
  static constexpr std::size_t kImportsKept = 4096;

  // ---- registrations and windows (after NCCL succeeded) ----
  // `inside_nccl`: made by NCCL itself (libnccl 2.28.9 calls ncclCommRegister through its PLT
  // for a window, which an interposer sees): not kept, the window it belongs to is.
  void on_register(std::uint64_t comm, std::uint64_t va, std::uint64_t size, std::uint64_t handle,
                   bool inside_nccl, const EventRef &ev);
  // False when the handle is not one the model holds (NCCL-internal, or made before the shim).
  bool on_deregister(std::uint64_t comm, std::uint64_t handle);
  void on_window(std::uint64_t comm, std::uint64_t va, std::uint64_t size, std::uint64_t win,
                 const EventRef &ev);
  bool on_window_deregister(std::uint64_t comm, std::uint64_t win);
  // The communicator ended: its registrations, windows and sleeping ranges go with it.
  void on_comm_end(std::uint64_t comm);

  // ---- multicast objects ----
  void on_bind(const Hold &binding);  // kind BindMem or BindAddr, owner = the multicast object
  bool on_unbind(std::uint64_t mc, int dev, std::uint64_t mc_offset, std::uint64_t size);
  void on_multicast_release(std::uint64_t mc);  // cuMemRelease of the object: its bindings go

  // ---- the free paths ----
  bool empty() const { return count_.load(std::memory_order_relaxed) == 0; }
  // Registrations, windows and address bindings overlapping [va, va+size) that no earlier call
  // reported; they are marked reported. Cheap while empty().
  std::vector<Hold> take_overlapping(std::uint64_t va, std::uint64_t size);
  // Bindings of an allocation whose last reference went away (unmapped and released).
  std::vector<Hold> take_bound(std::uint64_t alloc_id);
  std::vector<Hold> holds_of(std::uint64_t owner) const;  // by communicator or multicast object

  // ---- suspend ----
  void on_suspend_unmap(std::uint64_t comm, std::uint64_t va, std::uint64_t size,
                        const EventRef &ev);
  std::vector<SleepingRange> sleeping(std::uint64_t comm) const;
  void on_resumed(std::uint64_t comm);

  // ---- NCCL's own reservations ----
  // A reservation NCCL made inside one of its calls naming `comm` (a window's flat range: 2.28.9
  // src/dev_runtime.cc symMemoryMapLsaTeam reserves it at the communicator's first window).
  void on_own_reserve(std::uint64_t comm, std::uint64_t base, std::uint64_t size);
  bool has_own() const { return own_count_.load(std::memory_order_relaxed) != 0; }
  void on_address_freed(std::uint64_t base);  // the driver freed a reservation at `base`
  // NCCL ending `comm` unmaps [va, va+size): true when that is exactly a reservation NCCL made for
  // that communicator. 2.28.9's ncclDevrFinalize unmaps the whole flat range, whatever is still
  // mapped in it, before it frees it (docs/gpu/nccl-window/: nothing is mapped there by then):
  // NCCL's own teardown, not a second unmap of the program's sleeping memory.
  bool own_teardown(std::uint64_t comm, std::uint64_t va, std::uint64_t size) const;

  // ---- peer imports ----
  void on_import(const PeerImport &imp);
  // Imports on `dev` (or on no known device) made at or after `since` (seq) and not reported, for
  // which `mapped` says the memory is still mapped; they are marked reported. Forgotten: the
  // imports `mapped` says are gone.
  template <class Mapped>
  std::vector<PeerImport> take_mapped_imports(int dev, std::uint64_t since, Mapped &&mapped);

  void clear();
  void fork_prepare() { mu_.lock(); }
  void fork_parent() { mu_.unlock(); }
  // The child has one thread and this lock (fork_prepare): cleared under it, then given back.
  // Taking it again here, while the fork handlers registered before this one still hold theirs,
  // reverses the order fork_prepare took them in (ThreadSanitizer: lock-order-inversion).
  void fork_child() {
    clear_locked();
    mu_.unlock();
  }

 private:
  void count_locked() { count_.store(holds_.size(), std::memory_order_relaxed); }
  void clear_locked();
  mutable std::mutex mu_;
  std::multimap<std::uint64_t, Hold> holds_;  // by va (BindMem: 0)
  std::atomic<std::size_t> count_{0};
  std::map<std::uint64_t, std::vector<SleepingRange>> sleeping_;  // by communicator
  std::deque<PeerImport> imports_;
  struct OwnReservation {
    std::uint64_t comm = 0, size = 0;
  };
  std::map<std::uint64_t, OwnReservation> own_;  // by base
  std::atomic<std::size_t> own_count_{0};
};

template <class Mapped>
std::vector<PeerImport> NcclHolds::take_mapped_imports(int dev, std::uint64_t since,
                                                       Mapped &&mapped) {
  std::vector<PeerImport> out;
  std::lock_guard lk(mu_);
  for (auto it = imports_.begin(); it != imports_.end();) {
    if (!mapped(it->alloc_id)) {
      it = imports_.erase(it);
      continue;
    }
    if (!it->reported && (it->dev == dev || it->dev < 0) && it->imported.seq >= since) {
      it->reported = true;
      out.push_back(*it);
    }
    ++it;
  }
  return out;
}

// Findings about what NCCL holds (nccl_findings.cpp): phrased here, from what the model holds.
namespace nccl_findings {
// memory freed, unmapped or released while registered / in a window (free-registered) or bound
// (free-bound): `what` is the call's own description ("cudaFree of 0x.. (+N bytes)").
Finding freed_while_held(const std::string &what, const Hold &h);
Finding ended_again(const char *api, std::uint64_t comm, const EventRef &end);
Finding suspended_again(std::uint64_t comm, const EventRef &since);
Finding resume_running(std::uint64_t comm, bool known);
Finding teardown_suspended(const char *api, std::uint64_t comm, const EventRef &since,
                           const std::vector<SleepingRange> &ranges, int res);
Finding imports_after_end(const char *api, std::uint64_t comm,
                          const std::vector<PeerImport> &imports, std::uint64_t bytes);
}  // namespace nccl_findings

}  // namespace cmg
