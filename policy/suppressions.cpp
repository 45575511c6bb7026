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

}  // namespace

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
    r.rules.push_back(SuppressionRule{std::string(cls), std::string(pattern), line_no});
  }
  if (bad > kMaxProblemsPerKind)
    r.warnings.push_back(std::string(file) + ": and " + std::to_string(bad - kMaxProblemsPerKind) +
                         " more malformed lines; skipped");
  return r;
}

int Suppressions::match(std::string_view cls, std::span<const std::string> frames) const {
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const SuppressionRule &rule = rules[i];
    if (rule.cls != "*" && rule.cls != cls) continue;
    for (const std::string &f : frames)
      if (!f.empty() && glob_match(rule.pattern, f)) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace cmg
