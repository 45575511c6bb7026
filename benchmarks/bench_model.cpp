// SPDX-License-Identifier: Apache-2.0
// The model (policy/) without preload or CUDA: what one intercepted call costs in the tracker, how
// that scales with threads and with 10^6 live allocations, how much memory a live allocation
// takes, and what the process-wide shared counters cost when threads update them at once.
#include <benchmark/benchmark.h>
#include <malloc.h>

#include <atomic>
#include <vector>

#include "tracker.h"

using namespace cmg;

namespace {

constexpr KindMask kDevice = kind_bit(MemKind::Linear);
constexpr std::uint64_t kSize = 2 << 20;

EventRef ev(std::uint64_t seq) { return EventRef{seq, seq, 1, 0, "cuMemAlloc_v2"}; }

// Addresses like the driver's: 512-byte aligned, spread over a few GiB; each thread its own range.
std::uint64_t addr(int thread, std::uint64_t i) {
  return 0x7f0000000000ull + (static_cast<std::uint64_t>(thread) << 36) + i * 0x200000ull;
}

// One allocation and its free: on_alloc after the driver succeeded, begin_free before forwarding.
void BM_model_alloc_free(benchmark::State &st) {
  static LinearModel *m = new LinearModel;  // one for every thread count; leaked on purpose
  std::uint64_t i = 0;
  for (auto _ : st) {
    const std::uint64_t p = addr(st.thread_index(), i++ & 1023);
    m->on_alloc(LinearRec{p, kSize, 0, MemKind::Linear, ev(i)});
    benchmark::DoNotOptimize(m->begin_free(p, kDevice, ev(i)));
  }
}
BENCHMARK(BM_model_alloc_free)->ThreadRange(1, 8)->UseRealTime();

LinearModel &model_1m() {
  static LinearModel *m = [] {
    auto *lm = new LinearModel;
    for (std::uint64_t i = 0; i < 1000000; ++i)
      lm->on_alloc(LinearRec{addr(7, i), 64 << 10, 0, MemKind::Linear, ev(i + 1)});
    return lm;
  }();
  return *m;
}

void BM_model_alloc_free_live1M(benchmark::State &st) {
  LinearModel &m = model_1m();
  std::uint64_t i = 0;
  for (auto _ : st) {
    const std::uint64_t p = addr(0, i++ & 1023);
    m.on_alloc(LinearRec{p, kSize, 0, MemKind::Linear, ev(i)});
    benchmark::DoNotOptimize(m.begin_free(p, kDevice, ev(i)));
  }
}
BENCHMARK(BM_model_alloc_free_live1M);

// A free of a live base address among 10^6 (remove and re-insert it to keep the set unchanged).
void BM_model_free_lookup_live1M(benchmark::State &st) {
  LinearModel &m = model_1m();
  std::uint64_t i = 0;
  for (auto _ : st) {
    const std::uint64_t p = addr(7, (i++ * 7919) % 1000000);
    LinearTicket t = m.begin_free(p, kDevice, ev(i));
    m.end(t, false);
  }
}
BENCHMARK(BM_model_free_lookup_live1M);

// Which allocation holds an interior pointer (invalid frees, IPC checks): the slow path.
void BM_model_find_containing_live1M(benchmark::State &st) {
  LinearModel &m = model_1m();
  std::uint64_t i = 0;
  for (auto _ : st) benchmark::DoNotOptimize(m.find_containing(addr(7, (i++ * 7919) % 1000000) + 4096));
}
BENCHMARK(BM_model_find_containing_live1M);

// Heap bytes the model holds per live allocation, with 10^6 live (mallinfo2: every malloc'd byte).
void BM_model_bytes_per_live_alloc(benchmark::State &st) {
  double per = 0;
  for (auto _ : st) {
    malloc_trim(0);
    const auto h0 = mallinfo2().uordblks;
    auto *m = new LinearModel;
    for (std::uint64_t i = 0; i < 1000000; ++i)
      m->on_alloc(LinearRec{addr(1, i), 64 << 10, 0, MemKind::Linear, ev(i + 1)});
    const auto h1 = mallinfo2().uordblks;
    per = static_cast<double>(h1 - h0 - sizeof(LinearModel)) / 1e6;
    st.PauseTiming();
    m->clear();
    delete m;
    st.ResumeTiming();
  }
  st.counters["bytes_per_alloc"] = per;
}
BENCHMARK(BM_model_bytes_per_live_alloc)->Iterations(1)->Unit(benchmark::kMillisecond);

// Heap bytes the model keeps for freed allocations once its bounded history is full (64 shards x
// 4096 freed records, so that a double free is still named with its first free): a fixed cost of
// any long-running process, whatever it has live.
void BM_model_bytes_freed_history(benchmark::State &st) {
  double total = 0;
  for (auto _ : st) {
    malloc_trim(0);
    const auto h0 = mallinfo2().uordblks;
    auto *m = new LinearModel;
    for (std::uint64_t i = 0; i < 64 * 4096 * 2; ++i) {
      const std::uint64_t p = addr(2, i);
      m->on_alloc(LinearRec{p, 64 << 10, 0, MemKind::Linear, ev(i + 1)});
      benchmark::DoNotOptimize(m->begin_free(p, kDevice, ev(i + 1)));
    }
    total = static_cast<double>(mallinfo2().uordblks - h0 - sizeof(LinearModel));
    st.PauseTiming();
    m->clear();
    delete m;
    st.ResumeTiming();
  }
  st.counters["history_bytes"] = total;
}
BENCHMARK(BM_model_bytes_freed_history)->Iterations(1)->Unit(benchmark::kMillisecond);

// ---- process-wide shared counters under threads --------------------------------------------------
// ByteCounters as the shim uses them on every linear allocation and free (same device and kind).
void BM_byte_counters_alloc_free(benchmark::State &st) {
  static ByteCounters *c = new ByteCounters;
  for (auto _ : st) {
    c->add(0, MemKind::Linear, kSize);
    c->add(0, MemKind::Linear, -static_cast<std::int64_t>(kSize));
  }
}
BENCHMARK(BM_byte_counters_alloc_free)->ThreadRange(1, 8)->UseRealTime();

// One process-wide atomic incremented by every call (the sequence number, per-API call counts).
void BM_shared_atomic_increment(benchmark::State &st) {
  static std::atomic<std::uint64_t> n{0};
  for (auto _ : st) benchmark::DoNotOptimize(n.fetch_add(1, std::memory_order_relaxed));
}
BENCHMARK(BM_shared_atomic_increment)->ThreadRange(1, 8)->UseRealTime();

// The same count kept per thread on its own cache line, summed when read.
void BM_striped_increment(benchmark::State &st) {
  struct alignas(64) Stripe {
    std::atomic<std::uint64_t> n{0};
  };
  static Stripe stripes[64];
  Stripe &s = stripes[st.thread_index() % 64];
  for (auto _ : st) benchmark::DoNotOptimize(s.n.fetch_add(1, std::memory_order_relaxed));
}
BENCHMARK(BM_striped_increment)->ThreadRange(1, 8)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
