// SPDX-License-Identifier: Apache-2.0
// Interposers loaded before the shim: see interposers.h.
#include "interposers.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <cstring>

#include "cuda_api.h"
#include "loader.h"

namespace cmg::shim {
namespace {

struct Object {
  std::string path;
  std::uintptr_t lo = 0, hi = 0;
};

// The loader's objects in search order, up to the shim itself (not included). Index 0 is the main
// program: its own definitions (a static cudart) are not another interposer.
std::vector<Object> objects_before_self() {
  std::vector<Object> all;
  dl_iterate_phdr(
      [](dl_phdr_info *info, std::size_t, void *p) {
        auto &v = *static_cast<std::vector<Object> *>(p);
        Object o;
        o.path = info->dlpi_name ? info->dlpi_name : "";
        std::uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto &ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_LOAD) continue;
          lo = std::min<std::uintptr_t>(lo, info->dlpi_addr + ph.p_vaddr);
          hi = std::max<std::uintptr_t>(hi, info->dlpi_addr + ph.p_vaddr + ph.p_memsz);
        }
        o.lo = lo;
        o.hi = hi;
        v.push_back(std::move(o));
        return 0;
      },
      &all);
  std::vector<Object> out;
  for (std::size_t i = 1; i < all.size(); ++i) {
    if (in_self(reinterpret_cast<const void *>(all[i].lo))) break;
    if (!all[i].path.empty()) out.push_back(all[i]);
  }
  return out;
}

}  // namespace

std::vector<Interposer> interposers_before() {
  std::vector<Interposer> found;
  for (const Object &o : objects_before_self()) {
    void *h = dlopen(o.path.c_str(), RTLD_LAZY | RTLD_NOLOAD);
    if (!h) continue;
    Interposer i{o.path, {}};
    for (std::size_t a = 0; a < kApiCount; ++a) {
      if (kApis[a].family == Family::Nccl) continue;  // NCCL is reached by handle, not interposed
      // A handle-scoped lookup also searches the object's dependencies: only a definition inside
      // the object itself counts.
      auto p = reinterpret_cast<std::uintptr_t>(real_dlsym(h, kApis[a].name));
      if (p >= o.lo && p < o.hi) i.names.push_back(kApis[a].name);
    }
    dlclose(h);  // drops only the reference NOLOAD added
    const char *base = std::strrchr(o.path.c_str(), '/');
    base = base ? base + 1 : o.path.c_str();
    // The real CUDA libraries ahead of the shim (a program linked with them and preloading
    // nothing else) are not interposers.
    if (std::strncmp(base, "libcuda.so", 10) == 0 || std::strncmp(base, "libcudart.so", 12) == 0)
      continue;
    if (!i.names.empty()) found.push_back(std::move(i));
  }
  return found;
}

std::string interposer_note(const Interposer &i) {
  std::string names;
  for (std::size_t k = 0; k < i.names.size() && k < 6; ++k)
    names += (k ? ", " : "") + std::string(i.names[k]);
  if (i.names.size() > 6) names += " and " + std::to_string(i.names.size() - 6) + " more";
  return i.path + " is loaded before cumemguard and defines " + names +
         ": the program's calls reach it first, and cumemguard sees only the calls it passes on "
         "(what it answers itself, its own out-of-memory for instance, is in neither the log nor "
         "the summary); put libcumemguard.so first in LD_PRELOAD to see every call";
}

}  // namespace cmg::shim
