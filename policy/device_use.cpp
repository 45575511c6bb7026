// SPDX-License-Identifier: Apache-2.0
// Devices a process uses (see device_use.h).
#include "device_use.h"

#include <new>

namespace cmg {

namespace {
std::uint64_t bit(int dev) {
  return std::uint64_t{1} << static_cast<unsigned>(dev);
}
}  // namespace

bool DeviceUse::home_locked(int dev) const {
  if (comm_devs_) return (comm_devs_ & bit(dev)) != 0;
  return !firsts_.empty() && firsts_.front().dev == dev;
}

DeviceUse::Verdict DeviceUse::first_use(int dev, const EventRef &ev, bool context, bool rank) {
  Verdict v;
  if (dev < 0 || dev >= kDevices) return v;
  std::lock_guard lk(mu_);
  if (seen_.load(std::memory_order_relaxed) & bit(dev)) return v;  // another thread was first
  firsts_.push_back(First{dev, ev, context});
  seen_.fetch_or(bit(dev), std::memory_order_relaxed);
  if (firsts_.size() == 1 && !comm_devs_) return v;  // the first device the process uses
  if (home_locked(dev) || (!rank && !comm_devs_)) return v;
  v.stray = true;
  stray_ |= bit(dev);
  if (comm_devs_) {
    for (int d = 0; d < kDevices; ++d)
      if (comm_devs_ & bit(d)) {
        v.home = d;
        break;
      }
  } else {
    v.home = firsts_.front().dev;
    v.home_first = firsts_.front();
  }
  return v;
}

std::vector<DeviceUse::First> DeviceUse::communicators(std::span<const int> devs) {
  std::vector<First> out;
  std::lock_guard lk(mu_);
  for (int d : devs)
    if (d >= 0 && d < kDevices) comm_devs_ |= bit(d);
  if (!comm_devs_) return out;
  for (const First &f : firsts_) {
    if ((comm_devs_ & bit(f.dev)) || (stray_ & bit(f.dev))) continue;
    stray_ |= bit(f.dev);
    out.push_back(f);
  }
  return out;
}

void DeviceUse::fork_child() {
  new (&mu_) std::mutex();
  seen_.store(0, std::memory_order_relaxed);
  comm_devs_ = stray_ = 0;
  firsts_.clear();
}

}  // namespace cmg
