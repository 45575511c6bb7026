// SPDX-License-Identifier: Apache-2.0
// Which devices a process uses, and a context or memory made on one it otherwise does not use
// (finding stray-device). The classic case: a thread that never called cudaSetDevice gets device 0
// from the runtime, so a teardown or logging thread of the rank that works on device 1 creates a
// primary context (and memory) on device 0, where it takes memory from another rank's GPU.
//
// The rule, for a process that is one rank of a job (a rank in its environment, or an NCCL
// communicator): its devices are its communicators' devices; before it has one, the device of its
// first context or allocation. The first context or memory on any other device is stray, said
// once per device with the stack of the call that made it. A communicator created later on a
// device other than that first one makes the earlier device stray then. A process that is not a
// rank (one process driving several GPUs) may use any device.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "event.h"

namespace cmg {

class DeviceUse {
 public:
  static constexpr int kDevices = 64;

  // One relaxed load: every allocation asks it.
  bool seen(int dev) const {
    return dev < 0 || dev >= kDevices ||
           (seen_.load(std::memory_order_relaxed) >> static_cast<unsigned>(dev) & 1u);
  }

  struct First {
    int dev = -1;
    EventRef ev;           // the call that made the first context or memory there
    bool context = false;  // a context (cuDevicePrimaryCtxRetain), else memory
  };
  struct Verdict {
    bool stray = false;
    int home = -1;     // the process's device judged against (its first communicator's, or first)
    First home_first;  // what made the home device the first one (none when a communicator did)
  };
  // The first context or memory on `dev` (a device seen() said no to). `rank`: the process is a
  // rank of a job by its environment.
  Verdict first_use(int dev, const EventRef &ev, bool context, bool rank);
  // Communicators were created on these devices (one call can create several: ncclCommInitAll).
  // Returns the devices used before that are none of the process's communicators' devices, each
  // with its first use: stray now, said once.
  std::vector<First> communicators(std::span<const int> devs);

  void fork_child();

 private:
  bool home_locked(int dev) const;
  mutable std::mutex mu_;
  std::atomic<std::uint64_t> seen_{0};
  std::uint64_t comm_devs_ = 0;  // devices of the communicators created so far
  std::uint64_t stray_ = 0;      // devices already said to be stray
  std::vector<First> firsts_;    // in order of first use
};

}  // namespace cmg
