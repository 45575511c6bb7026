// SPDX-License-Identifier: Apache-2.0
// Suppression file parser and matcher (see suppressions.h).
#include "suppressions.h"

#include "findings.h"
#include "options.h"

namespace cmg {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string_view basename_of(std::string_view path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

bool frame_matches(std::string_view glob, const SuppressionFrame &f) {
  return (!f.function.empty() && glob_match(glob, f.function)) ||
         (!f.module.empty() &&
          (glob_match(glob, f.module) || glob_match(glob, basename_of(f.module)))) ||
         (f.function.empty() && f.module.empty() && glob == "*");  // a frame nothing names
}

// In an anchored rule, `FUNCTION@FILE` names one frame by both: its function and its module (or a
// Python frame's file, by path or basename). A glob that matches as a whole still does, so a
// frame string holding `@` of its own (a versioned symbol) means what it meant.
bool anchored_frame_matches(std::string_view glob, const SuppressionFrame &f) {
  if (frame_matches(glob, f)) return true;
  const std::size_t at = glob.find('@');
  if (at == std::string_view::npos || f.function.empty() || f.module.empty()) return false;
  const std::string_view fn = glob.substr(0, at), mod = glob.substr(at + 1);
  return glob_match(fn, f.function) &&
         (glob_match(mod, f.module) || glob_match(mod, basename_of(f.module)));
}

// `^G1;G2;...`: the stack from its call site begins with frames matching G1, G2, ... in order.
bool stack_matches(std::string_view globs, std::span<const SuppressionFrame> frames) {
  std::size_t first = frames.size();
  for (std::size_t i = 0; i < frames.size() && first == frames.size(); ++i)
    if (frames[i].python) first = i;
  const bool python = first < frames.size();
  if (!python) {
    first = 0;
    while (first < frames.size() && suppression_infrastructure(frames[first].module)) ++first;
  }
  std::size_t at = first;
  while (true) {
    const std::size_t semi = globs.find(';');
    const std::string_view glob = globs.substr(0, semi);
    while (python && at < frames.size() && !frames[at].python) ++at;  // Python frames only
    if (at >= frames.size() || !anchored_frame_matches(glob, frames[at])) return false;
    ++at;
    if (semi == std::string_view::npos) return true;
    globs.remove_prefix(semi + 1);
  }
}

}  // namespace

bool suppression_infrastructure(std::string_view module) {
  const std::string_view b = basename_of(module);
  for (std::string_view p :
       {"libcumemguard", "libcuda.so", "libcuda-", "libcudart", "libc.so", "libc-"})
    if (b.starts_with(p)) return true;
  return false;
}

bool glob_match(std::string_view p, std::string_view s) {
  std::size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi, ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

Suppressions Suppressions::parse(std::string_view text, std::string_view file) {
  Suppressions r;
  std::size_t bad = 0, line_no = 0;
  auto warn = [&](std::string why) {
    if (++bad <= kMaxProblemsPerKind)
      r.warnings.push_back(std::string(file) + ":" + std::to_string(line_no) + ": " + why +
                           "; skipped");
  };
  while (!text.empty()) {
    ++line_no;
    const std::size_t nl = text.find('\n');
    std::string_view line = trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    if (line.empty() || line.front() == '#') continue;
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) {
      warn("'" + shown(line) + "' is not CLASS:PATTERN");
      continue;
    }
    const std::string_view cls = trim(line.substr(0, colon));
    const std::string_view pattern = trim(line.substr(colon + 1));
    if (cls != "*" && !finding_from_id(cls)) {
      warn("unknown finding class '" + shown(cls) + "'");
      continue;
    }
    if (pattern.empty()) {
      warn("empty pattern after '" + shown(cls) + ":'");
      continue;
    }
    if (pattern.front() == '^') {
      const std::string_view globs = pattern.substr(1);
      if (globs.empty() || globs.front() == ';' || globs.back() == ';' ||
          globs.find(";;") != std::string_view::npos) {
        warn("anchored pattern '" + shown(pattern) + "' has an empty frame (^F1;F2;...)");
        continue;
      }
    }
    r.rules.push_back(SuppressionRule{std::string(cls), std::string(pattern), line_no});
  }
  if (bad > kMaxProblemsPerKind)
    r.warnings.push_back(std::string(file) + ": and " + std::to_string(bad - kMaxProblemsPerKind) +
                         " more malformed lines; skipped");
  return r;
}

int Suppressions::match(std::string_view cls, std::span<const SuppressionFrame> frames) const {
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const SuppressionRule &rule = rules[i];
    if (rule.cls != "*" && rule.cls != cls) continue;
    if (rule.pattern.front() == '^') {
      if (stack_matches(std::string_view(rule.pattern).substr(1), frames))
        return static_cast<int>(i);
      continue;
    }
    for (const SuppressionFrame &f : frames)
      if ((!f.function.empty() && glob_match(rule.pattern, f.function)) ||
          (!f.module.empty() &&
           (glob_match(rule.pattern, f.module) || glob_match(rule.pattern, basename_of(f.module)))))
        return static_cast<int>(i);
  }
  return -1;
}

}  // namespace cmg
