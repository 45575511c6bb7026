// SPDX-License-Identifier: Apache-2.0
// Symbolization with elfutils' libdwfl on the module map a log recorded (offline: no live process).
#include "symbolize.h"

#include <cxxabi.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_map>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "regular_file.h"

namespace cmg::report {
namespace {

std::string demangle(const char *name) {
  if (!name) return {};
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char *d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d) {
      std::string out(d);
      std::free(d);
      return out;
    }
    std::free(d);
  }
  return name;
}

// ELF symbol versions ("__libc_start_main@@GLIBC_2.34") say nothing about the frame.
std::string without_version(const char *name) {
  if (!name) return {};
  const char *at = std::strchr(name, '@');
  return at ? std::string(name, at) : std::string(name);
}

// DWARF 5 line tables name files relative to the compilation directory; make them absolute so the
// file can be opened from anywhere.
std::string source_path(const char *file, const char *comp_dir) {
  std::filesystem::path p(file);
  if (p.is_relative() && comp_dir && *comp_dir) p = std::filesystem::path(comp_dir) / p;
  return p.lexically_normal().string();
}

std::string basename_of(const std::string &path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string hex_bytes(const unsigned char *p, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += fmt::format("{:02x}", p[i]);
  return out;
}

// NULL means libdwfl's default search (/usr/lib/debug, .gnu_debuglink next to the file).
char *g_debuginfo_path = nullptr;

// Where the symbolizer looking up a module now keeps its warnings (set by resolve()).
thread_local std::vector<std::string> *t_warnings = nullptr;

// libdwfl's standard search for a module's separate debug information opens each candidate with
// a blocking open(2): the .gnu_debuglink name (or FILE.debug) beside the module, in .debug/ there
// and under /usr/lib/debug (elfutils 0.188, libdwfl/find-debuginfo.c, DEFAULT_DEBUGINFO_PATH
// ":.debug:/usr/lib/debug"). A FIFO planted at one of them beside a module the log names stopped
// the report. Those paths are looked at first; when one is there and is not a regular file, the
// module is read without separate debug information.
int find_debuginfo(Dwfl_Module *mod, void **userdata, const char *modname, GElf_Addr base,
                   const char *file_name, const char *debuglink_file, GElf_Word debuglink_crc,
                   char **debuginfo_file_name) {
  if (file_name && *file_name) {
    const std::string file(file_name);
    const auto slash = file.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : file.substr(0, slash);
    const std::string link =
        debuglink_file && *debuglink_file ? debuglink_file : basename_of(file) + ".debug";
    std::string tried[3] = {dir + "/" + link, dir + "/.debug/" + link, {}};
    if (!dir.empty() && dir[0] == '/') tried[2] = "/usr/lib/debug" + dir + "/" + link;
    for (const std::string &c : tried) {
      struct stat st {};
      if (c.empty() || ::stat(c.c_str(), &st) != 0 || S_ISREG(st.st_mode)) continue;
      if (t_warnings)
        t_warnings->push_back(
            fmt::format("{}: not a regular file; the debug information of {} is not looked for",
                        clean(c), clean(file)));
      return -1;
    }
  }
  return dwfl_standard_find_debuginfo(mod, userdata, modname, base, file_name, debuglink_file,
                                      debuglink_crc, debuginfo_file_name);
}

const Dwfl_Callbacks kOfflineCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

// The module file as a descriptor for libdwfl: -1 when it cannot be opened, -2 when it is not a
// regular file of some size.
int open_module(const std::string &path) {
  const RegularFile f = open_regular(path.c_str());
  if (f.fd < 0) return f.error ? -1 : -2;
  if (f.size <= 0) {
    ::close(f.fd);
    return -2;
  }
  return f.fd;
}

}  // namespace

std::vector<Frame> merge_python(std::vector<std::vector<Frame>> native, const PyStackRec *py,
                                const std::unordered_map<std::uint64_t, PyCode> &codes) {
  std::vector<Frame> out;
  std::size_t next = 0;  // the next Python frame to place
  auto python = [&](const PyFrameRef &r) {
    Frame f;
    f.kind = Frame::Kind::Python;
    f.line = r.line;
    if (auto it = codes.find(r.code); it != codes.end()) {
      f.function = it->second.name;
      f.file = it->second.file;
    } else {
      f.function = fmt::format("<python code {} not in the log>", r.code);
    }
    out.push_back(std::move(f));
  };
  for (std::size_t i = 0; i < native.size(); ++i) {
    bool replaced = false;
    while (py && next < py->frames.size() && py->frames[next].at == i) {
      python(py->frames[next++]);
      replaced = true;
    }
    if (!replaced) out.insert(out.end(), native[i].begin(), native[i].end());
  }
  while (py && next < py->frames.size()) python(py->frames[next++]);
  if (py && !py->end.empty()) {
    Frame m;
    m.kind = Frame::Kind::Marker;
    m.function = py->end;
    out.push_back(std::move(m));
  }
  return out;
}

std::string frame_text(const Frame &f) {
  if (f.kind == Frame::Kind::Python) {
    if (f.file.empty()) return fmt::format("{} (line {})", f.function, f.line);
    return f.line > 0 ? fmt::format("{} ({}:{})", f.function, f.file, f.line)
                      : fmt::format("{} ({})", f.function, f.file);
  }
  if (f.kind == Frame::Kind::Marker)
    return f.function == "truncated" ? "... (deeper Python frames not recorded)"
                                     : fmt::format("... (Python frames end here: {})", f.function);
  std::string where = f.module.empty() ? fmt::format("0x{:x}", f.pc)
                                       : fmt::format("{}+0x{:x}", basename_of(f.module), f.offset);
  if (f.function.empty()) {
    if (!f.file.empty()) return fmt::format("{} ({}:{})", where, f.file, f.line);
    return where;
  }
  if (!f.file.empty()) return fmt::format("{} ({}:{})", f.function, f.file, f.line);
  return fmt::format("{} ({})", f.function, where);
}

struct Symbolizer::Impl {
  std::vector<Module> modules;  // sorted by base
  Dwfl *dwfl = nullptr;
  // Index into `modules` -> its libdwfl module, null when the file could not be used.
  std::vector<Dwfl_Module *> dw;
  std::vector<bool> checked;  // build-id compared / warning emitted
  std::vector<bool> usable;
  // Per module, built on first need: address ranges of its compile units, sorted by start.
  struct CuRange {
    Dwarf_Addr start, end;
    Dwarf_Off die;
  };
  std::vector<std::optional<std::vector<CuRange>>> cu_ranges;
  std::unordered_map<std::uint64_t, std::vector<Frame>> cache;
  std::vector<std::string> warnings;
  std::vector<bool> not_regular;  // the path names a FIFO, a device, a directory

  ~Impl() {
    if (dwfl) dwfl_end(dwfl);
  }

  // The module a pc falls in by the recorded map: [base, base+size), the highest base wins.
  int find(std::uint64_t pc) const {
    int best = -1;
    for (std::size_t i = 0; i < modules.size(); ++i) {
      const auto &m = modules[i];
      if (m.base <= pc && (m.size == 0 || pc - m.base < m.size)) best = static_cast<int>(i);
    }
    return best;
  }

  // A non-PIE executable has base 0 and starts at its lowest PT_LOAD, which the log does not say;
  // libdwfl read the file and knows the real range.
  int find_by_dwfl(std::uint64_t pc) const {
    if (!dwfl) return -1;
    Dwfl_Module *m = dwfl_addrmodule(dwfl, pc);
    if (!m) return -1;
    for (std::size_t i = 0; i < dw.size(); ++i)
      if (dw[i] == m) return static_cast<int>(i);
    return -1;
  }

  // The compile unit whose ranges hold `rel` (an address in the module's DWARF). Only such a unit
  // may give the line: libdwfl's own lookup takes the unit that starts below the address, so code
  // without debug info (crt1's _start) would get the last line of whatever unit precedes it.
  // dwarf_addrdie checks ranges but needs .debug_aranges, which clang does not emit by default
  // (libdw 0.188 does not build them from the units), so without them the units are indexed here.
  bool find_cu(int i, Dwarf *dwarf, Dwarf_Addr rel, Dwarf_Die &cu) {
    if (dwarf_addrdie(dwarf, rel, &cu)) return true;
    auto &index = cu_ranges[i];
    if (!index) {
      index.emplace();
      Dwarf_Off off = 0, next = 0;
      std::size_t header = 0;
      while (dwarf_nextcu(dwarf, off, &next, &header, nullptr, nullptr, nullptr) == 0) {
        Dwarf_Die die;
        if (dwarf_offdie(dwarf, off + header, &die)) {
          Dwarf_Addr base = 0, start = 0, end = 0;
          for (ptrdiff_t o = 0; (o = dwarf_ranges(&die, o, &base, &start, &end)) > 0;)
            if (start < end) index->push_back({start, end, off + header});
        }
        off = next;
      }
      std::sort(index->begin(), index->end(),
                [](const CuRange &a, const CuRange &b) { return a.start < b.start; });
    }
    auto it = std::upper_bound(index->begin(), index->end(), rel,
                               [](Dwarf_Addr a, const CuRange &r) { return a < r.start; });
    if (it == index->begin() || rel >= std::prev(it)->end) return false;
    return dwarf_offdie(dwarf, std::prev(it)->die, &cu) != nullptr;
  }

  static const char *comp_dir(Dwarf_Die *cu) {
    Dwarf_Attribute attr;
    return dwarf_formstring(dwarf_attr(cu, DW_AT_comp_dir, &attr));
  }

  bool check(int i) {
    if (checked[i]) return usable[i];
    checked[i] = true;
    const Module &m = modules[i];
    if (!dw[i]) {
      if (not_regular[i])
        warnings.push_back(fmt::format(
            "{}: not a regular file; its frames are shown as module+offset", m.path));
      else if (access(m.path.c_str(), R_OK) != 0)
        warnings.push_back(
            fmt::format("{}: not found here; its frames are shown as module+offset", m.path));
      else
        warnings.push_back(
            fmt::format("{}: cannot be read as ELF; its frames are shown as "
                        "module+offset",
                        m.path));
      return usable[i] = false;
    }
    if (!m.build_id.empty()) {
      const unsigned char *bits = nullptr;
      GElf_Addr vaddr = 0;
      int n = dwfl_module_build_id(dw[i], &bits, &vaddr);
      std::string have = n > 0 ? hex_bytes(bits, n) : std::string();
      std::string want = m.build_id;
      std::transform(want.begin(), want.end(), want.begin(), ::tolower);
      if (have != want) {
        warnings.push_back(
            fmt::format("{}: build-id {} differs from the run's {}; its frames are "
                        "shown as module+offset",
                        m.path, have.empty() ? "(none)" : have, want));
        return usable[i] = false;
      }
    }
    return usable[i] = true;
  }

  std::vector<Frame> resolve(std::uint64_t pc) {
    struct Warn {  // the debuginfo callback's warnings go here while this lookup runs
      explicit Warn(std::vector<std::string> *w) { t_warnings = w; }
      ~Warn() { t_warnings = nullptr; }
    } warn(&warnings);
    Frame f;
    f.pc = pc;
    int i = find(pc);
    if (i < 0) i = find_by_dwfl(pc);
    if (i < 0) {
      f.offset = pc;
      return {f};
    }
    f.module = modules[i].path;
    f.offset = pc - modules[i].base;
    if (!dwfl || !check(i)) return {f};
    // pc is a return address; pc - 1 lies inside the call instruction.
    const Dwarf_Addr addr = pc - 1;
    // Names and paths come from a file the log named: escaped like the log's own text.
    f.function = clean(demangle(without_version(dwfl_module_addrname(dw[i], addr)).c_str()));
    Dwarf_Addr bias = 0;
    Dwarf *dwarf = dwfl_module_getdwarf(dw[i], &bias);
    Dwarf_Die cu;
    if (!dwarf || !find_cu(i, dwarf, addr - bias, cu)) return {f};
    if (Dwarf_Line *line = dwarf_getsrc_die(&cu, addr - bias)) {
      int lineno = 0;
      if (const char *src = dwarf_linesrc(line, nullptr, nullptr);
          src && dwarf_lineno(line, &lineno) == 0) {
        f.file = clean(source_path(src, comp_dir(&cu)));
        f.line = lineno;
      }
    }
    return with_inlined(&cu, addr - bias, std::move(f));
  }

  // Optimized code inlines heavily: the line table then names a line of the inlined callee while
  // the symbol is the function it was inlined into. Each DW_TAG_inlined_subroutine scope around
  // the address becomes a frame of its own, as in ASan and heaptrack, and the outer function gets
  // the line of the inlined call (DW_AT_call_file/DW_AT_call_line).
  // `addr` is relative to the module's DWARF (bias removed); `cu` covers it.
  static std::vector<Frame> with_inlined(Dwarf_Die *cu, Dwarf_Addr addr, Frame f) {
    std::vector<Frame> out;
    Dwarf_Die *scopes = nullptr;
    const int n = dwarf_getscopes(cu, addr, &scopes);
    std::string file = f.file;
    int line = f.line;
    for (int s = 0; s < n; ++s) {
      const int tag = dwarf_tag(&scopes[s]);
      if (tag == DW_TAG_subprogram) break;
      if (tag != DW_TAG_inlined_subroutine) continue;
      Frame in = f;
      in.function = clean(die_function(&scopes[s]));
      in.file = file;
      in.line = line;
      in.inlined = true;
      out.push_back(std::move(in));
      call_site(cu, &scopes[s], file, line);
    }
    std::free(scopes);
    f.file = file;
    f.line = line;
    out.push_back(std::move(f));
    return out;
  }

  // The linkage name demangles to the qualified name with parameters, like the symbol table's.
  static std::string die_function(Dwarf_Die *die) {
    Dwarf_Attribute attr;
    for (int at : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
      if (dwarf_attr_integrate(die, at, &attr))
        if (const char *s = dwarf_formstring(&attr)) return demangle(s);
    }
    if (dwarf_attr_integrate(die, DW_AT_name, &attr))
      if (const char *s = dwarf_formstring(&attr)) return s;
    return "??";
  }

  static void call_site(Dwarf_Die *cu, Dwarf_Die *inlined, std::string &file, int &line) {
    Dwarf_Attribute attr;
    Dwarf_Word v = 0;
    line = dwarf_formudata(dwarf_attr(inlined, DW_AT_call_line, &attr), &v) == 0
               ? static_cast<int>(v)
               : 0;
    file.clear();
    Dwarf_Files *files = nullptr;
    std::size_t nfiles = 0;
    if (dwarf_formudata(dwarf_attr(inlined, DW_AT_call_file, &attr), &v) == 0 &&
        dwarf_getsrcfiles(cu, &files, &nfiles) == 0 && v < nfiles) {
      if (const char *src = dwarf_filesrc(files, v, nullptr, nullptr)) {
        file = clean(source_path(src, comp_dir(cu)));
      }
    }
  }
};

Symbolizer::Symbolizer(const std::vector<Module> &modules, bool use_debug_info)
    : impl_(std::make_unique<Impl>()) {
  impl_->modules = modules;
  std::stable_sort(impl_->modules.begin(), impl_->modules.end(),
                   [](const Module &a, const Module &b) { return a.base < b.base; });
  const std::size_t n = impl_->modules.size();
  impl_->dw.assign(n, nullptr);
  impl_->checked.assign(n, false);
  impl_->usable.assign(n, false);
  impl_->cu_ranges.resize(n);
  impl_->not_regular.assign(n, false);
  if (!use_debug_info) return;
  impl_->dwfl = dwfl_begin(&kOfflineCallbacks);
  if (!impl_->dwfl) return;
  dwfl_report_begin(impl_->dwfl);
  for (std::size_t i = 0; i < n; ++i) {
    const Module &m = impl_->modules[i];
    // A log is input the report does not control: a `module` naming a FIFO made libdwfl's open
    // block forever, and a device would be read without end. Only a regular file, opened without
    // blocking, reaches libdwfl (which takes the descriptor).
    const int fd = open_module(m.path);
    if (fd < 0) {
      impl_->not_regular[i] = fd == -2;
      continue;
    }
    // base is the load bias (dlpi_addr), which is what dwfl_report_elf takes without add_p_vaddr.
    impl_->dw[i] = dwfl_report_elf(impl_->dwfl, m.path.c_str(), m.path.c_str(), fd, m.base, false);
    if (!impl_->dw[i]) ::close(fd);
  }
  dwfl_report_end(impl_->dwfl, nullptr, nullptr);
}

Symbolizer::~Symbolizer() = default;
Symbolizer::Symbolizer(Symbolizer &&) noexcept = default;
Symbolizer &Symbolizer::operator=(Symbolizer &&) noexcept = default;

const std::vector<Frame> &Symbolizer::frames(std::uint64_t pc) {
  auto it = impl_->cache.find(pc);
  if (it != impl_->cache.end()) return it->second;
  return impl_->cache.emplace(pc, impl_->resolve(pc)).first->second;
}

const std::vector<std::string> &Symbolizer::warnings() const {
  return impl_->warnings;
}

}  // namespace cmg::report
