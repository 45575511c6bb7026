// SPDX-License-Identifier: Apache-2.0
// Random allocation, VMM and IPC sequences from many threads, for fault-injection runs under the
// shim. Every call's status is compared with what the fake driver itself answered for it on this
// thread (fakecuda_thread_last_call): the shim may only change a status by a documented skip.
// At the end it prints the fake driver's own state, descriptors and threads, for run_stress.py to
// compare with the shim's exit summary and leak records.
//
//   stress SEED OPS_PER_THREAD THREADS [misuse]
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"
#include "../programs/cuda_check.h"

namespace {

constexpr std::size_t kG = 2u << 20;  // VMM granularity of the fake (and of the H200)

fakecuda_thread_calls_fn g_thread_calls;
fakecuda_thread_last_call_fn g_last_call;
fakecuda_get_state_fn g_get_state;
fakecuda_faults_injected_fn g_injected;
fakecuda_handle_live_fn g_handle_live;
fakecuda_handle_allocation_fn g_handle_alloc;
fakecuda_mapping_handle_fn g_mapping_at;
bool g_misuse = false;
// Stale releases and frees (ops 18, 19) hit values and addresses the driver may have re-issued to
// another thread, whose later calls then race with the re-issue itself: an unsynchronised use of
// one object by two threads, which no interposer can order. They run single-threaded only; the
// no-op unmap (op 17) touches only this thread's own ranges and runs everywhere.
bool g_single = false;
thread_local bool t_skipped = false;  // the last checked() call was answered without the driver
// Since this thread's last skipped no-op unmap it made no other VMM call: the pairing rule
// (README, stale-release) then takes a release of that range's last handle value as the stale one,
// by design, even when the value was issued again to this thread's own new allocation; the call
// sequence is the same. Linear-memory calls in between do not end the pairing, VMM calls do.
thread_local bool t_pairing_before = false, t_pairing = false;

// Whether a call ends the pairing: any map, unmap or address free, and a create, reserve, retain
// or import that succeeded (a failed one issued nothing). Releases do not: the releases that
// follow a no-op unmap of several sleeping ranges all pair with it (one per range).
bool ends_pairing(const char *exact, bool ok) {
  for (const char *n : {"cuMemMap", "cuMemUnmap", "cuMemAddressFree"})
    if (std::strcmp(exact, n) == 0) return true;
  for (const char *n : {"cuMemCreate", "cuMemAddressReserve", "cuMemRetainAllocationHandle",
                        "cuMemImportFromShareableHandle"})
    if (std::strcmp(exact, n) == 0) return ok;
  return false;
}

std::mutex g_out_mu;
std::atomic<unsigned long long> g_calls{0}, g_errors{0}, g_skipped{0}, g_mismatches{0},
    g_injected_seen{0};
std::atomic<unsigned long long> g_skips_by_api[8];

// A call the shim may answer without the driver in guard mode (README: the proven-redundant
// classes double-release, stale-release, unmap-unmapped, double-free). Everything else must reach
// the driver and come back unchanged.
enum class Skip : int { No = -1, Unmap = 0, Release = 1, Free = 2 };

void mismatch(const char *api, const char *why, long long got, long long drv) {
  g_mismatches.fetch_add(1);
  std::lock_guard lk(g_out_mu);
  std::printf("mismatch %s: %s (caller got %lld, driver answered %lld)\n", api, why, got, drv);
}

// Runs one call and checks it against the driver's own answer. `exact` is the driver export the
// call must reach (a runtime call reaches it underneath).
template <class R, class F>
R checked(const char *api, const char *exact, Skip skip, F &&f) {
  const unsigned long long before = g_thread_calls();
  const R r = f();
  t_skipped = false;
  t_pairing_before = t_pairing;
  if (ends_pairing(exact, static_cast<int>(r) == 0)) t_pairing = false;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  fakecuda_call last{};
  const bool reached = g_last_call(exact, &last) == 0 && last.serial > before;
  if (!reached) {
    // Answered without the driver: only a documented skip, and only with success.
    if (skip == Skip::No)
      mismatch(api, "the driver was not called", static_cast<long long>(r), -1);
    else if (static_cast<int>(r) != 0)
      mismatch(api, "skipped with an error status", static_cast<long long>(r), -1);
    else {
      t_skipped = true;
      if (skip == Skip::Unmap) t_pairing = true;
      g_skipped.fetch_add(1, std::memory_order_relaxed);
      g_skips_by_api[static_cast<int>(skip)].fetch_add(1, std::memory_order_relaxed);
    }
    return r;
  }
  if (last.injected) g_injected_seen.fetch_add(1, std::memory_order_relaxed);
  // Runtime statuses equal the driver's numbers for every code the runtime has (the fake runtime
  // maps one to one, as the real one does for OUT_OF_MEMORY, INVALID_VALUE, NOT_PERMITTED).
  if (static_cast<long long>(r) != last.result)
    mismatch(api, "status changed", static_cast<long long>(r), last.result);
  if (last.result != 0) g_errors.fetch_add(1, std::memory_order_relaxed);
  return r;
}

struct Rng {
  std::mt19937_64 g;
  explicit Rng(std::uint64_t seed) : g(seed) {}
  std::size_t below(std::size_t n) { return n ? static_cast<std::size_t>(g() % n) : 0; }
  bool chance(unsigned percent) { return g() % 100 < percent; }
};

struct Linear {
  void *p;
  int kind;  // 0 cudaMalloc, 1 cuMemAlloc_v2, 2 cudaMallocHost, 3 cuMemAllocHost_v2, 4 async
};

struct Phys {
  CUmemGenericAllocationHandle h;
  std::size_t size;
  unsigned long long alloc;  // the driver's allocation behind h when this thread got it
};

// A skip is proven redundant only if the driver would have had nothing to do. A release skipped
// while the driver still holds this thread's own handle for the same allocation, or an unmap
// skipped while something is mapped at the range, swallowed a real call (the allocation leaks).
void check_release_skip(const char *api, const Phys &p) {
  if (t_skipped && !t_pairing_before && p.alloc != 0 && g_handle_alloc(p.h) == p.alloc) {
    char why[160];
    std::snprintf(why, sizeof why, "a release of handle 0x%llx (allocation %llu), live and owned by "
                  "this thread, was skipped", static_cast<unsigned long long>(p.h), p.alloc);
    mismatch(api, why, 0, 0);
  }
}
void check_unmap_skip(const char *api, CUdeviceptr base) {
  if (t_skipped && g_mapping_at(base) != 0)
    mismatch(api, "an unmap was skipped while the range is mapped", 0, 0);
}

struct Res {
  CUdeviceptr base;
  std::size_t size;
  std::size_t mapped = 0;  // bytes mapped at base (0: nothing)
  bool ever_mapped = false;
};

template <class V>
typename V::value_type take(V &v, std::size_t i) {
  auto x = v[i];
  v[i] = v.back();
  v.pop_back();
  return x;
}

void worker(std::uint64_t seed, int ops) {
  Rng rng(seed);
  // The runtime makes the primary context current on this thread (the driver calls need one).
  if (cudaFree(nullptr) != cudaSuccess) mismatch("cudaFree(nullptr)", "context setup failed", 1, 0);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreate(&stream) != cudaSuccess) stream = nullptr;
  std::vector<Linear> lin;
  std::vector<void *> freed;  // for deliberate double frees
  std::vector<Phys> phys;
  std::vector<CUmemGenericAllocationHandle> released;  // for deliberate double releases
  std::vector<Res> res;
  const CUmemAllocationProp pr = device_prop();
  CUmemAccessDesc acc{};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = 0;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  for (int i = 0; i < ops; ++i) {
    const std::size_t op = rng.below(!g_misuse ? 17 : g_single ? 20 : 18);
    switch (op) {
      case 0:
      case 1: {  // linear allocation through the runtime or the driver
        const int kind = static_cast<int>(rng.below(stream ? 5 : 4));
        const std::size_t n = 512 * (1 + rng.below(2048));
        void *p = nullptr;
        int r = 0;
        switch (kind) {
          case 0: r = checked<cudaError_t>("cudaMalloc", "cuMemAlloc_v2", Skip::No, [&] { return cudaMalloc(&p, n); }); break;
          case 1: {
            CUdeviceptr d = 0;
            r = checked<CUresult>("cuMemAlloc_v2", "cuMemAlloc_v2", Skip::No, [&] { return cuMemAlloc(&d, n); });
            p = reinterpret_cast<void *>(d);
            break;
          }
          case 2: r = checked<cudaError_t>("cudaMallocHost", "cuMemHostAlloc", Skip::No, [&] { return cudaMallocHost(&p, n); }); break;
          case 3: r = checked<CUresult>("cuMemAllocHost_v2", "cuMemAllocHost_v2", Skip::No, [&] { return cuMemAllocHost(&p, n); }); break;
          case 4: r = checked<cudaError_t>("cudaMallocAsync", "cuMemAllocAsync", Skip::No, [&] { return cudaMallocAsync(&p, n, stream); }); break;
        }
        if (r == 0 && p) lin.push_back(Linear{p, kind});
        break;
      }
      case 2:
      case 3: {  // linear free, by the API family that allocated it
        if (lin.empty()) break;
        const std::size_t k = rng.below(lin.size());
        const Linear l = lin[k];
        int r = 0;
        switch (l.kind) {
          case 0: r = checked<cudaError_t>("cudaFree", "cuMemFree_v2", Skip::Free, [&] { return cudaFree(l.p); }); break;
          case 1: r = checked<CUresult>("cuMemFree_v2", "cuMemFree_v2", Skip::Free, [&] { return cuMemFree(reinterpret_cast<CUdeviceptr>(l.p)); }); break;
          case 2: r = checked<cudaError_t>("cudaFreeHost", "cuMemFreeHost", Skip::Free, [&] { return cudaFreeHost(l.p); }); break;
          case 3: r = checked<CUresult>("cuMemFreeHost", "cuMemFreeHost", Skip::Free, [&] { return cuMemFreeHost(l.p); }); break;
          case 4: r = checked<cudaError_t>("cudaFreeAsync", "cuMemFreeAsync", Skip::Free, [&] { return cudaFreeAsync(l.p, stream); }); break;
        }
        if (r == 0) {
          take(lin, k);
          if (l.kind == 0 || l.kind == 1) freed.push_back(l.p);
        }
        break;
      }
      case 4: {  // physical allocation
        CUmemGenericAllocationHandle h = 0;
        const std::size_t n = kG * (1 + rng.below(3));
        if (checked<CUresult>("cuMemCreate", "cuMemCreate", Skip::No, [&] { return cuMemCreate(&h, n, &pr, 0); }) == 0)
          phys.push_back(Phys{h, n, g_handle_alloc(h)});
        break;
      }
      case 5: {  // reservation (sometimes bigger than what will be mapped)
        CUdeviceptr v = 0;
        const std::size_t n = kG * (1 + rng.below(4));
        if (checked<CUresult>("cuMemAddressReserve", "cuMemAddressReserve", Skip::No, [&] { return cuMemAddressReserve(&v, n, 0, 0, 0); }) == 0)
          res.push_back(Res{v, n});
        break;
      }
      case 6:
      case 7: {  // map a handle into an empty reservation that fits, then set access
        if (phys.empty() || res.empty()) break;
        const Phys p = phys[rng.below(phys.size())];
        Res *r = nullptr;
        for (auto &x : res)
          if (!x.mapped && x.size >= p.size) r = &x;
        if (!r) break;
        if (checked<CUresult>("cuMemMap", "cuMemMap", Skip::No, [&] { return cuMemMap(r->base, p.size, 0, p.h, 0); }) != 0)
          break;
        r->mapped = p.size;
        r->ever_mapped = true;
        checked<CUresult>("cuMemSetAccess", "cuMemSetAccess", Skip::No, [&] { return cuMemSetAccess(r->base, p.size, &acc, 1); });
        break;
      }
      case 8: {  // unmap
        if (res.empty()) break;
        Res &r = res[rng.below(res.size())];
        if (!r.mapped) break;
        const int ur = checked<CUresult>("cuMemUnmap", "cuMemUnmap", Skip::Unmap, [&] { return cuMemUnmap(r.base, r.mapped); });
        check_unmap_skip("cuMemUnmap", r.base);
        if (ur == 0) r.mapped = 0;
        break;
      }
      case 9:
      case 10: {  // release (mapped or not: a mapping keeps the memory alive, D13)
        if (phys.empty()) break;
        const std::size_t k = rng.below(phys.size());
        const Phys p = phys[k];
        const int rr = checked<CUresult>("cuMemRelease", "cuMemRelease", Skip::Release, [&] { return cuMemRelease(p.h); });
        check_release_skip("cuMemRelease", p);
        if (rr == 0) {
          take(phys, k);
          released.push_back(p.h);
        }
        break;
      }
      case 11: {  // address free of an unmapped reservation
        if (res.empty()) break;
        const std::size_t k = rng.below(res.size());
        if (res[k].mapped) break;
        const Res r = res[k];
        if (checked<CUresult>("cuMemAddressFree", "cuMemAddressFree", Skip::No, [&] { return cuMemAddressFree(r.base, r.size); }) == 0)
          take(res, k);
        break;
      }
      case 12: {  // retain a handle from a mapped address (NCCL does this), release it later
        for (auto &r : res) {
          if (!r.mapped) continue;
          CUmemGenericAllocationHandle h = 0;
          if (checked<CUresult>("cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", Skip::No, [&] {
                return cuMemRetainAllocationHandle(&h, reinterpret_cast<void *>(r.base));
              }) == 0)
            phys.push_back(Phys{h, r.mapped, g_handle_alloc(h)});
          break;
        }
        break;
      }
      case 13: {  // export a handle as a descriptor, import it again, release the import
        if (phys.empty()) break;
        const Phys p = phys[rng.below(phys.size())];
        int fd = -1;
        if (checked<CUresult>("cuMemExportToShareableHandle", "cuMemExportToShareableHandle", Skip::No, [&] {
              return cuMemExportToShareableHandle(&fd, p.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
            }) != 0)
          break;
        CUmemGenericAllocationHandle h2 = 0;
        if (checked<CUresult>("cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle", Skip::No, [&] {
              return cuMemImportFromShareableHandle(&h2, reinterpret_cast<void *>(static_cast<std::intptr_t>(fd)),
                                                    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            }) == 0) {
          // An imported allocation must not outlive the step (its size is unknown to the shim's
          // byte counts): retry the release through injected faults. Another thread's stale
          // release (misuse) may have released it already: then the shim skips, provably.
          const Phys imp{h2, 0, g_handle_alloc(h2)};
          for (int t = 0; t < 200; ++t) {
            const int ir = checked<CUresult>("cuMemRelease", "cuMemRelease", Skip::Release, [&] { return cuMemRelease(h2); });
            check_release_skip("cuMemRelease", imp);
            if (ir == 0) break;
          }
        }
        close(fd);
        break;
      }
      case 14: {  // legacy IPC export: works on cudaMalloc memory, refused on VMM memory
        cudaIpcMemHandle_t ih;
        if (!lin.empty() && rng.chance(50)) {
          const Linear l = lin[rng.below(lin.size())];
          if (l.kind == 0 || l.kind == 1)
            checked<cudaError_t>("cudaIpcGetMemHandle", "cuIpcGetMemHandle", Skip::No, [&] { return cudaIpcGetMemHandle(&ih, l.p); });
        } else {
          for (auto &r : res)
            if (r.mapped) {
              checked<cudaError_t>("cudaIpcGetMemHandle", "cuIpcGetMemHandle", Skip::No,
                                   [&] { return cudaIpcGetMemHandle(&ih, reinterpret_cast<void *>(r.base)); });
              break;
            }
        }
        break;
      }
      case 15: {  // a pool trim, which frees nothing the shim tracks
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess)
          checked<cudaError_t>("cudaMemPoolTrimTo", "cuMemPoolTrimTo", Skip::No, [&] { return cudaMemPoolTrimTo(pool, 0); });
        break;
      }
      case 16: {  // a call the driver refuses: unmap of half a mapping (D9), never skipped
        for (auto &r : res)
          if (r.mapped >= 2 * kG) {
            checked<CUresult>("cuMemUnmap", "cuMemUnmap", Skip::No, [&] { return cuMemUnmap(r.base, kG); });
            break;
          }
        break;
      }
      // ---- misuse: the sleep-mode and double-free patterns the guard exists for
      case 17: {  // unmap of a range with nothing mapped (D3/D4: success, nothing to do)
        for (auto &r : res)
          if (!r.mapped) {
            checked<CUresult>("cuMemUnmap", "cuMemUnmap", Skip::Unmap, [&] { return cuMemUnmap(r.base, r.size); });
            check_unmap_skip("cuMemUnmap", r.base);
            break;
          }
        break;
      }
      case 18: {  // release a value released before (D6), which may since be re-issued (D18)
        if (released.empty()) break;
        const auto h = released[rng.below(released.size())];
        checked<CUresult>("cuMemRelease", "cuMemRelease", Skip::Release, [&] { return cuMemRelease(h); });
        break;
      }
      case 19: {  // free an address freed before (P29), which may since be re-issued (P30)
        if (freed.empty()) break;
        void *p = freed[rng.below(freed.size())];
        checked<cudaError_t>("cudaFree", "cuMemFree_v2", Skip::Free, [&] { return cudaFree(p); });
        break;
      }
    }
    if (freed.size() > 64) freed.erase(freed.begin());
    if (released.size() > 64) released.erase(released.begin());
  }
  // Leave part of what was made live: the exit summary and leak records must match the driver.
  if (stream) cudaStreamDestroy(stream);
}

std::set<std::string> descriptors(bool include_memfd) {
  std::set<std::string> out;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return out;
  const int own = dirfd(d);
  while (dirent *e = readdir(d)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
    char link[300], target[512];
    std::snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = 0;
    // The fake keeps one memfd per live allocation and per device arena: its objects, not leaks.
    if (!include_memfd && std::strncmp(target, "/memfd:fakecuda", 15) == 0) continue;
    out.insert(std::string(e->d_name) + " " + target);
  }
  closedir(d);
  return out;
}

int threads_now() {
  int n = 0;
  DIR *d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent *e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// The count once it holds still: a thread that was just joined can still be listed in
// /proc/self/task for a moment (the kernel wakes the joiner before it reaps the task).
int threads_settled() {
  int n = threads_now();
  for (int i = 0; i < 200; ++i) {
    usleep(1000);
    const int m = threads_now();
    if (m == n) return n;
    n = m;
  }
  return n;
}

template <class F>
F fake_fn(const char *name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: stress SEED OPS_PER_THREAD THREADS [misuse]\n");
    return 64;
  }
  const std::uint64_t seed = std::strtoull(argv[1], nullptr, 10);
  const int ops = std::atoi(argv[2]);
  const int nthreads = std::max(1, std::atoi(argv[3]));
  g_misuse = argc > 4 && std::strcmp(argv[4], "misuse") == 0;
  g_single = nthreads == 1;
  g_thread_calls = fake_fn<fakecuda_thread_calls_fn>("fakecuda_thread_calls");
  g_last_call = fake_fn<fakecuda_thread_last_call_fn>("fakecuda_thread_last_call");
  g_get_state = fake_fn<fakecuda_get_state_fn>("fakecuda_get_state");
  g_injected = fake_fn<fakecuda_faults_injected_fn>("fakecuda_faults_injected");
  g_handle_live = fake_fn<fakecuda_handle_live_fn>("fakecuda_handle_live");
  g_handle_alloc = fake_fn<fakecuda_handle_allocation_fn>("fakecuda_handle_allocation");
  g_mapping_at = fake_fn<fakecuda_mapping_handle_fn>("fakecuda_mapping_handle");
  if (!g_thread_calls || !g_last_call || !g_get_state || !g_injected || !g_handle_live ||
      !g_handle_alloc || !g_mapping_at) {
    std::fprintf(stderr, "stress: needs the fake driver's control API (tests/fakecuda)\n");
    return 77;
  }
  // The first call initialises the runtime and activates the shim (which opens its log): the
  // descriptor and thread baseline is taken after it.
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "stress: cudaFree(nullptr) failed\n");
    return 2;
  }
  // A first thread before the baseline: a sanitizer runtime starts its own helper thread when the
  // program first creates one (ThreadSanitizer does), and that thread is not the shim's.
  std::thread([] {}).join();
  const std::set<std::string> fds0 = descriptors(false);
  const int threads0 = threads_settled();
  std::vector<std::thread> ts;
  for (int t = 0; t < nthreads; ++t) ts.emplace_back(worker, seed * 1000003u + static_cast<unsigned>(t), ops);
  for (auto &t : ts) t.join();
  const std::set<std::string> fds1 = descriptors(false);
  const int threads1 = threads_settled();

  fakecuda_state st{};
  g_get_state(&st);
  std::printf("calls %llu\n", g_calls.load());
  std::printf("errors %llu\n", g_errors.load());
  std::printf("injected_seen %llu\n", g_injected_seen.load());
  std::printf("injected_total %llu\n", g_injected());
  std::printf("skipped %llu\n", g_skipped.load());
  std::printf("skipped.unmap %llu\n", g_skips_by_api[0].load());
  std::printf("skipped.release %llu\n", g_skips_by_api[1].load());
  std::printf("skipped.free %llu\n", g_skips_by_api[2].load());
  std::printf("mismatches %llu\n", g_mismatches.load());
  std::printf("fake.linear_allocs %llu\nfake.linear_bytes %llu\n", st.linear_allocs, st.linear_bytes);
  std::printf("fake.host_allocs %llu\nfake.host_bytes %llu\n", st.host_allocs, st.host_bytes);
  std::printf("fake.phys_allocs %llu\nfake.phys_bytes %llu\n", st.phys_allocs, st.phys_bytes);
  std::printf("fake.handle_values %llu\nfake.handle_refs %llu\n", st.handle_values, st.handle_refs);
  std::printf("fake.reservations %llu\nfake.reserved_bytes %llu\n", st.reservations, st.reserved_bytes);
  std::printf("fake.mappings %llu\nfake.mapped_bytes %llu\n", st.mappings, st.mapped_bytes);
  std::printf("threads %d %d\n", threads0, threads1);
  int leaked = 0;
  for (const auto &f : fds1)
    if (!fds0.count(f)) {
      std::printf("fd_leak %s\n", f.c_str());
      ++leaked;
    }
  std::printf("fds_leaked %d\n", leaked);
  std::fflush(stdout);
  return 0;
}
