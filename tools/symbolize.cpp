// SPDX-License-Identifier: Apache-2.0
// Symbolization with elfutils' libdwfl on the module map a log recorded (offline: no live process).
#include "symbolize.h"

#include <cxxabi.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <unordered_map>
#include <unistd.h>

#include <fmt/format.h>

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

const Dwfl_Callbacks kOfflineCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

}  // namespace

std::string frame_text(const Frame &f) {
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
  std::unordered_map<std::uint64_t, Frame> cache;
  std::vector<std::string> warnings;

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

  bool check(int i) {
    if (checked[i]) return usable[i];
    checked[i] = true;
    const Module &m = modules[i];
    if (!dw[i]) {
      if (access(m.path.c_str(), R_OK) != 0)
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

  Frame resolve(std::uint64_t pc) {
    Frame f;
    f.pc = pc;
    int i = find(pc);
    if (i < 0) i = find_by_dwfl(pc);
    if (i < 0) {
      f.offset = pc;
      return f;
    }
    f.module = modules[i].path;
    f.offset = pc - modules[i].base;
    if (!dwfl || !check(i)) return f;
    // pc is a return address; pc - 1 lies inside the call instruction.
    const Dwarf_Addr addr = pc - 1;
    f.function = demangle(without_version(dwfl_module_addrname(dw[i], addr)).c_str());
    if (Dwfl_Line *line = dwfl_module_getsrc(dw[i], addr)) {
      int lineno = 0;
      if (const char *src = dwfl_lineinfo(line, nullptr, &lineno, nullptr, nullptr, nullptr)) {
        f.file = source_path(src, dwfl_line_comp_dir(line));
        f.line = lineno;
      }
    }
    return f;
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
  if (!use_debug_info) return;
  impl_->dwfl = dwfl_begin(&kOfflineCallbacks);
  if (!impl_->dwfl) return;
  dwfl_report_begin(impl_->dwfl);
  for (std::size_t i = 0; i < n; ++i) {
    const Module &m = impl_->modules[i];
    // base is the load bias (dlpi_addr), which is what dwfl_report_elf takes without add_p_vaddr.
    impl_->dw[i] = dwfl_report_elf(impl_->dwfl, m.path.c_str(), m.path.c_str(), -1, m.base, false);
  }
  dwfl_report_end(impl_->dwfl, nullptr, nullptr);
}

Symbolizer::~Symbolizer() = default;
Symbolizer::Symbolizer(Symbolizer &&) noexcept = default;
Symbolizer &Symbolizer::operator=(Symbolizer &&) noexcept = default;

const Frame &Symbolizer::frame(std::uint64_t pc) {
  auto it = impl_->cache.find(pc);
  if (it != impl_->cache.end()) return it->second;
  return impl_->cache.emplace(pc, impl_->resolve(pc)).first->second;
}

const std::vector<std::string> &Symbolizer::warnings() const {
  return impl_->warnings;
}

}  // namespace cmg::report
