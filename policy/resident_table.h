// SPDX-License-Identifier: Apache-2.0
// The rows of a residency snapshot (what is live, mapped, held or asleep, by device, kind and
// creating stack) and the table that adds them up. The table's storage is allocated once, before
// any lock of the model is taken: filling it while the model is visited in place never allocates,
// and when it is full the caller writes its rows out as one chunk of the snapshot and goes on
// (docs/log-format.md, `snapshot`). The report adds the chunks up again.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "event.h"

namespace cmg {

// What state the bytes of a row are in.
//  Live:     linear memory (cudaMalloc, cuMemAlloc, host, managed, async), resident;
//  Mapped:   a VMM physical allocation with at least one mapping, resident;
//  Held:     a VMM physical allocation with a live handle and no mapping: resident, reachable
//            only through the handle (a release that never came, or a wake-up's create whose map
//            failed);
//  Asleep:   a range mapped, then unmapped while its reservation was kept: not resident.
enum class Residence : std::uint8_t { Live, Mapped, Held, Asleep };
inline constexpr int kResidences = 4;
constexpr std::string_view residence_name(Residence r) {
  switch (r) {
    case Residence::Live:
      return "live";
    case Residence::Mapped:
      return "mapped";
    case Residence::Held:
      return "held";
    case Residence::Asleep:
      return "asleep";
  }
  return "?";
}
constexpr bool resident(Residence r) {
  return r != Residence::Asleep;
}

struct ResidentKey {
  std::int32_t dev = -1;  // device ordinal; -1 host memory, or not known (an asleep range)
  MemKind kind = MemKind::Linear;
  Residence state = Residence::Live;
  std::uint32_t stack = 0;  // the creating call's stack (asleep: the unmap that put it to sleep)
  std::uint32_t graph = 0;  // the stream capture that made it for a CUDA graph; 0: not a graph's
  bool operator==(const ResidentKey &) const = default;
};

struct ResidentRow {
  ResidentKey key;
  std::uint64_t count = 0, bytes = 0;
};

class ResidentTable {
 public:
  // Room for `capacity` distinct keys (at least 1), allocated here.
  explicit ResidentTable(std::size_t capacity);
  // Adds one object of `bytes` under `k`. False, with nothing added, when `k` is new and the
  // table is full: the caller drains it and adds again.
  bool add(const ResidentKey &k, std::uint64_t bytes);
  std::size_t size() const { return rows_.size(); }
  std::size_t capacity() const { return cap_; }
  bool empty() const { return rows_.empty(); }
  // The rows in the order their keys first came, then clears the table (storage kept).
  template <class F>
  void drain(F &&fn) {
    for (const ResidentRow &r : rows_) fn(r);
    clear();
  }
  const std::vector<ResidentRow> &rows() const { return rows_; }
  void clear();

 private:
  static std::uint64_t hash(const ResidentKey &k);
  std::size_t cap_;
  std::vector<ResidentRow> rows_;     // reserved to cap_: never grows past it
  std::vector<std::uint32_t> slots_;  // open addressing: row index + 1, 0 empty
  std::uint64_t mask_;
};

}  // namespace cmg
