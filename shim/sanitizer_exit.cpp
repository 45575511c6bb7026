// SPDX-License-Identifier: Apache-2.0
// The exit summary of a program built with a sanitizer: see sanitizer_exit.h.
#include "sanitizer_exit.h"

#include <dlfcn.h>

#include "loader.h"
#include "summary.h"

namespace cmg::shim {

namespace {

// Runs inside the sanitizer's Die(), on the thread that reported: the exit path as at exit(),
// which allocates nothing and waits on no lock without a bound (summary.h).
void on_sanitizer_death() {
  exit_summary(ExitHow::Sanitizer);
}

}  // namespace

void sanitizer_exit_install() {
  using SetFn = void (*)(void (*)());
  // compiler-rt's common interface (AddressSanitizer, LeakSanitizer, ThreadSanitizer, UBSan
  // standalone), exported by each runtime.
  auto set = reinterpret_cast<SetFn>(real_dlsym(RTLD_DEFAULT, "__sanitizer_set_death_callback"));
  if (set) set(on_sanitizer_death);
}

}  // namespace cmg::shim
