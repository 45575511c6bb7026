// SPDX-License-Identifier: Apache-2.0
// The launcher's status channel (see status_channel.h and policy/run_status.h). The record is a
// file of its own per process image (`<pid>.<n>`: an exec'd image keeps the pid, so each image
// takes the next free n with O_EXCL), mapped shared and written with atomic stores: the launcher
// reads what the last store left even when the process was killed without a chance to write.
#include "status_channel.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>

#include "run_status.h"
#include "state.h"

namespace cmg::shim {
namespace {

static_assert(kFindingClassCount <= RunStatusRecord::kClasses, "room for every finding class");

std::atomic<RunStatusRecord *> g_rec{nullptr};

// Counts only grow: two threads storing at once must not leave the smaller value.
void store_max(std::uint64_t &slot, std::uint64_t v) {
  std::atomic_ref<std::uint64_t> a(slot);
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

void store32(std::uint32_t &slot, std::uint32_t v) {
  std::atomic_ref<std::uint32_t>(slot).store(v, std::memory_order_release);
}

}  // namespace

void status_loaded() {
  const std::string &dir = state().opts.status_dir;
  if (dir.empty()) return;
  const std::string path = dir + "/" + std::to_string(getpid()) + ".loaded";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);  // EEXIST: an image this pid exec'd from marked it already
}

void status_open() {
  const State &s = state();
  const std::string &dir = s.opts.status_dir;
  if (dir.empty() || g_rec.load(std::memory_order_acquire)) return;
  int fd = -1, err = 0;
  for (int k = 0; k < 64 && fd < 0; ++k) {
    const std::string path = dir + "/" + std::to_string(getpid()) + "." + std::to_string(k);
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    err = fd < 0 ? errno : 0;
    if (fd < 0 && err != EEXIST) break;
  }
  void *m = MAP_FAILED;
  if (fd >= 0) {
    if (ftruncate(fd, sizeof(RunStatusRecord)) == 0)
      m = mmap(nullptr, sizeof(RunStatusRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    err = m == MAP_FAILED ? errno : 0;
    ::close(fd);  // the mapping stays: a host that closes every descriptor cannot take it away
  }
  if (m == MAP_FAILED) {
    note(LogLevel::Warn, "CUMEMGUARD_STATUS_DIR: cannot keep this process's status in '" +
                             shown(dir) + "': " + std::strerror(err) +
                             "; the launcher's exit status will not count its findings");
    return;
  }
  auto *r = static_cast<RunStatusRecord *>(m);  // zero-filled by ftruncate
  start_run_status(*r, getpid(), s.start_unix_ns);
  g_rec.store(r, std::memory_order_release);
  status_findings();  // findings made before activation (the environment at load)
}

void status_log(std::string_view path, bool opened) {
  RunStatusRecord *r = g_rec.load(std::memory_order_acquire);
  if (!r) return;
  set_run_status_log(*r, path.data(), path.size());
  store32(r->log_state, opened ? 1 : 2);
}

void status_findings() {
  RunStatusRecord *r = g_rec.load(std::memory_order_acquire);
  if (!r) return;
  const State &s = state();
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < kFindingClassCount; ++i) {
    const std::uint64_t n = s.findings[i].load(std::memory_order_relaxed);
    store_max(r->by_class[i], n);
    total += n;
  }
  store_max(r->findings, total);
}

void status_exit(std::uint64_t leaks) {
  RunStatusRecord *r = g_rec.load(std::memory_order_acquire);
  if (!r) return;
  status_findings();
  std::atomic_ref<std::uint64_t>(r->leaks).store(leaks, std::memory_order_relaxed);
  store32(r->state, RunStatusRecord::Exited);
}

void status_quick_exit() {
  RunStatusRecord *r = g_rec.load(std::memory_order_acquire);
  if (!r) return;
  status_findings();
  store32(r->state, RunStatusRecord::QuickExited);
}

void status_signalled() {
  RunStatusRecord *r = g_rec.load(std::memory_order_acquire);
  if (!r) return;
  // Only over a process still running: after the exit path's record (strict mode's abort
  // raises SIGABRT after the exit summary counted the leaks) the leaks are checked and counted,
  // and Signalled would tell the launcher they were not. An exit path that stores its record
  // after this (a crash on another thread while it runs) wins: it counted them.
  std::uint32_t running = RunStatusRecord::Running;
  std::atomic_ref<std::uint32_t>(r->state)
      .compare_exchange_strong(running, RunStatusRecord::Signalled, std::memory_order_acq_rel);
}

void status_fork_child() {
  // The parent's record stays the parent's: unmapped here, before the child can count anything.
  if (RunStatusRecord *r = g_rec.exchange(nullptr)) munmap(r, sizeof(RunStatusRecord));
}

}  // namespace cmg::shim
