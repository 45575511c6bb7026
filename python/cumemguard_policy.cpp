// SPDX-License-Identifier: Apache-2.0
// libcumemguard_policy.so: the shim's PyTorch allocator-config policy for a process the shim is not
// preloaded into. The Python package loads it with ctypes (RTLD_LOCAL) when cumemguard_* is not in
// the process, so that its allocator-settings rewrite comes from the same parser as the shim's, not
// from a second one. Only pure policy is here: no hook, no constructor, no CUDA call.
#include <cstddef>

#include "cmg_config.h"
#include "torch_rewrite.h"

extern char **environ;

#define CMG_POLICY_EXPORT extern "C" __attribute__((visibility("default")))

CMG_POLICY_EXPORT const char *cumemguard_version(void) {
  return CMG_VERSION;
}

// The same contract as the shim's (include/cumemguard.h); the release judged defaults to 2.11
// unless the caller names it (the package passes torch.__version__).
CMG_POLICY_EXPORT size_t cumemguard_torch_alloc_conf(const char *base, const char *overrides,
                                                     const char *torch_version, char *buf,
                                                     size_t len) {
  namespace tc = cmg::torchconf;
  try {
    const tc::RewriteRequest q = tc::request_from_c(base, overrides, torch_version);
    return tc::copy_out(tc::rewrite_json(tc::rewrite(tc::Env::from_envp(environ), q)), buf, len);
  } catch (...) {
    return tc::copy_out("{\"error\":\"internal error\"}", buf, len);
  }
}
