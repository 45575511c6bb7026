// SPDX-License-Identifier: Apache-2.0
// The start of exit and the claim on the last records (see exiting.h), and the exit(), _exit() and
// _Exit() wrappers.
#include "exiting.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "diag.h"
#include "lock_within.h"
#include "loader.h"
#include "state.h"
#include "crash.h"

namespace cmg::shim {
namespace {

std::atomic<const void *> g_exiting{nullptr};  // the thread that began exit
std::atomic<const void *> g_writer{nullptr};   // the thread writing the last records
using ExitFn = void (*)(int);
std::atomic<ExitFn> g_real_exit{nullptr};
std::atomic<ExitFn> g_real__exit{nullptr}, g_real_Exit{nullptr};
// This process's id, read at load and in a forked child: a vfork child (and a clone without fork
// handlers) runs in the parent's memory under another id, and must touch none of the shim's state.
std::atomic<long> g_pid{0};

// Until the last records are written by another thread, or patience_ns passed.
void wait_for_records(std::uint64_t patience_ns) {
  State &s = state();
  for (std::uint64_t waited = 0; waited < patience_ns; waited += 1'000'000) {
    if (s.last_records.load(std::memory_order_acquire) == kRecordsDone) return;
    pause_ns(1'000'000);
  }
}

}  // namespace

void exit_begun() {
  const void *none = nullptr;
  g_exiting.compare_exchange_strong(none, this_thread_mark(), std::memory_order_acq_rel);
  if (!g_state.load(std::memory_order_acquire)) return;
  state().log.exit_begin();
  diag_exit_begun();
}

bool exit_in_progress() {
  return g_exiting.load(std::memory_order_acquire) != nullptr;
}

bool claim_exit_records() {
  State &s = state();
  int expected = kRecordsNone;
  if (s.last_records.compare_exchange_strong(expected, kRecordsExit, std::memory_order_acq_rel)) {
    g_writer.store(this_thread_mark(), std::memory_order_release);
    return true;
  }
  // Another thread writes them (a second exit path: strict mode's abort, a late destructor, a
  // second exit()): its summary must not be cut short by this thread ending the process. This
  // thread itself (a finding reported while it writes them) just goes on.
  if (expected == kRecordsExit && g_writer.load(std::memory_order_acquire) != this_thread_mark())
    wait_for_records(kSecondExitPatienceNs);
  return false;
}

void exit_records_done() {
  state().last_records.store(kRecordsDone, std::memory_order_release);
}

void exiting_at_load() {
  // The libc definition the program would have called (the next one after the shim).
  g_real_exit.store(reinterpret_cast<ExitFn>(real_dlsym(RTLD_NEXT, "exit")),
                    std::memory_order_release);
  g_real__exit.store(reinterpret_cast<ExitFn>(real_dlsym(RTLD_NEXT, "_exit")),
                     std::memory_order_release);
  g_real_Exit.store(reinterpret_cast<ExitFn>(real_dlsym(RTLD_NEXT, "_Exit")),
                    std::memory_order_release);
  g_pid.store(syscall(SYS_getpid), std::memory_order_relaxed);
}

void exiting_fork_child() {
  g_pid.store(syscall(SYS_getpid), std::memory_order_relaxed);
  g_exiting.store(nullptr, std::memory_order_relaxed);
  g_writer.store(nullptr, std::memory_order_relaxed);
  exit_wait_reset();
}

// A thread that calls exit() while another one is exiting: waits for that one's last records,
// then goes on into libc's exit() (which ends the process, as it would have).
void exit_entered() {
  if (disabled()) return;
  const void *none = nullptr;
  const void *me = this_thread_mark();
  if (g_exiting.compare_exchange_strong(none, me, std::memory_order_acq_rel) || none == me) {
    exit_begun();
    return;
  }
  if (!active()) return;  // no records will be written: nothing to wait for
  const int st = state().last_records.load(std::memory_order_acquire);
  if (st == kRecordsDone || (st == kRecordsExit && g_writer.load() == me)) return;
  wait_for_records(kSecondExitPatienceNs);
}

// _exit() and _Exit() run no exit handler: the process's last records were lost (up to a second of
// buffered calls, the summary, `end`), and a log so ended read as cut off. Python's os._exit ends
// every forked worker of multiprocessing this way. The records are written first, marked as an
// _exit.
// Async-signal-safe, as _exit is: the crash path's writer (crash.h), no model read, no lock waited
// on, nothing allocated.
void quick_exit_entered() {
  if (disabled() || !active()) return;
  if (syscall(SYS_getpid) != g_pid.load(std::memory_order_relaxed)) return;  // a vfork child
  // exit() on another thread is writing the last records: _exit would end the process in the
  // middle of them. Waited for as a second exit() waits (bounded); then nothing is left to write.
  const void *exiting = g_exiting.load(std::memory_order_acquire);
  if (exiting && exiting != this_thread_mark() &&
      state().last_records.load(std::memory_order_acquire) != kRecordsDone)
    wait_for_records(kSecondExitPatienceNs);
  quick_exit_records();
}

}  // namespace cmg::shim

namespace {
[[noreturn]] void end_with(std::atomic<cmg::shim::ExitFn> &next, const char *name, int status) {
  auto real = next.load(std::memory_order_acquire);
  if (!real) real = reinterpret_cast<cmg::shim::ExitFn>(cmg::shim::real_dlsym(RTLD_NEXT, name));
  if (real) real(status);
  for (;;) syscall(SYS_exit_group, status);  // not reached: the next _exit does not return
}
}  // namespace

extern "C" __attribute__((visibility("default"), noreturn)) void _exit(int status) noexcept {
  cmg::shim::quick_exit_entered();
  end_with(cmg::shim::g_real__exit, "_exit", status);
}

extern "C" __attribute__((visibility("default"), noreturn)) void _Exit(int status) noexcept {
  cmg::shim::quick_exit_entered();
  end_with(cmg::shim::g_real_Exit, "_Exit", status);
}

extern "C" __attribute__((visibility("default"), noreturn)) void exit(int status) noexcept {
  cmg::shim::exit_entered();
  auto real = cmg::shim::g_real_exit.load(std::memory_order_acquire);
  if (!real) real = reinterpret_cast<void (*)(int)>(cmg::shim::real_dlsym(RTLD_NEXT, "exit"));
  real(status);
  for (;;) syscall(SYS_exit_group, status);  // not reached: libc's exit() does not return
}
