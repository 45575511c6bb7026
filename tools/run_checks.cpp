// SPDX-License-Identifier: Apache-2.0
// The launcher's checks that a run will check something (see run_checks.h).
#include "run_checks.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "logname.h"
#include "options.h"
#include "logreader.h"
#include "regular_file.h"

extern char **environ;

namespace cmg::tools {
namespace {

// The ELF class and byte order of this program: ld.so preloads only objects of its own.
constexpr unsigned char kClass = sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kData =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

// True when the dynamic symbol table of e defines `name` (a symbol with a section, not an
// undefined reference to it).
bool defines_dynamic(Elf *e, const char *name) {
  for (Elf_Scn *scn = nullptr; (scn = elf_nextscn(e, scn));) {
    GElf_Shdr sh;
    if (!gelf_getshdr(scn, &sh) || sh.sh_type != SHT_DYNSYM || !sh.sh_entsize) continue;
    Elf_Data *d = elf_getdata(scn, nullptr);
    if (!d) return false;
    const std::size_t n = sh.sh_size / sh.sh_entsize;
    for (std::size_t i = 0; i < n; ++i) {
      GElf_Sym s;
      if (!gelf_getsym(d, static_cast<int>(i), &s) || s.st_shndx == SHN_UNDEF) continue;
      const char *sym = elf_strptr(e, sh.sh_link, s.st_name);
      if (sym && std::strcmp(sym, name) == 0) return true;
    }
  }
  return false;
}

std::string elf_problem(int fd) {
  elf_version(EV_CURRENT);
  Elf *e = elf_begin(fd, ELF_C_READ, nullptr);
  if (!e || elf_kind(e) != ELF_K_ELF) {
    if (e) elf_end(e);
    return "it is not an ELF file";
  }
  std::string why;
  std::size_t n = 0;
  const char *ident = elf_getident(e, &n);
  GElf_Ehdr eh;
  if (!ident || n < EI_NIDENT || !gelf_getehdr(e, &eh))
    why = "it is not a readable ELF file";
  else if (static_cast<unsigned char>(ident[EI_CLASS]) != kClass ||
           static_cast<unsigned char>(ident[EI_DATA]) != kData)
    why = std::string("it is an ELF object of another class (") +
          (ident[EI_CLASS] == ELFCLASS64 ? "64" : "32") + "-bit) than this machine's";
  else if (eh.e_type != ET_DYN)
    why = "it is not an ELF shared object";
  else if (!defines_dynamic(e, kShimMarker))
    why = std::string("it defines no ") + kShimMarker + " symbol";
  elf_end(e);
  return why;
}

}  // namespace

std::string disabled_warning(bool gate) {
  const ParsedOptions p = parse_options(environ);
  if (!p.options.disable) return {};
  std::string set = "CUMEMGUARD_DISABLE";
  for (const OptionValue &v : p.values)
    if (v.spec->name == "DISABLE")
      set = v.source == OptionSource::Options ? "CUMEMGUARD_OPTIONS=...disable=" + shown(v.raw)
                                              : "CUMEMGUARD_DISABLE=" + shown(v.raw);
  std::string line = "warning: " + set + ": the shim is disabled and checks nothing in this run";
  if (gate) line += "; a run that checks nothing fails --error-exitcode";
  return line;
}

std::string unloaded_warning(std::size_t records, std::size_t loaded, int gate) {
  if (records || loaded) return {};
  std::string line = "warning: no process of the run loaded the shim (ld.so ignores LD_PRELOAD "
                     "for a static or setuid program): nothing was checked";
  if (gate) line += "; exiting " + std::to_string(gate) + " (--error-exitcode)";
  return line;
}

std::string shim_file_problem(const std::string &path) {
  // Opened without blocking: the path may name a FIFO.
  const RegularFile f = open_regular(path.c_str());
  if (f.fd < 0) return std::string("it cannot be read (") + f.why + ")";
  std::string why = elf_problem(f.fd);
  ::close(f.fd);
  return why;
}

std::string log_name_problem(const std::string &pattern) {
  cmg::shim::LogNameInputs in;
  in.getenv = [](const char *n) -> const char * { return std::getenv(n); };
  const auto unknown = cmg::shim::expand_log_name(pattern, in).unknown;
  return unknown.empty() ? std::string() : unknown[0];
}

std::string log_overwrite_problem(const std::string &path) {
  struct stat st;
  if (path.find('%') != std::string::npos || ::lstat(path.c_str(), &st) != 0 ||
      !S_ISREG(st.st_mode) || st.st_size == 0)
    return {};
  const std::optional<std::string> head = read_regular(path, 64 * 1024);
  if (!head) return {};  // unreadable: the open for writing says why, or the shim does
  if (report::is_log_header(head->substr(0, head->find('\n')))) return {};
  return "it exists and is not a cumemguard event log (remove it, or name another log)";
}

}  // namespace cmg::tools
