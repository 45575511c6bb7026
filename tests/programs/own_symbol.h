// SPDX-License-Identifier: Apache-2.0
// A loaded library's own definition of a symbol, read from its .dynsym on disk plus its load base:
// no interposer (the shim included) can stand in between. The benchmarks measure the driver's own
// entry points this way, and the tests use it to stand for a library that holds a driver function
// pointer the shim never saw (fetched before the shim loaded), which issues memory behind its back.
#pragma once

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace cmg_test {

// The loaded copy of a library: its path and load bias (path empty: not loaded).
struct Loaded {
  std::string path;
  std::uintptr_t base = 0;
};

inline Loaded find_loaded(const char *name_part) {
  Loaded l;
  struct Ctx {
    const char *part;
    Loaded *out;
  } ctx{name_part, &l};
  dl_iterate_phdr(
      [](dl_phdr_info *i, std::size_t, void *p) {
        auto *c = static_cast<Ctx *>(p);
        if (i->dlpi_name && std::strstr(i->dlpi_name, c->part)) {
          c->out->path = i->dlpi_name;
          c->out->base = i->dlpi_addr;
          return 1;
        }
        return 0;
      },
      &ctx);
  return l;
}

// The address of `name` in the library's own .dynsym, or nullptr.
inline void *own_symbol(const Loaded &l, const char *name) {
  if (l.path.empty()) return nullptr;
  int fd = open(l.path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return nullptr;
  }
  auto *m = static_cast<unsigned char *>(
      mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0));
  close(fd);
  if (m == MAP_FAILED) return nullptr;
  auto *eh = reinterpret_cast<Elf64_Ehdr *>(m);
  auto *sh = reinterpret_cast<Elf64_Shdr *>(m + eh->e_shoff);
  void *res = nullptr;
  for (int s = 0; s < eh->e_shnum && !res; ++s) {
    if (sh[s].sh_type != SHT_DYNSYM) continue;
    auto *sym = reinterpret_cast<Elf64_Sym *>(m + sh[s].sh_offset);
    const char *str = reinterpret_cast<const char *>(m + sh[sh[s].sh_link].sh_offset);
    for (std::size_t k = 0; k < sh[s].sh_size / sizeof(Elf64_Sym); ++k)
      if (sym[k].st_value && sym[k].st_shndx != SHN_UNDEF &&
          std::strcmp(str + sym[k].st_name, name) == 0) {
        res = reinterpret_cast<void *>(l.base + sym[k].st_value);
        break;
      }
  }
  munmap(m, static_cast<std::size_t>(st.st_size));
  return res;
}

}  // namespace cmg_test
