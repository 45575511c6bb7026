// SPDX-License-Identifier: Apache-2.0
// In-process .symtab symbolizer (see symtab.h).
#include "symtab.h"

#include <cxxabi.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "objects.h"
#include "regular_file.h"

namespace cmg::shim {
namespace {

struct Sym {
  std::uint64_t value, size;
  std::uint32_t name;
};

// One loaded object. Its symbol table is read on first need and the file mapping kept (only the
// pages of .symtab and .strtab are ever touched).
struct Module {
  std::uintptr_t lo = 0, hi = 0, base = 0;
  std::string path;
  bool loaded = false;
  const char *strtab = nullptr;
  std::size_t strsz = 0;
  std::vector<Sym> syms;  // functions, sorted by value
};

struct Cache {
  std::mutex mu;
  std::vector<Module *> modules;  // sorted by lo; entries are leaked (names point into them)
  struct Entry {
    const FrameSym *sym;
    unsigned generation;
  };
  std::unordered_map<std::uintptr_t, Entry> by_pc;
  unsigned long long subs = 0;  // dlpi_subs when the module list was last read
  unsigned generation = 0;
};

Cache &cache() {
  static Cache *c = new Cache;  // leaked on purpose: used until the last free at exit
  return *c;
}

void load_symbols(Module &m) {
  m.loaded = true;
  // The path is the one the object was loaded from, but the file there may have been replaced
  // since (deleted and re-created as a FIFO, a device): a blocking open would stop this thread,
  // under the cache's lock, and fork()'s prepare handler behind it. Regular files only.
  const RegularFile file = open_regular(m.path.c_str());
  if (file.fd < 0) return;
  const int fd = file.fd;
  if (file.size < static_cast<off_t>(sizeof(ElfW(Ehdr)))) {
    ::close(fd);
    return;
  }
  const auto size = static_cast<std::size_t>(file.size);
  void *p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return;
  const char *base = static_cast<const char *>(p);
  const auto *eh = reinterpret_cast<const ElfW(Ehdr) *>(base);
  auto fits = [&](std::uint64_t off, std::uint64_t len) {
    return off <= size && len <= size - off;
  };
  bool ok = std::memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
            eh->e_ident[EI_CLASS] == (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32) &&
            eh->e_shentsize == sizeof(ElfW(Shdr)) &&
            fits(eh->e_shoff, std::uint64_t(eh->e_shnum) * sizeof(ElfW(Shdr)));
  if (ok) {
    const auto *sh = reinterpret_cast<const ElfW(Shdr) *>(base + eh->e_shoff);
    int pick = -1;
    // .symtab has the local symbols; a stripped object still has .dynsym.
    for (int i = 0; i < eh->e_shnum && pick < 0; ++i)
      if (sh[i].sh_type == SHT_SYMTAB) pick = i;
    for (int i = 0; i < eh->e_shnum && pick < 0; ++i)
      if (sh[i].sh_type == SHT_DYNSYM) pick = i;
    // The string table must end with its terminator, or a name could run past the mapping.
    if (pick >= 0 && sh[pick].sh_link < eh->e_shnum && fits(sh[pick].sh_offset, sh[pick].sh_size) &&
        fits(sh[sh[pick].sh_link].sh_offset, sh[sh[pick].sh_link].sh_size) &&
        sh[sh[pick].sh_link].sh_size > 0 &&
        base[sh[sh[pick].sh_link].sh_offset + sh[sh[pick].sh_link].sh_size - 1] == '\0') {
      const auto &str = sh[sh[pick].sh_link];
      m.strtab = base + str.sh_offset;
      m.strsz = str.sh_size;
      const auto *sym = reinterpret_cast<const ElfW(Sym) *>(base + sh[pick].sh_offset);
      const std::size_t n = sh[pick].sh_size / sizeof(ElfW(Sym));
      for (std::size_t i = 0; i < n; ++i) {
        const unsigned type = ELF64_ST_TYPE(sym[i].st_info);
        if ((type != STT_FUNC && type != STT_GNU_IFUNC) || sym[i].st_shndx == SHN_UNDEF ||
            sym[i].st_value == 0 || sym[i].st_name >= m.strsz)
          continue;
        m.syms.push_back(Sym{sym[i].st_value, sym[i].st_size, sym[i].st_name});
      }
      std::sort(m.syms.begin(), m.syms.end(), [](const Sym &a, const Sym &b) {
        return a.value != b.value ? a.value < b.value : a.size > b.size;
      });
    }
  }
  if (m.syms.empty()) munmap(p, size);  // otherwise kept: names point into it
}

// The module holding pc, found with dl_iterate_phdr on a miss. Lock held.
Module *module_of(Cache &c, std::uintptr_t pc) {
  auto it = std::upper_bound(c.modules.begin(), c.modules.end(), pc,
                             [](std::uintptr_t v, const Module *m) { return v < m->lo; });
  if (it != c.modules.begin() && pc < (*std::prev(it))->hi) return *std::prev(it);
  struct Ctx {
    std::uintptr_t pc;
    Module found;
    bool hit = false;
    unsigned long long subs = 0;
  } ctx{pc, {}, false, 0};
  dl_iterate_phdr(
      [](dl_phdr_info *info, size_t size, void *data) -> int {
        auto *x = static_cast<Ctx *>(data);
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs))
          x->subs = info->dlpi_subs;
        const auto [lo, hi] = load_range(info);
        if (x->pc < lo || x->pc >= hi) return 0;
        x->hit = true;
        x->found.lo = lo;
        x->found.hi = hi;
        x->found.base = info->dlpi_addr;
        x->found.path = info->dlpi_name ? info->dlpi_name : "";
        return 1;
      },
      &ctx);
  if (ctx.subs != c.subs) {
    // An object was unloaded since the list was read: what was cached may name code that is
    // gone. Start over (old entries are leaked, not freed: a caller may still read one).
    c.subs = ctx.subs;
    c.modules.clear();
    ++c.generation;
  }
  if (!ctx.hit) return nullptr;
  if (ctx.found.path.empty()) {
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) ctx.found.path.assign(exe, static_cast<std::size_t>(n));
  }
  auto *m = new Module(std::move(ctx.found));
  c.modules.insert(std::upper_bound(c.modules.begin(), c.modules.end(), m->lo,
                                    [](std::uintptr_t v, const Module *x) { return v < x->lo; }),
                   m);
  return m;
}

const FrameSym *resolve(Cache &c, std::uintptr_t pc, const FlushPatterns &pats) {
  auto *f = new FrameSym;
  // A return address: the call is the instruction before it (a call may be the last
  // instruction of a function that does not return).
  const std::uintptr_t at = pc ? pc - 1 : 0;
  if (Module *m = module_of(c, at)) {
    f->module = m->path;
    f->module_base = m->base;
    if (!m->loaded) load_symbols(*m);
    const std::uint64_t rel = at - m->base;
    auto it = std::upper_bound(m->syms.begin(), m->syms.end(), rel,
                               [](std::uint64_t v, const Sym &s) { return v < s.value; });
    if (it != m->syms.begin()) {
      const Sym &s = *std::prev(it);
      if (s.size == 0 || rel < s.value + s.size) {
        f->name = m->strtab + s.name;
        f->start = m->base + s.value;
      }
    }
  }
  if (!f->name.empty()) {
    int status = -1;
    char *d = abi::__cxa_demangle(f->name.c_str(), nullptr, nullptr, &status);
    f->demangled = (status == 0 && d) ? d : f->name;
    std::free(d);
  }
  f->kind = pats.classify(f->name, f->demangled, f->module);
  return f;
}

}  // namespace

void frame_syms(const std::uintptr_t *pc, int n, const FlushPatterns &patterns,
                const FrameSym **out) {
  Cache &c = cache();
  std::lock_guard lk(c.mu);
  for (int i = 0; i < n; ++i) {
    auto it = c.by_pc.find(pc[i]);
    if (it != c.by_pc.end() && it->second.generation == c.generation) {
      out[i] = it->second.sym;
      continue;
    }
    const FrameSym *f = resolve(c, pc[i], patterns);
    // resolve() may have started a new generation: the entry belongs to the current one.
    c.by_pc[pc[i]] = Cache::Entry{f, c.generation};
    out[i] = f;
  }
}

std::string frame_text(const FrameSym &f, std::uintptr_t pc) {
  char off[32];
  const auto slash = f.module.rfind('/');
  const std::string mod = slash == std::string::npos ? f.module : f.module.substr(slash + 1);
  if (!f.demangled.empty()) {
    std::snprintf(off, sizeof off, "+0x%llx", static_cast<unsigned long long>(pc - f.start));
    return f.demangled + off + (mod.empty() ? "" : " (" + mod + ")");
  }
  if (!mod.empty()) {
    std::snprintf(off, sizeof off, "+0x%llx", static_cast<unsigned long long>(pc - f.module_base));
    return mod + off;
  }
  std::snprintf(off, sizeof off, "0x%llx", static_cast<unsigned long long>(pc));
  return off;
}

void symtab_fork_prepare() {
  cache().mu.lock();
}
void symtab_fork_parent() {
  cache().mu.unlock();
}
void symtab_fork_child() {
  cache().mu.unlock();
}

}  // namespace cmg::shim
