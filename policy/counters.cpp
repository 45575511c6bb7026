// SPDX-License-Identifier: Apache-2.0
// Byte counters: see counters.h.
#include "counters.h"

namespace cmg {

void ByteCounters::add(int dev, MemKind kind, std::int64_t delta) {
  Cell &c = cells_[static_cast<std::size_t>(row(dev))][static_cast<std::size_t>(kind)];
  std::int64_t cur = c.current.fetch_add(delta, std::memory_order_relaxed) + delta;
  if (delta > 0) {
    c.total.fetch_add(delta, std::memory_order_relaxed);
    std::int64_t peak = c.peak.load(std::memory_order_relaxed);
    while (cur > peak && !c.peak.compare_exchange_weak(peak, cur, std::memory_order_relaxed)) {
    }
  }
}

std::vector<ByteCounters::Row> ByteCounters::snapshot() const {
  std::vector<Row> rows;
  visit([&](const Row &r) { rows.push_back(r); });
  return rows;
}

void ByteCounters::reset() {
  for (auto &r : cells_)
    for (auto &c : r) {
      c.current.store(0);
      c.peak.store(0);
      c.total.store(0);
    }
}

}  // namespace cmg
