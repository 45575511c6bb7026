// SPDX-License-Identifier: Apache-2.0
// Fake driver, benchmark mode (FAKECUDA_BENCH=1): linear memory that costs the fake as little as
// possible, so that a benchmark run without and with the shim measures the shim.
//
// The default linear path keeps one memfd arena, a std::map and per-size bins under one mutex and
// punches holes for large frees (fallocate): a few microseconds of syscalls whose cost varies with
// the kernel, and one lock that serializes every allocating thread. Here instead: addresses come
// from a per-thread slice of an address range nothing is mapped at (no pages: copies and sets are
// refused in this mode), the block freed last is handed out first for the same size (as in the
// default mode, real-driver.md D18), and live blocks are kept in 64 independently locked shards,
// so threads that allocate at once rarely meet on a lock or a cache line. No device memory is
// charged and no call is counted (fakecuda_get_state and fakecuda_calls do not see this memory).
#include "driver_internal.h"

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fc {
namespace {

constexpr std::size_t kAlign = 512;                               // like the default mode
constexpr std::uintptr_t kSlice = std::uintptr_t{1} << 36;       // 64 GiB of addresses per thread
constexpr std::uintptr_t kFirstSlice = std::uintptr_t{0x500000000000};

struct Block {
  std::size_t size;
  int dev;
};

struct alignas(64) Shard {
  std::mutex mu;
  std::unordered_map<std::uintptr_t, Block> live;
};
Shard g_shards[64];
std::atomic<std::uintptr_t> g_next_slice{kFirstSlice};

std::size_t shard_of(std::uintptr_t p) { return ((p >> 9) * 0x9E3779B97F4A7C15ull) >> 58; }

// Per thread: the slice it carves from and its freed blocks by size. Reached through a pointer
// and never destroyed, so thread exit runs no destructor (like the context stack).
struct Local {
  std::uintptr_t bump = 0, end = 0;
  std::unordered_map<std::size_t, std::vector<std::uintptr_t>> freed;
};
thread_local Local *t_local = nullptr;

Local &local() {
  if (!t_local) t_local = new Local;
  return *t_local;
}

}  // namespace

CUresult bench_linear_alloc(std::uintptr_t *out, std::size_t size, int dev) {
  const std::size_t rounded = (size + kAlign - 1) / kAlign * kAlign;
  Local &l = local();
  std::uintptr_t p = 0;
  auto f = l.freed.find(rounded);
  if (f != l.freed.end() && !f->second.empty()) {
    p = f->second.back();
    f->second.pop_back();
  } else {
    if (rounded > kSlice) return CUDA_ERROR_OUT_OF_MEMORY;
    if (l.end - l.bump < rounded) {
      l.bump = g_next_slice.fetch_add(kSlice, std::memory_order_relaxed);
      l.end = l.bump + kSlice;
    }
    p = l.bump;
    l.bump += rounded;
  }
  Shard &s = g_shards[shard_of(p)];
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.live.emplace(p, Block{rounded, dev});
  }
  *out = p;
  return CUDA_SUCCESS;
}

CUresult bench_linear_free(std::uintptr_t p) {
  Shard &s = g_shards[shard_of(p)];
  std::size_t size;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    auto it = s.live.find(p);
    if (it == s.live.end()) return CUDA_ERROR_INVALID_VALUE;
    size = it->second.size;
    s.live.erase(it);
  }
  local().freed[size].push_back(p);
  return CUDA_SUCCESS;
}

}  // namespace fc
