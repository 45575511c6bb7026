// SPDX-License-Identifier: Apache-2.0
// A scoped change of PyTorch's allocator settings at run time (the scoped allocator-settings guard): the full
// configuration in effect with one override applied, for torch.cuda.memory._set_allocator_settings,
// and the string that restores the original afterwards. Both are checked against the model of the
// setter (torch_conf: A.parseArgs then C.parseArgs, resets of three fields only, not
// transactional), so that nothing but the overridden key changes and the restore gives back every
// setting. Used by the C API (cumemguard_torch_alloc_conf) and through it by the Python package.
#pragma once

#include <optional>
#include <string>

#include "torch_conf.h"
#include "torch_rules.h"
#include "torch_version.h"

namespace cmg::torchconf {

struct RewriteRequest {
  // The configuration in effect to start from, as last passed to the setter; nullopt: the one
  // PyTorch read from the environment (the variable of parser A, reference §2).
  std::optional<std::string> base;
  std::string overrides;  // CUMEMGUARD_TORCH_ALLOC_CONF syntax: "expandable_segments:False"
  TorchVersion version = grammar_version();
  std::string version_source = "default";
};

struct Rewrite {
  Var variable = Var::None;        // where the base came from (request without a base), or None
  std::string base;                // the full configuration in effect
  std::string result;              // base with the overrides applied: pass it to the setter
  std::string restore;             // pass it to the setter afterwards: every setting as before
  std::string error;               // empty when the three strings are usable
  bool expandable_before = false;  // expandable segments in effect with `base`
  bool expandable_after = false;   // ... with `result`
  bool changed = false;            // the result sets something the base does not
  std::string version;             // the release judged, and why
  std::string version_source;
  // PyTorch's setter in that release: "torch._C._accelerator_setAllocatorSettings" (2.10+; the
  // cuda one is a deprecated wrapper there) or "torch.cuda.memory._set_allocator_settings".
  std::string setter;
  std::vector<std::string> known;  // known problems of that release for this environment
};

Rewrite rewrite(const Env &env, const RewriteRequest &req);

// The request of the C entry point cumemguard_torch_alloc_conf (include/cumemguard.h): null or
// empty arguments mean none; a torch_version that parses is the release judged ("given by the
// caller"); otherwise the default release is judged.
RewriteRequest request_from_c(const char *base, const char *overrides, const char *torch_version);
// {"variable":"PYTORCH_CUDA_ALLOC_CONF","base":"…","result":"…","restore":"…","error":null,
//  "expandable_before":true,"expandable_after":false,"changed":true,"torch_version":"2.11.0",
//  "torch_version_source":"…","setter":"torch._C._accelerator_setAllocatorSettings",
//  "known_problems":["…"]} (docs/python.md, "The C entry points").
std::string rewrite_json(const Rewrite &r);

// Copies `s` and a terminating NUL into buf when it fits (len > s.size()); returns s.size(), so a
// caller can retry with a larger buffer (snprintf's contract).
std::size_t copy_out(const std::string &s, char *buf, std::size_t len);

}  // namespace cmg::torchconf
