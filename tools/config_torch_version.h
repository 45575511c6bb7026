// SPDX-License-Identifier: Apache-2.0
// `cumemguard config`: which PyTorch release to judge the environment for, its known problems, and
// the torch parts of the listing (key values, TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC).
// --torch-version wins; otherwise the interpreter (--python, default python3 on the evaluated PATH)
// is asked where the torch package is — importlib.util.find_spec, which locates the package without
// importing it — and the version is read from its version.py (or the dist-info beside it).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>
#include <ostream>

#include "torch_rules.h"
#include "torch_version.h"

namespace cmg {

struct TorchChoice {
  torchconf::TorchVersion version;
  std::string source;  // "--torch-version", "/…/torch/version.py (python3)", "default: …"
  // Why the interpreter could not be asked (not found, not executable, failed, killed, silent
  // past the time limit); empty when it answered, even "no torch". `config --python` refuses it.
  std::string interpreter_problem;
};

// `requested`: the --torch-version argument (validated by the caller); `python`: the interpreter;
// `getenv`: the evaluated environment (PATH, PYTHONPATH, VIRTUAL_ENV reach the interpreter);
// `envp`: the same as NAME=VALUE strings for the interpreter's environment.
TorchChoice choose_torch_version(
    const std::optional<torchconf::TorchVersion> &requested, const std::string &python,
    const std::function<std::optional<std::string>(std::string_view)> &getenv,
    const std::vector<std::string> &envp);

// The package directory the interpreter would import torch from, or nullopt with `why` set (and
// *interpreter_failed when the interpreter itself could not be found or run, not "no torch").
std::optional<std::string> torch_package_dir(
    const std::string &python,
    const std::function<std::optional<std::string>(std::string_view)> &getenv,
    const std::vector<std::string> &envp, std::string &why, bool *interpreter_failed = nullptr);

// The "torch_version" and "known_problems" members of the JSON listing (docs/config-json.md).
nlohmann::ordered_json version_json(const torchconf::Judgement &j);
nlohmann::ordered_json known_problems_json(const torchconf::Judgement &j);
// A key's effective value as JSON (numbers in PyTorch's units, null for a default reserve).
nlohmann::ordered_json key_value(const torchconf::Settings &s, torchconf::Key k);
// TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC as PyTorch reads it: one line, and the JSON member
// {"variable", "value", "meaning"} (docs/config-json.md).
std::string ipc_meaning(const torchconf::Env &env);
nlohmann::ordered_json ipc_json(const torchconf::Env &env);
// The text: "  known problems of torch 2.9.1:" and one line each, or "none".
void print_known_problems(std::ostream &out, const torchconf::Judgement &j);

}  // namespace cmg
