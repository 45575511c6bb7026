// SPDX-License-Identifier: Apache-2.0
// Fuzz target: the PyTorch allocator-config parser, merge and plan (policy/torch_conf_*.cpp), which
// the shim runs at load on the host's environment, the release rules and the scoped rewrite of the
// C API (policy/torch_rules, torch_rewrite), and the version readers (policy/torch_version). Input:
// up to four fields separated by NUL: PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF,
// PYTORCH_HIP_ALLOC_CONF, CUMEMGUARD_TORCH_ALLOC_CONF; the first byte of each field says whether
// the variable is present ('-' absent). Invariants (torch_conf.h): merge(x, "") == x; a plan that
// writes leads to an environment that PyTorch accepts, with the settings the plan computed; a
// rewrite without error restores every setting; nothing throws.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "torch_conf.h"
#include "torch_rewrite.h"
#include "torch_rules.h"
#include "torch_version.h"

namespace tc = cmg::torchconf;

namespace {

[[noreturn]] void fail(const char *what) {
  std::fprintf(stderr, "fuzz_torch_conf: invariant broken: %s\n", what);
  std::abort();
}

std::optional<std::string> field(std::string_view f) {
  if (!f.empty() && f[0] == '-') return std::nullopt;
  return std::string(f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t *data, std::size_t size) {
  if (size > 4096) return 0;  // PyTorch's own parser is linear; long inputs add nothing but time
  std::string_view in(reinterpret_cast<const char *>(data), size);
  std::string_view f[4];
  for (int i = 0; i < 4; ++i) {
    const std::size_t z = in.find('\0');
    f[i] = in.substr(0, z);
    if (z == std::string_view::npos) {
      in = {};
    } else {
      in.remove_prefix(z + 1);
    }
  }
  tc::Env env;
  env.cuda = field(f[0]);
  env.alloc = field(f[1]);
  env.hip = field(f[2]);
  const std::string overrides(f[3]);

  const tc::Outcome o = tc::evaluate(env);
  (void)tc::diagnose(env, o);
  if (o.cls == tc::OutcomeClass::Ok && !o.deferred) {
    tc::Runtime rt = tc::runtime_from(o);
    (void)tc::set_allocator_settings(rt, overrides);
  }
  for (tc::Var v : tc::kVars) {
    const std::optional<std::string> &val = env.get(v);
    if (!val) continue;
    (void)tc::tokenize(*val);
    if (tc::merge(*val, "").value != *val) fail("merge(x, \"\") changed x");
    (void)tc::merge(*val, overrides);
  }
  const tc::Plan p = tc::plan(env, overrides);
  if (p.action == tc::PlanAction::Write) {
    if (p.writes.empty()) fail("a write plan without writes");
    const tc::Outcome after = tc::evaluate(tc::apply(env, p));
    if (after.error) fail("a write plan leads to an environment PyTorch refuses");
    if (!p.after || !(after.settings == p.after->settings)) fail("apply() differs from the plan");
  } else if (!p.writes.empty()) {
    fail("writes in a plan that does not write");
  }
  (void)tc::diagnose_change(env, tc::apply(env, p));

  // The override field read as version texts, the environment judged for several releases, and
  // the rewrite from the environment and from the override field as a base.
  (void)tc::parse_torch_version(overrides);
  (void)tc::version_in_version_py(overrides);
  (void)tc::version_in_dist_info(overrides);
  (void)tc::version_in_library_name(overrides);
  (void)tc::judge(env, tc::torch_version(size % 2 ? "2.9.1" : "2.2.0"), "f");
  (void)tc::judge(env, tc::torch_version(size % 3 ? "2.12.0" : "2.16.0"), "f");
  // The rewrite, from the environment or (odd sizes) from the unified field as the base.
  tc::RewriteRequest q;
  if (size % 2) q.base = field(f[1]);
  q.overrides = overrides;
  const tc::Rewrite r = tc::rewrite(env, q);
  (void)tc::rewrite_json(r);
  if (r.error.empty() && !o.error && !q.base) {
    tc::Runtime rt = tc::runtime_from(tc::judge(env, q.version, "f").outcome);
    const tc::Runtime before = rt;
    if (tc::set_allocator_settings(rt, r.result).error) fail("a rewrite result PyTorch refuses");
    if (tc::set_allocator_settings(rt, r.restore).error) fail("a restore PyTorch refuses");
    for (const tc::KeyInfo &k : tc::keys())
      if (tc::effective_text(rt.settings, k.key) != tc::effective_text(before.settings, k.key))
        fail("the restore does not give back every setting");
  }
  return 0;
}
