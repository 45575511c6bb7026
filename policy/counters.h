// SPDX-License-Identifier: Apache-2.0
// Byte counters per device and memory kind (current / peak / total), lock-free: every tracked
// allocation and free moves one cell.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "event.h"

namespace cmg {

class ByteCounters {
 public:
  static constexpr int kDevices = 64;  // device ordinals 0..63; -1 (host/unknown) has its own row
  void add(int dev, MemKind kind, std::int64_t delta);
  struct Row {
    int dev;
    MemKind kind;
    std::int64_t current, peak, total;
  };
  std::vector<Row> snapshot() const;  // rows that ever saw a byte
  // The same rows without allocating (atomic loads only): usable from a signal handler.
  template <class F>
  void visit(F &&fn) const {
    for (int r = 0; r <= kDevices; ++r)
      for (int k = 0; k < kMemKinds; ++k) {
        const Cell &c = cells_[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
        const std::int64_t total = c.total.load(std::memory_order_relaxed);
        const std::int64_t cur = c.current.load(std::memory_order_relaxed);
        if (total == 0 && cur == 0) continue;
        fn(Row{r - 1, static_cast<MemKind>(k), cur, c.peak.load(std::memory_order_relaxed), total});
      }
  }
  void reset();

 private:
  static int row(int dev) { return dev < 0 ? 0 : (dev >= kDevices ? kDevices : dev + 1); }
  // One cache line per (device, kind): current, peak and total of a cell are updated together
  // (one line moves per call), and threads working on other devices or kinds never share it.
  // Exact peaks need one process-wide order of the updates of a cell, hence one line per cell
  // rather than per-thread stripes (docs/performance.md, "scaling").
  struct alignas(64) Cell {
    std::atomic<std::int64_t> current{0}, peak{0}, total{0};
  };
  std::array<std::array<Cell, kMemKinds>, kDevices + 1> cells_{};
};

}  // namespace cmg
