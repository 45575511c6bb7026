// SPDX-License-Identifier: Apache-2.0
// The launcher's LD_PRELOAD. AddressSanitizer and ThreadSanitizer abort when their runtime is not
// the first object loaded ("ASan runtime does not come first in initial library list"): a program
// built with -fsanitize=address (gcc links libasan.so dynamically by default, clang with
// -shared-libasan) lists the runtime first in DT_NEEDED, and a preloaded shim would come before
// it. So the launcher reads the program's DT_NEEDED and preloads its runtime in front of the shim.
#include "run_preload.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "regular_file.h"

namespace cmg::tools {
namespace {

std::string basename_of(const std::string &p) {
  const std::size_t slash = p.rfind('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

bool regular_executable(const std::string &p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// As execvp(): a name without a slash is looked up in PATH (default "/bin:/usr/bin").
std::string find_program(const std::string &name) {
  if (name.find('/') != std::string::npos) return name;
  const char *path = std::getenv("PATH");
  std::string dirs = path && *path ? path : "/bin:/usr/bin";
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    std::size_t colon = dirs.find(':', pos);
    if (colon == std::string::npos) colon = dirs.size();
    std::string dir = dirs.substr(pos, colon - pos);
    std::string cand = (dir.empty() ? std::string(".") : dir) + "/" + name;
    if (regular_executable(cand)) return cand;
    pos = colon + 1;
  }
  return {};
}

bool read_at(int fd, std::uint64_t off, void *buf, std::size_t n) {
  return ::pread(fd, buf, n, static_cast<off_t>(off)) == static_cast<ssize_t>(n);
}

template <class Ehdr, class Phdr, class Dyn>
std::vector<std::string> needed_of(int fd) {
  std::vector<std::string> out;
  Ehdr eh;
  if (!read_at(fd, 0, &eh, sizeof eh) || eh.e_phentsize != sizeof(Phdr) || eh.e_phnum > 4096)
    return out;
  std::vector<Phdr> ph(eh.e_phnum);
  if (!read_at(fd, eh.e_phoff, ph.data(), sizeof(Phdr) * ph.size())) return out;
  // The string table is named by its address: find the file offset through the PT_LOAD holding it.
  auto file_offset = [&](std::uint64_t vaddr, std::uint64_t &off) {
    for (const Phdr &p : ph)
      if (p.p_type == PT_LOAD && vaddr >= p.p_vaddr && vaddr < p.p_vaddr + p.p_filesz) {
        off = vaddr - p.p_vaddr + p.p_offset;
        return true;
      }
    return false;
  };
  for (const Phdr &p : ph) {
    if (p.p_type != PT_DYNAMIC || p.p_filesz > (1u << 20)) continue;
    std::vector<Dyn> dyn(p.p_filesz / sizeof(Dyn));
    if (dyn.empty() || !read_at(fd, p.p_offset, dyn.data(), dyn.size() * sizeof(Dyn))) return out;
    std::uint64_t strtab = 0, strsz = 0;
    std::vector<std::uint64_t> names;
    for (const Dyn &d : dyn) {
      if (d.d_tag == DT_NULL) break;
      if (d.d_tag == DT_STRTAB) strtab = d.d_un.d_ptr;
      if (d.d_tag == DT_STRSZ) strsz = d.d_un.d_val;
      if (d.d_tag == DT_NEEDED) names.push_back(d.d_un.d_val);
    }
    std::uint64_t off = 0;
    if (!strtab || !strsz || strsz > (16u << 20) || !file_offset(strtab, off)) return out;
    std::string table(strsz, '\0');
    if (!read_at(fd, off, table.data(), table.size())) return out;
    for (std::uint64_t n : names)
      if (n < table.size()) out.emplace_back(table.c_str() + n);
    return out;
  }
  return out;
}

// The interpreter a `#!` line names, resolved: `#!/usr/bin/env [-S] [VAR=value...] python3 -u`
// gives python3 from PATH.
// The file is read only if it is a regular one, without blocking: `#!/tmp/x` may name a FIFO.
std::string interpreter_of(const std::string &path) {
  const std::optional<std::string> head = read_regular(path, 4100);
  if (!head || head->size() < 2 || (*head)[0] != '#' || (*head)[1] != '!') return {};
  const std::size_t nl = head->find('\n');
  if (nl == std::string::npos && head->size() > 4096) return {};
  const std::string line = head->substr(2, nl == std::string::npos ? std::string::npos : nl - 2);
  if (line.size() > 4096) return {};
  std::vector<std::string> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    std::size_t j = i;
    while (j < line.size() && line[j] != ' ' && line[j] != '\t' && line[j] != '\r') ++j;
    if (j > i) words.push_back(line.substr(i, j - i));
    i = j;
  }
  if (words.empty()) return {};
  if (basename_of(words[0]) != "env") return words[0];
  for (std::size_t k = 1; k < words.size(); ++k) {
    const std::string &w = words[k];
    if (w.empty() || w[0] == '-' || w.find('=') != std::string::npos) continue;
    return find_program(w);
  }
  return {};
}

}  // namespace

bool is_sanitizer_runtime(const std::string &path) {
  const std::string base = basename_of(path);
  for (const char *p : {"libasan.", "libtsan.", "libhwasan.", "liblsan.", "libclang_rt.asan",
                        "libclang_rt.hwasan", "libclang_rt.tsan", "libclang_rt.lsan"})
    if (base.starts_with(p)) return true;
  return false;
}

std::vector<std::string> elf_needed(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return {};
  struct stat st;
  std::vector<std::string> out;
  unsigned char ident[EI_NIDENT] = {};
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && read_at(fd, 0, ident, sizeof ident) &&
      std::memcmp(ident, ELFMAG, SELFMAG) == 0 && ident[EI_DATA] == ELFDATA2LSB) {
    if (ident[EI_CLASS] == ELFCLASS64)
      out = needed_of<Elf64_Ehdr, Elf64_Phdr, Elf64_Dyn>(fd);
    else if (ident[EI_CLASS] == ELFCLASS32)
      out = needed_of<Elf32_Ehdr, Elf32_Phdr, Elf32_Dyn>(fd);
  }
  ::close(fd);
  return out;
}

std::vector<std::string> program_sanitizer_runtimes(const std::string &program) {
  std::string path = find_program(program);
  std::vector<std::string> out;
  // The kernel follows one `#!` level (an interpreter that is itself a script is refused); `env`
  // adds a second.
  for (int depth = 0; depth < 3 && !path.empty(); ++depth) {
    for (const std::string &n : elf_needed(path))
      if (is_sanitizer_runtime(n)) out.push_back(n);
    if (!out.empty()) return out;
    path = interpreter_of(path);
  }
  return out;
}

std::string preload_with(const std::string &shim, const char *old,
                         const std::vector<std::string> &runtimes) {
  std::vector<std::string> front, back;
  std::string cur;
  const std::string list = old ? old : "";
  for (std::size_t i = 0; i <= list.size(); ++i) {
    if (i == list.size() || list[i] == ':' || list[i] == ' ') {
      if (!cur.empty()) (is_sanitizer_runtime(cur) ? front : back).push_back(cur);
      cur.clear();
    } else {
      cur += list[i];
    }
  }
  for (const std::string &r : runtimes) {
    bool there = false;  // the same runtime already preloaded, by path or by name
    for (const std::string &f : front) there = there || basename_of(f) == basename_of(r);
    if (!there) front.push_back(r);
  }
  std::string out;
  for (const auto &e : front) out += e + ":";
  out += shim;
  for (const auto &e : back) out += ":" + e;
  return out;
}

}  // namespace cmg::tools
