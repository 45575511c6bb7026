// SPDX-License-Identifier: Apache-2.0
// The environment judged for one PyTorch release: that release's grammar (the keys and parser of
// policy/torch_releases.def), then its known differences and bugs, each from a public bug report
// and with the release that fixed it, in the one table of torch_rules.cpp.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "torch_conf.h"
#include "torch_version.h"

namespace cmg::torchconf {

struct VersionRule {
  std::string_view id;     // stable, for tests and JSON ("unified-variable-ignored", ...)
  std::string_view since;  // first affected release ("" = every release before `until`)
  std::string_view until;  // first release without it ("" = no release has the fix)
  Severity severity;
  // The shim reports it as a `config` finding when it finds this release loaded; the rest are
  // listed by `cumemguard config` only.
  bool at_run_time;
  std::string_view bug;  // "pytorch#183387"
  std::string_view fix;  // how and when it was fixed, with the pull request
  bool (*applies)(const Env &env, const Outcome &o, const TorchVersion &v);
  std::string (*text)(const Env &env, const Outcome &o);  // one line, naming the variable
  // What the release makes of the settings when it differs from the grammar (nullptr: nothing).
  void (*adjust)(Outcome &o);

  bool covers(const TorchVersion &v) const;
};

std::span<const VersionRule> version_rules();

struct KnownProblem {
  const VersionRule *rule;
  std::string text;  // the rule's text with the bug and the fix: "... (pytorch#183387; ...)"
};

struct Judgement {
  TorchVersion version;
  std::string source;  // why this version: "--torch-version", ".../torch/version.py", ...
  bool exact = true;   // the release has a row of its own with nothing known to be unmodelled
  Grammar grammar;     // grammar_for(version)
  Outcome outcome;     // as this release reads the environment
  std::vector<KnownProblem> known;
  // One line on what was judged: "torch 2.12.0 (--torch-version): the 2.12 grammar and its known
  // problems", with what is not modelled for a partial row, a future or an old release.
  std::string summary() const;
};

Judgement judge(const Env &env, const TorchVersion &v, std::string source);

// PYTORCH_NO_CUDA_MEMORY_CACHING turns caching off in this release (before 2.7 any value does,
// pytorch#145661; from 2.7 the value 1, PR #145905).
bool caching_off(const Env &env, const TorchVersion &v);

}  // namespace cmg::torchconf
