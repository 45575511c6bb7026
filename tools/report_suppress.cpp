// SPDX-License-Identifier: Apache-2.0
// `cumemguard report --gen-suppressions`: for each finding group the report shows, a rule for the
// file CUMEMGUARD_SUPPRESSIONS names (CLASS:PATTERN, matched against each frame's function name or
// module), in the spirit of valgrind's --gen-suppressions. The pattern names the first frame that
// is not cumemguard's, CUDA's or libc's own: the code that made the call. In a Python program that
// is the innermost Python frame of the program's own files (never ctypes' libffi, the interpreter,
// the standard library or an installed package), named by its qualified function name.
#include <set>

#include <fmt/format.h>

#include "program_frame.h"
#include "report_model.h"

namespace cmg::report {
namespace {

std::string basename_of(const std::string &path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The shim, the CUDA libraries and libc sit below every call site: never the frame to name.
bool infrastructure(const std::string &module) {
  const std::string b = basename_of(module);
  for (const char *p : {"libcumemguard", "libcuda.so", "libcuda-", "libcudart", "libc.so", "libc-"})
    if (b.rfind(p, 0) == 0) return true;
  return false;
}

// Glob metacharacters in a name stand for themselves only by luck: `?` matches any character,
// so a literal one still matches itself, and `*` is replaced by `?` for the same reason.
std::string as_pattern(std::string s) {
  for (auto &c : s)
    if (c == '*') c = '?';
  return s;
}

}  // namespace

void write_suppressions(const Model &m, std::ostream &out) {
  out << "# cumemguard suppressions (CUMEMGUARD_SUPPRESSIONS=FILE): one CLASS:PATTERN per line\n";
  std::size_t groups = 0;
  std::set<std::string> written;
  for (const auto &c : m.findings) {
    if (c.cls == "leak") continue;
    for (const auto &g : c.groups) {
      ++groups;
      const Event &e = g.example.event;
      out << fmt::format("# {} finding{} of {}, first at seq {} in pid {}\n", g.count,
                         g.count == 1 ? "" : "s", c.cls, e.seq,
                         m.logs[g.example.log].header.pid);
      const ResolvedStack &s = m.stack(g.stack);
      std::string name;
      for (const Frame &f : s.frames)
        if (f.kind == Frame::Kind::Python && python_program_file(f.file) && !f.function.empty()) {
          name = f.function;
          break;
        }
      for (const Frame &f : s.frames) {
        if (!name.empty()) break;
        if (f.kind != Frame::Kind::Native) continue;
        if (!f.module.empty() && infrastructure(f.module)) continue;
        if (!f.function.empty()) name = f.function;
        else if (!f.module.empty()) name = basename_of(f.module);
        else continue;  // a bare address names nothing another run would match
        break;
      }
      if (name.empty()) {
        out << (s.id ? "#   (no frame outside cumemguard, CUDA and libc to name)\n"
                     : "#   (no stack recorded: run with CUMEMGUARD_STACKS to get one)\n");
        continue;
      }
      const std::string rule = c.cls + ':' + as_pattern(name);
      if (written.insert(rule).second)
        out << rule << '\n';
      else
        out << "#   (" << rule << " above covers it)\n";
    }
  }
  if (groups == 0) out << "# (no findings to suppress)\n";
}

}  // namespace cmg::report
