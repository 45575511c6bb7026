// SPDX-License-Identifier: Apache-2.0
// The address range a loaded object spans (lowest to highest PT_LOAD segment), as
// dl_iterate_phdr() shows it: the shim's own range, module records, the in-process symbolizer.
#pragma once

#include <link.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace cmg::shim {

inline std::pair<std::uintptr_t, std::uintptr_t> load_range(const dl_phdr_info *info) {
  std::uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const auto &ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    lo = std::min<std::uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
    hi = std::max<std::uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
  }
  return {lo, hi};
}

}  // namespace cmg::shim
