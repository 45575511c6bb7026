// SPDX-License-Identifier: Apache-2.0
// The snapshot's aggregation table (see resident_table.h).
#include "resident_table.h"

#include <algorithm>
#include <bit>

namespace cmg {

ResidentTable::ResidentTable(std::size_t capacity) : cap_(std::max<std::size_t>(capacity, 1)) {
  rows_.reserve(cap_);
  // At most half full: probes stay short.
  const std::size_t n = std::bit_ceil(cap_ * 2);
  slots_.assign(n, 0);
  mask_ = n - 1;
}

std::uint64_t ResidentTable::hash(const ResidentKey &k) {
  std::uint64_t x = static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.dev)) |
                    std::uint64_t{static_cast<std::uint8_t>(k.kind)} << 32 |
                    std::uint64_t{static_cast<std::uint8_t>(k.state)} << 40;
  x ^= (std::uint64_t{k.stack} << 17) ^ (std::uint64_t{k.graph} << 47);
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

bool ResidentTable::add(const ResidentKey &k, std::uint64_t bytes) {
  for (std::uint64_t i = hash(k) & mask_;; i = (i + 1) & mask_) {
    std::uint32_t &s = slots_[i];
    if (s == 0) {
      if (rows_.size() >= cap_) return false;
      rows_.push_back(ResidentRow{k, 1, bytes});
      s = static_cast<std::uint32_t>(rows_.size());
      return true;
    }
    ResidentRow &r = rows_[s - 1];
    if (r.key == k) {
      ++r.count;
      r.bytes += bytes;
      return true;
    }
  }
}

void ResidentTable::clear() {
  rows_.clear();
  std::fill(slots_.begin(), slots_.end(), 0u);
}

}  // namespace cmg
