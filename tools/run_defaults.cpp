// SPDX-License-Identifier: Apache-2.0
// The launcher's defaults (see run_defaults.h).
#include "run_defaults.h"

namespace cmg::tools {

bool set_by_user(const ParsedOptions &user, std::string_view name) {
  for (const auto &v : user.values)
    if (v.spec->name == name)
      return v.source == OptionSource::Environment || v.source == OptionSource::Options;
  return false;
}

std::vector<std::string> run_refusals(const ParsedOptions &parsed) {
  std::vector<std::string> out;
  for (std::size_t k = 0; k < parsed.problems.size(); ++k)
    if (parsed.problem_kinds[k] != ProblemKind::Repeated)
      out.push_back(problem_without_fallback(parsed.problems[k]));
  return out;
}

std::vector<RunDefault> run_defaults(const ParsedOptions &user, const std::string &program,
                                     const std::string &cwd) {
  std::vector<RunDefault> out;
  const std::string prefix(kOptionPrefix);
  if (user.profile_source == OptionSource::Default) out.push_back({prefix + "PROFILE", "debug"});
  if (!set_by_user(user, "SUMMARY")) out.push_back({prefix + "SUMMARY", "1"});
  if (!set_by_user(user, "LOG")) {
    const auto slash = program.rfind('/');
    const std::string base = slash == std::string::npos ? program : program.substr(slash + 1);
    out.push_back({prefix + "LOG", cwd + "/cumemguard." + base + ".%p.log"});
  }
  return out;
}

}  // namespace cmg::tools
