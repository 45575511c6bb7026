// SPDX-License-Identifier: Apache-2.0
// `cuda_error` records (see errors.h).
#include "errors.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "state.h"

namespace cmg::shim {
namespace {

// Up to 32 distinct statuses per process, each claimed once by compare-and-swap: the first thread
// that sees a status writes its record, every later call with it costs one look at the table.
constexpr int kSlots = 32;
std::atomic<int> g_seen[kSlots];
// Statuses 1..63 are the common ones (invalid value, out of memory, not initialised): a bit each,
// so that a program that fails the same way often pays one load.
std::atomic<std::uint64_t> g_small{0};

struct Name {
  int code;
  const char *name;
};
constexpr Name kDriverNames[] = {
#define CMG_CU_ERR(e) {static_cast<int>(e), #e},
#define CMG_RT_ERR(e)
#include "cuda_errors.def"
#undef CMG_CU_ERR
#undef CMG_RT_ERR
};
constexpr Name kRuntimeNames[] = {
#define CMG_CU_ERR(e)
#define CMG_RT_ERR(e) {static_cast<int>(e), #e},
#include "cuda_errors.def"
#undef CMG_CU_ERR
#undef CMG_RT_ERR
};

// True when this call is the first with `res`.
bool first_time(int res) {
  if (res > 0 && res < 64) {
    const std::uint64_t bit = std::uint64_t{1} << res;
    if (g_small.load(std::memory_order_relaxed) & bit) return false;
    return !(g_small.fetch_or(bit, std::memory_order_relaxed) & bit);
  }
  for (auto &slot : g_seen) {
    int v = slot.load(std::memory_order_relaxed);
    if (v == res) return false;
    if (v == 0) {
      if (slot.compare_exchange_strong(v, res, std::memory_order_relaxed)) return true;
      if (v == res) return false;
    }
  }
  return false;  // 32 others came first: this one is in the call records only
}

// Every failed call, and the first status with its family: a second status, or a call that
// succeeded (the counts differ), means the run was not failing as a whole.
std::atomic<std::uint64_t> g_failed{0};
std::atomic<std::uint32_t> g_first{0};  // family << 24 | status, plus one; 0: none yet
std::atomic<bool> g_mixed{false};
std::atomic<bool> g_claimed{false};  // a thread is writing the first status's cause
// Said about the first status, written once before g_first is published (by its writer only).
const char *g_cause = nullptr;
char g_fake[PATH_MAX];

// The likely cause of a status that every call returning it points to; nullptr for the others.
const char *cause_of(Family family, int res) {
  if (family == Family::Runtime && res == 35)  // cudaErrorInsufficientDriver
    return "the runtime found no CUDA driver (libcuda.so.1 is not on the library path), or one "
           "older than itself";
  if (res == 34)  // cudaErrorStubLibrary, CUDA_ERROR_STUB_LIBRARY
    return "the toolkit's stub libcuda.so was loaded instead of the driver";
  if (res == 100)  // cudaErrorNoDevice, CUDA_ERROR_NO_DEVICE
    return "no CUDA device is visible (no GPU, or CUDA_VISIBLE_DEVICES hides them)";
  if (family == Family::Driver && res == 3)  // CUDA_ERROR_NOT_INITIALIZED
    return "the driver was never initialised (cuInit failed or was not called)";
  if (res == 803)  // cudaErrorSystemDriverMismatch, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
    return "the driver library does not match the loaded kernel module";
  return nullptr;
}

// The fake CUDA stack of the build the shim comes from (<build>/tests/fakecuda beside
// <build>/shim), where one is: what a machine without a GPU runs the programs with.
void find_fake() {
  Dl_info info;
  char real[PATH_MAX];
  if (!dladdr(reinterpret_cast<void *>(&find_fake), &info) || !info.dli_fname ||
      !realpath(info.dli_fname, real))
    return;
  for (int up = 0; up < 2; ++up)
    if (char *slash = std::strrchr(real, '/')) *slash = 0;
  constexpr const char tail[] = "/tests/fakecuda";
  if (std::strlen(real) + sizeof tail + sizeof "/libcuda.so.1" > sizeof g_fake) return;
  char probe[PATH_MAX];
  std::strcpy(probe, real);
  std::strcat(probe, tail);
  std::strcat(probe, "/libcuda.so.1");
  if (access(probe, F_OK) != 0) return;
  std::strcpy(g_fake, real);
  std::strcat(g_fake, tail);
}

void count_failure(Family family, int res) {
  g_failed.fetch_add(1, std::memory_order_relaxed);
  const std::uint32_t key = ((static_cast<std::uint32_t>(family) << 24) |
                             (static_cast<std::uint32_t>(res) & 0xffffff)) + 1;
  std::uint32_t first = g_first.load(std::memory_order_acquire);
  if (first == key) return;
  if (first == 0) {
    // Claimed first, published after the cause is written: a reader that sees the key sees it.
    if (!g_claimed.exchange(true)) {
      g_cause = cause_of(family, res);
      if (g_cause && res != 803 && !(family == Family::Driver && res == 3) && !g_fake[0])
        find_fake();
      g_first.store(key, std::memory_order_release);
      return;
    }
    while ((first = g_first.load(std::memory_order_acquire)) == 0) {
    }
    if (first == key) return;
  }
  g_mixed.store(true, std::memory_order_relaxed);
}

}  // namespace

AllFailed every_call_failed(std::uint64_t calls) {
  AllFailed a;
  const std::uint64_t failed = g_failed.load(std::memory_order_relaxed);
  const std::uint32_t first = g_first.load(std::memory_order_acquire);
  if (!failed || failed != calls || !first || g_mixed.load(std::memory_order_relaxed)) return a;
  a.calls = failed;
  const auto family = static_cast<Family>((first - 1) >> 24);
  a.res = static_cast<int>((first - 1) & 0xffffff);
  a.name = status_name(family, a.res);
  a.cause = g_cause;
  a.fake = g_fake[0] ? g_fake : nullptr;
  return a;
}

bool sticky_status(int res) {
  return res == 214 || res == 700 || res == 702 || (res >= 714 && res <= 719);
}

const char *status_name(Family family, int res) {
  if (family == Family::Driver) {
    for (const Name &n : kDriverNames)
      if (n.code == res) return n.name;
  } else if (family == Family::Runtime) {
    for (const Name &n : kRuntimeNames)
      if (n.code == res) return n.name;
  }
  return nullptr;
}

void note_cuda_error(Api api, int res, const EventRef &ev) {
  const Family family = kApis[static_cast<std::size_t>(api)].family;
  if (family == Family::Nccl) return;
  count_failure(family, res);
  if (!first_time(res)) return;
  State &s = state();
  if (!s.log.is_open()) return;
  char buf[512];
  JsonLine j(buf, sizeof buf);
  j.str("k", "cuda_error").unum("seq", ev.seq).unum("ts", ev.ts).unum("tid", ev.tid)
      .str("api", api_name(api)).num("res", res);
  if (const char *n = status_name(family, res)) j.str("name", n);
  j.boolean("sticky", sticky_status(res));
  // The first sequence number not issued when the call returned: what began before it (an unmap on
  // another thread while this call waited for the device) is what the failing call may have met.
  j.unum("ret_seq", s.seq.load(std::memory_order_relaxed) + 1);
  if (ev.stack) j.unum("stack", ev.stack);
  s.log.write(j.finish(), ev.ts);
  s.log.flush();  // like a finding: the crash a sticky error is often followed by must not lose it
}

void errors_fork_child() {
  for (auto &slot : g_seen) slot.store(0, std::memory_order_relaxed);
  g_small.store(0, std::memory_order_relaxed);
  // The child's calls are its own (it is single-threaded here: nobody is writing the cause).
  g_failed.store(0, std::memory_order_relaxed);
  g_mixed.store(false, std::memory_order_relaxed);
  g_first.store(0, std::memory_order_relaxed);
  g_cause = nullptr;
  g_claimed.store(false, std::memory_order_relaxed);
}

}  // namespace cmg::shim
