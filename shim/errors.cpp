// SPDX-License-Identifier: Apache-2.0
// `cuda_error` records (see errors.h).
#include "errors.h"

#include <atomic>

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

}  // namespace

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
  if (family == Family::Nccl || !first_time(res)) return;
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
}

}  // namespace cmg::shim
