// SPDX-License-Identifier: Apache-2.0
// Whether PyTorch's CUDA caching allocator took the path its configuration asks for. With
// expandable segments in effect it makes segments with cuMemCreate/cuMemMap and never calls
// cudaMalloc (docs/gpu/torch-expandable.txt: no cudaMalloc in the whole workload, against 13 with
// the default allocator). A cudaMalloc whose caller is libc10_cuda/libtorch_cuda then means the
// setting is not honoured: a release that ignores the variable (pytorch#183387), caching turned
// off (PYTORCH_NO_CUDA_MEMORY_CACHING, pytorch#145661), no VMM support in the build or device, or
// settings changed at run time behind the configuration's back.
//
// Cost: the first kChecked cudaMalloc calls of the process take one dladdr each; after that (or
// after the finding) a call costs one relaxed atomic load.
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <mutex>
#include <string>

#include "diag.h"
#include "state.h"
#include "torch_host.h"
#include "torch_rules.h"

extern char **environ;

namespace cmg::shim {
namespace {

namespace tc = cmg::torchconf;

constexpr int kChecked = 64;
std::atomic<int> g_left{kChecked};
std::atomic<bool> g_fired{false};

// What PyTorch was asked for: the environment as its parsers read it (L at import, C and A at the
// first allocation), then the settings a program applied through the C API at run time.
struct Asked {
  std::mutex mu;
  bool ready = false;
  tc::Env env;          // at the first CUDA allocation
  tc::Outcome read;     // the environment as the loaded release reads it (2.11 before one is found)
  tc::Runtime runtime;  // and what the setter calls made of it since
  bool set_at_run_time = false;
  std::string last_set;  // the last string applied at run time
};

// Held across fork() so a child never inherits it locked by a thread that is gone (the child may
// call cudaMalloc or the C API at once); nothing else is locked while it is held.
Asked *g_asked = nullptr;  // leaked on purpose, like the state
std::once_flag g_asked_once;

Asked &asked() {
  std::call_once(g_asked_once, [] {
    g_asked = new Asked;
    pthread_atfork([] { g_asked->mu.lock(); }, [] { g_asked->mu.unlock(); },
                   [] { g_asked->mu.unlock(); });
  });
  return *g_asked;
}

void ready_locked(Asked &a) {
  if (a.ready) return;
  const tc::Env now = tc::Env::from_envp(environ);
  const tc::Env *load = torch_env_at_load();
  a.env = now;
  // As the loaded release reads it (its own keys), once its libraries say which one it is.
  const std::optional<tc::FoundVersion> found = torch_loaded_version();
  const tc::Grammar g = found ? tc::grammar_for(found->version) : tc::default_grammar();
  a.read = tc::evaluate(load ? *load : now, now, g);
  a.runtime = a.read.error ? tc::Runtime{} : tc::runtime_from(a.read);
  a.ready = true;
}

bool expandable(const tc::Runtime &rt) {
  return rt.load_backend == tc::Backend::Native && rt.settings.expandable_segments;
}

// Why the allocator did not take the expandable path, as far as the environment and the release
// say; otherwise the causes that remain.
std::string cause(const Asked &a, const std::optional<tc::FoundVersion> &found) {
  const tc::TorchVersion v = found ? found->version : tc::grammar_version();
  const std::string release =
      found ? "torch " + found->version.text + " (" + found->source + ")" : std::string("torch");
  if (tc::caching_off(a.env, v))
    return std::string(tc::kNoCachingVar) + "='" + *a.env.no_caching + "' turns " + release +
           "'s caching allocator off, so every allocation is a cudaMalloc" +
           (v < tc::torch_version("2.7.0") && *a.env.no_caching != "1"
                ? " (before 2.7 any value does: pytorch#145661)"
                : "");
  if (found) {
    const tc::Judgement j = tc::judge(a.env, found->version, found->source);
    for (const tc::KnownProblem &k : j.known)
      if (k.rule->adjust) return release + ": " + k.text;
  }
  if (a.set_at_run_time)
    return "the settings applied at run time ('" + a.last_set + "') ask for expandable segments; " +
           release + " did not take them";
  return "possible causes: " + release +
         " was built without the CUDA driver API or the device has no VMM support (PyTorch "
         "warns 'expandable_segments not supported on this platform' and falls back), the "
         "settings were changed at run time with torch._C._accelerator_setAllocatorSettings "
         "outside cumemguard.expandable_segments(), or a CUDA-graph capture in a release whose "
         "private pools do not use expandable segments";
}

}  // namespace

void torch_path_check(void *caller, std::size_t size) {
  if (g_left.load(std::memory_order_relaxed) <= 0) return;
  if (g_left.fetch_sub(1, std::memory_order_relaxed) <= 0) return;
  if (disabled()) {
    g_left.store(0, std::memory_order_relaxed);
    return;
  }
  Dl_info info{};
  if (!caller || !dladdr(caller, &info) || !info.dli_fname) return;
  if (!tc::is_torch_allocator_library(info.dli_fname)) return;
  try {
    torch_release_check();  // the release is known by now: its own problems first
    const std::optional<tc::FoundVersion> found = torch_loaded_version();
    Asked &a = asked();
    std::string msg;
    {
      std::lock_guard lk(a.mu);
      ready_locked(a);
      if (!expandable(a.runtime)) return;  // the path asked for: cudaMalloc segments
      if (g_fired.exchange(true)) return;
      const tc::Var var = a.read.source[static_cast<std::size_t>(tc::Key::ExpandableSegments)];
      const std::string where = a.set_at_run_time ? std::string("the settings applied at run time")
                                : var == tc::Var::None ? std::string("the configuration")
                                                       : std::string(tc::var_name(var));
      msg = "PyTorch's caching allocator makes segments with cudaMalloc (" + std::to_string(size) +
            " bytes, called from " + info.dli_fname + ") although " + where +
            (a.set_at_run_time ? " ask" : " asks") +
            " for expandable_segments:True: expandable segments are not in use; " + cause(a, found);
    }
    g_left.store(0, std::memory_order_relaxed);
    Finding f;
    f.cls = FindingClass::Config;
    f.msg = std::move(msg);
    f.bytes = size;
    f.state_json = "{\"caller\":\"" + json_escape(info.dli_fname) + "\",\"check\":\"torch-path\"}";
    report_finding_without_call(std::move(f), "cudaMalloc", true);
  } catch (...) {
    // The host goes on untouched.
  }
}

int torch_settings_applied(const char *conf) {
  if (!conf) return -1;
  try {
    Asked &a = asked();
    std::lock_guard lk(a.mu);
    ready_locked(a);
    tc::Runtime next = a.runtime;
    const tc::SetResult r = tc::set_allocator_settings(next, conf);
    if (r.error) return -1;
    a.runtime = next;
    a.set_at_run_time = true;
    a.last_set = conf;
    return expandable(a.runtime) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

}  // namespace cmg::shim
