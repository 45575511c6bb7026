// SPDX-License-Identifier: Apache-2.0
// setenv/unsetenv/putenv/clearenv pass through the shim to keep its environment snapshot: see
// env_hooks.h.
#include "env_hooks.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>

#include "cuda_api.h"
#include "loader.h"

extern char **environ;

namespace cmg::shim {
namespace {

namespace tc = torchconf;

// Leaked on purpose (a static destructor could run while another thread still calls setenv).
struct Snapshot {
  std::mutex mu;
  bool taken = false;
  tc::Env env;
};
std::atomic<Snapshot *> g_snap{nullptr};

Snapshot &snap() {
  Snapshot *s = g_snap.load(std::memory_order_acquire);
  if (s) return *s;
  static std::once_flag once;
  std::call_once(once, [] {
    auto *n = new Snapshot;
    // A leaf lock: nothing else of the shim's is taken under it.
    pthread_atfork([] { g_snap.load()->mu.lock(); }, [] { g_snap.load()->mu.unlock(); },
                   [] { new (&g_snap.load()->mu) std::mutex(); });
    g_snap.store(n, std::memory_order_release);
  });
  return *g_snap.load(std::memory_order_acquire);
}

// Whether a change of `name` (up to '=' or its end) can change what PyTorch reads.
bool matters(const char *name) {
  return name && std::strncmp(name, "PYTORCH_", 8) == 0;
}

void refresh_locked(Snapshot &s) {
  if (!s.taken) return;  // taken at the first read, from the environment as it is then
  try {
    s.env = tc::Env::from_envp(environ);
  } catch (...) {
    s.taken = false;  // read again at the next use
  }
}

template <class F>
F next(const char *name) {
  static_assert(sizeof(F) == sizeof(void *));
  return reinterpret_cast<F>(real_dlsym(RTLD_NEXT, name));
}

}  // namespace

tc::Env torch_env_now() {
  Snapshot &s = snap();
  std::lock_guard lk(s.mu);
  if (!s.taken) {
    s.env = tc::Env::from_envp(environ);
    s.taken = true;
  }
  return s.env;
}

}  // namespace cmg::shim

using namespace cmg::shim;

// The exports. Each change is made under the snapshot's lock, so the snapshot is read from an
// `environ` no other change through here is rewriting. Nothing else of the shim runs in them.
// glibc declares them __THROW (noexcept), and nothing in them is a cancellation point: a failure
// of the shim's own (the snapshot's allocation) makes the change without it, made once.
namespace {
template <class Real>
int change(const char *name, bool all, Real &&real) noexcept {
  bool done = false;
  int r = -1;
  try {
    Snapshot &s = snap();
    std::lock_guard lk(s.mu);
    r = real();
    done = true;
    if (r == 0 && (all || matters(name))) refresh_locked(s);
    return r;
  } catch (...) {
    return done ? r : real();
  }
}
}  // namespace

CMG_EXPORT int setenv(const char *name, const char *value, int overwrite) noexcept {
  static auto real = next<int (*)(const char *, const char *, int)>("setenv");
  if (!real) return -1;
  return change(name, false, [&] { return real(name, value, overwrite); });
}

CMG_EXPORT int unsetenv(const char *name) noexcept {
  static auto real = next<int (*)(const char *)>("unsetenv");
  if (!real) return -1;
  return change(name, false, [&] { return real(name); });
}

CMG_EXPORT int putenv(char *string) noexcept {
  static auto real = next<int (*)(char *)>("putenv");
  if (!real) return -1;
  return change(string, false, [&] { return real(string); });
}

CMG_EXPORT int clearenv() noexcept {
  static auto real = next<int (*)()>("clearenv");
  if (!real) return -1;
  return change(nullptr, true, [&] { return real(); });
}
