// SPDX-License-Identifier: Apache-2.0
// `cumemguard report --gen-suppressions`: for each finding group the report shows, a rule for the
// file CUMEMGUARD_SUPPRESSIONS names, in the spirit of valgrind's --gen-suppressions. The rule is
// anchored (CLASS:^F1;F2;...; policy/suppressions.h): the group's stack from its call site, one
// glob a frame, so it suppresses that stack and no other that merely passes through its frames.
// A Python stack is named by its Python frames (FUNCTION@FILE: qualified name and the file's
// path), a native one by its frames past the shim's, CUDA's and libc's, each by FUNCTION@MODULE
// (the module's basename; libc's and CUDA's by module basename alone), else module basename, else
// `*`. A function name alone matched that name in any file: `double-free:^main;<module>` silenced
// a double free from any script's main().
#include <set>
#include <vector>

#include <fmt/format.h>

#include "report_model.h"
#include "suppressions.h"

namespace cmg::report {
namespace {

std::string basename_of(const std::string &path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Glob metacharacters in a name stand for themselves only by luck: `?` matches any character,
// so a literal one still matches itself, and `*` is replaced by `?` for the same reason; `;`
// separates the frames of the rule and `@` a frame's function from its file, so each is one
// character too.
std::string as_pattern(std::string s) {
  for (auto &c : s)
    if (c == '*' || c == ';' || c == '@') c = '?';
  return s;
}

// The globs of the anchored rule for `s`, as the shim will see the stack (suppressions.h): one
// per return address (the frames libdw adds for inlined calls share their address and are not
// the shim's), at most kSuppressionFrames of them.
std::vector<std::string> stack_globs(const ResolvedStack &s) {
  std::vector<std::string> globs;
  bool python = false;
  for (const Frame &f : s.frames) python = python || f.kind == Frame::Kind::Python;
  std::size_t native = 0;
  bool started = false;
  for (const Frame &f : s.frames) {
    if (f.kind == Frame::Kind::Marker) break;
    if (python) {
      // A code object the log never defined has no name here, though the shim will see one.
      if (f.kind == Frame::Kind::Python)
        globs.push_back(f.function.empty() || f.file.empty()
                            ? "*"
                            : as_pattern(f.function) + "@" + as_pattern(f.file));
      continue;
    }
    if (f.inlined) continue;
    if (++native > static_cast<std::size_t>(kSuppressionFrames)) break;
    const bool infrastructure = suppression_infrastructure(f.module);
    if (!started && infrastructure) continue;
    started = true;
    // libc's and CUDA's own functions by their module: the report may read names there (a
    // local symbol, a debug file) that the shim's symbol table lacks.
    globs.push_back(infrastructure ? as_pattern(basename_of(f.module))
                    : !f.function.empty() && !f.module.empty()
                        ? as_pattern(f.function) + "@" + as_pattern(basename_of(f.module))
                    : !f.function.empty() ? as_pattern(f.function)
                    : !f.module.empty()   ? as_pattern(basename_of(f.module))
                                          : std::string("*"));
  }
  return globs;
}

}  // namespace

void write_suppressions(const Model &m, std::ostream &out) {
  out << "# cumemguard suppressions (CUMEMGUARD_SUPPRESSIONS=FILE): one CLASS:PATTERN per line;\n"
         "# CLASS:^F1;F2;... spells the finding's stack from its call site, one glob per frame,\n"
         "# FUNCTION@FILE naming the frame's function and its file or module\n";
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
      const std::vector<std::string> globs = stack_globs(s);
      if (globs.empty()) {
        out << (s.id ? "#   (no frame outside cumemguard, CUDA and libc to name)\n"
                     : "#   (no stack recorded: run with CUMEMGUARD_STACKS to get one)\n");
        continue;
      }
      std::string rule = c.cls + ":^";
      for (std::size_t i = 0; i < globs.size(); ++i) rule += (i ? ";" : "") + globs[i];
      if (written.insert(rule).second)
        out << rule << '\n';
      else
        out << "#   (" << rule << " above covers it)\n";
    }
  }
  if (groups == 0) out << "# (no findings to suppress)\n";
}

}  // namespace cmg::report
