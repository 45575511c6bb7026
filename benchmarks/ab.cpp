// SPDX-License-Identifier: Apache-2.0
// In-process A/B overhead benchmark (docs/performance.md, "Method"): each operation through the
// driver's own entry points — read from the loaded libcuda.so.1's .dynsym on disk plus its load
// base, so no interposer can stand in between — against the symbols a program binds
// (dlsym(RTLD_DEFAULT): the shim's wrappers under LD_PRELOAD, the driver's own without it),
// alternated in blocks within one process, so both see the same driver state, the same caches and
// the same noise. Per round: one block of each, in an order swapped every round; the figure is the
// median over rounds of the per-round ratio (bound / direct), with its quartiles, and of the added
// ns per intercepted call. A control run without the shim must read 1.00 within its quartiles.
//
//   cmg-bench-ab [--rounds N] [--block K] [--only NAME,...]
//   cmg-bench-ab --callgrind N      under valgrind --tool=callgrind: the pair, the VMM cycle and the
//                                   refused unmap, each N times direct and N times bound after a
//                                   warm-up, each run dumped as OP-direct / OP-bound (tools/bench
//                                   --budgets reads the dumps: instructions the shim adds per call)
//
// Per-process medians are noisier than the effect on shared machines, which is why this is not a
// Google Benchmark program: the figure is a paired ratio, not an absolute time.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "own_symbol.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define AB_ZERO() CALLGRIND_ZERO_STATS
#define AB_DUMP(name) CALLGRIND_DUMP_STATS_AT(name)
#else
#define AB_ZERO() ((void)0)
#define AB_DUMP(name) ((void)(name))
#endif

namespace {

constexpr std::size_t kSize = 2u << 20;  // 2 MiB: one granule (real-driver.md D19)

[[noreturn]] void die(const char *what, int code) {
  std::fprintf(stderr, "cmg-bench-ab: %s failed (%d)\n", what, code);
  std::exit(1);
}
#define AB_CHECK(call)                  \
  do {                                  \
    int r_ = static_cast<int>(call);    \
    if (r_ != 0) die(#call, r_);        \
  } while (0)

using cmg_test::find_loaded;
using cmg_test::Loaded;

// The address of `name` in the library's own .dynsym: its definition, whoever interposes it.
void *own_or_die(const Loaded &l, const char *name) {
  void *res = cmg_test::own_symbol(l, name);
  if (!res) die(name, 0);
  return res;
}

struct Api {
  PFN_cuMemAlloc_v3020 alloc;
  PFN_cuMemFree_v3020 free_;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemSetAccess_v10020 access;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemAddressFree_v10020 afree;
  PFN_cuGetProcAddress_v12000 gpa;
  PFN_cuDriverGetVersion_v2020 version;
  PFN_cuCtxGetDevice_v2000 ctx_device;
  cudaError_t (*rt_malloc)(void **, std::size_t);
  cudaError_t (*rt_free)(void *);
};

template <class F>
void get(F &f, const char *name, const Loaded *own) {
  f = reinterpret_cast<F>(own ? own_or_die(*own, name) : dlsym(RTLD_DEFAULT, name));
  if (!f) die(name, 0);
}

Api load(const Loaded *cuda, const Loaded *rt) {
  Api a;
  get(a.alloc, "cuMemAlloc_v2", cuda);
  get(a.free_, "cuMemFree_v2", cuda);
  get(a.create, "cuMemCreate", cuda);
  get(a.reserve, "cuMemAddressReserve", cuda);
  get(a.map, "cuMemMap", cuda);
  get(a.access, "cuMemSetAccess", cuda);
  get(a.unmap, "cuMemUnmap", cuda);
  get(a.release, "cuMemRelease", cuda);
  get(a.afree, "cuMemAddressFree", cuda);
  get(a.gpa, "cuGetProcAddress_v2", cuda);
  get(a.version, "cuDriverGetVersion", cuda);
  get(a.ctx_device, "cuCtxGetDevice", cuda);
  get(a.rt_malloc, "cudaMalloc", rt);
  get(a.rt_free, "cudaFree", rt);
  return a;
}

CUmemAllocationProp device_prop() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  return p;
}

CUmemAccessDesc rw() {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}

// ---- operations -------------------------------------------------------------------------------

void op_pair(const Api &a) {
  CUdeviceptr p;
  AB_CHECK(a.alloc(&p, kSize));
  AB_CHECK(a.free_(p));
}

void op_runtime(const Api &a) {
  void *p;
  AB_CHECK(a.rt_malloc(&p, kSize));
  AB_CHECK(a.rt_free(p));
}

void op_vmm(const Api &a) {
  static const CUmemAllocationProp pr = device_prop();
  static const CUmemAccessDesc ad = rw();
  CUmemGenericAllocationHandle h;
  CUdeviceptr v;
  AB_CHECK(a.create(&h, kSize, &pr, 0));
  AB_CHECK(a.reserve(&v, kSize, 0, 0, 0));
  AB_CHECK(a.map(v, kSize, 0, h, 0));
  AB_CHECK(a.access(v, kSize, &ad, 1));
  AB_CHECK(a.unmap(v, kSize));
  AB_CHECK(a.release(h));
  AB_CHECK(a.afree(v, kSize));
}

// PyTorch's expandable segments: a page mapped and unmapped at the end of one reservation that
// holds 4,096 mapped pages (8 GiB of 2 MiB pages), made through the bound symbols so the shim's
// model holds them all.
constexpr std::size_t kPages = 4096;
CUdeviceptr g_big = 0;
void setup_big(const Api &bound) {
  static const CUmemAllocationProp pr = device_prop();
  static const CUmemAccessDesc ad = rw();
  AB_CHECK(bound.reserve(&g_big, (kPages + 1) * kSize, 0, 0, 0));
  for (std::size_t i = 0; i < kPages; ++i) {
    CUmemGenericAllocationHandle h;
    AB_CHECK(bound.create(&h, kSize, &pr, 0));
    AB_CHECK(bound.map(g_big + i * kSize, kSize, 0, h, 0));
    AB_CHECK(bound.release(h));  // the mapping keeps it (real-driver.md D13)
  }
  AB_CHECK(bound.access(g_big, kPages * kSize, &ad, 1));
}
void op_page(const Api &a) {
  static const CUmemAllocationProp pr = device_prop();
  static const CUmemAccessDesc ad = rw();
  const CUdeviceptr at = g_big + kPages * kSize;
  CUmemGenericAllocationHandle h;
  AB_CHECK(a.create(&h, kSize, &pr, 0));
  AB_CHECK(a.map(at, kSize, 0, h, 0));
  AB_CHECK(a.access(at, kSize, &ad, 1));
  AB_CHECK(a.unmap(at, kSize));
  AB_CHECK(a.release(h));
}

// real-driver.md D10: an unmap of an address never reserved is refused (INVALID_VALUE).
void op_refused(const Api &a) {
  if (a.unmap(static_cast<CUdeviceptr>(0x1000), kSize) == CUDA_SUCCESS) die("refused unmap", 0);
}

void op_lookup(const Api &a) {
  void *fn = nullptr;
  CUdriverProcAddressQueryResult st;
  AB_CHECK(a.gpa("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st));
}

void op_not_intercepted(const Api &a) {
  int v;
  AB_CHECK(a.version(&v));
}

// What the shim's own device look-up costs (it is not intercepted: the ratio reads 1).
void op_ctx_device(const Api &a) {
  CUdevice d;
  AB_CHECK(a.ctx_device(&d));
}

struct Op {
  const char *name;
  const char *label;
  void (*fn)(const Api &);
  int calls;  // intercepted calls per operation (0: not intercepted)
};

const Op kOps[] = {
    {"pair", "cuMemAlloc_v2 + cuMemFree_v2, 2 MiB", op_pair, 2},
    {"runtime", "cudaMalloc + cudaFree, 2 MiB", op_runtime, 2},
    {"vmm", "VMM cycle, 2 MiB (7 calls)", op_vmm, 7},
    {"page", "page next to 4,096 mapped (5 calls)", op_page, 5},
    {"refused", "cuMemUnmap refused (D10)", op_refused, 1},
    {"lookup", "cuGetProcAddress(\"cuMemAlloc\")", op_lookup, 1},
    {"not-intercepted", "cuDriverGetVersion (not intercepted)", op_not_intercepted, 1},
    {"ctx-device", "cuCtxGetDevice (not intercepted)", op_ctx_device, 1},
};

double block(void (*op)(const Api &), const Api &a, int k) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < k; ++i) op(a);
  return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / k;
}

// Instruction counts (--callgrind): no timing, so no rounds; each run is dumped on its own, and the
// difference of the two runs of an operation over N is what the shim adds per operation.
int callgrind_runs(const Api &direct, const Api &bound, int n) {
  for (const Op &o : kOps) {
    if (o.fn != op_pair && o.fn != op_vmm && o.fn != op_refused) continue;
    // Warm-up: lazy binding, the first growth of every table, the shim's activation.
    for (int i = 0; i < 50; ++i) {
      o.fn(direct);
      o.fn(bound);
    }
    const std::string d = std::string(o.name) + "-direct", b = std::string(o.name) + "-bound";
    AB_ZERO();
    for (int i = 0; i < n; ++i) o.fn(direct);
    AB_DUMP(d.c_str());
    for (int i = 0; i < n; ++i) o.fn(bound);
    AB_DUMP(b.c_str());
    std::printf("callgrind %s %d %d\n", o.name, n, o.calls);
  }
  return 0;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

}  // namespace

int main(int argc, char **argv) {
  int rounds = 30, k = 200, cg = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--block" && i + 1 < argc) k = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = "," + std::string(argv[++i]) + ",";
    else if (a == "--callgrind" && i + 1 < argc) cg = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: cmg-bench-ab [--rounds N] [--block K] [--only NAME,...] | --callgrind N\n");
      return 64;
    }
  }
  if (rounds < 4 || k < 1) die("arguments", 64);
  // The program links the runtime (PLT calls to cudaMalloc/cudaFree, as libtorch_cuda.so does) and
  // binds driver symbols globally, as a program linked with -lcuda does.
  if (!dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)) die("dlopen(libcuda.so.1)", 0);
  void *p = nullptr;
  AB_CHECK(cudaFree(p));
  const Loaded cuda = find_loaded("libcuda.so");
  const Loaded rt = find_loaded("libcudart.so");
  if (cuda.path.empty() || rt.path.empty()) die("finding libcuda/libcudart", 0);
  const Api direct = load(&cuda, &rt), bound = load(nullptr, nullptr);
  if (cg > 0) return callgrind_runs(direct, bound, cg);
  const bool shim = dlsym(RTLD_DEFAULT, "cumemguard_maybe_empty_cache") != nullptr;
  void *own_version = reinterpret_cast<void *>(direct.version);
  void *via_gpa = nullptr;
  CUdriverProcAddressQueryResult st;
  bound.gpa("cuDriverGetVersion", &via_gpa, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
  std::printf("# cmg-bench-ab: shim %s; %s; rounds %d x block %d\n", shim ? "preloaded" : "absent",
              cuda.path.c_str(), rounds, k);
  std::printf("# not intercepted: dlsym and cuGetProcAddress give the driver's own pointer: %s, %s\n",
              reinterpret_cast<void *>(bound.version) == own_version ? "yes" : "NO",
              via_gpa == own_version ? "yes" : "NO");
  std::printf("%-38s %12s %8s %8s %8s %12s\n", "operation", "direct ns", "ratio", "q1", "q3",
              "added ns/call");
  double pair_added = 0;
  for (const Op &o : kOps) {
    if (!only.empty() && only.find("," + std::string(o.name) + ",") == std::string::npos) continue;
    if (o.fn == op_page && !g_big) setup_big(bound);
    for (int w = 0; w < 3; ++w) {
      block(o.fn, direct, k);
      block(o.fn, bound, k);
    }
    std::vector<double> ratio, added, base;
    for (int r = 0; r < rounds; ++r) {
      double x, y;
      if (r & 1) {
        y = block(o.fn, bound, k);
        x = block(o.fn, direct, k);
      } else {
        x = block(o.fn, direct, k);
        y = block(o.fn, bound, k);
      }
      ratio.push_back(y / x);
      added.push_back((y - x) / o.calls);
      base.push_back(x);
    }
    double med_added = quantile(added, 0.5);
    // The runtime's "direct" entry still reaches the driver through the pointers it got from
    // cuGetProcAddress, which under the shim are the shim's (tracked there instead): what the
    // shim adds to a runtime pair is what the bound runtime pair adds over that, plus what it adds
    // to the driver pair it makes (the pair row above, measured in this same process).
    const bool derived = o.fn == op_runtime && shim;
    if (derived) med_added += pair_added;
    double med_ratio = quantile(ratio, 0.5), q1 = quantile(ratio, 0.25), q3 = quantile(ratio, 0.75);
    if (derived) {
      const double b = quantile(base, 0.5), fix = 2 * pair_added;
      med_ratio = (med_ratio * b) / (b - fix);
      q1 = (q1 * b) / (b - fix);
      q3 = (q3 * b) / (b - fix);
    }
    if (o.fn == op_pair) pair_added = med_added;
    std::printf("%-38s %12.0f %8.4f %8.4f %8.4f %+12.1f%s\n", o.label, quantile(base, 0.5), med_ratio,
                q1, q3, med_added, derived ? "  (derived: see docs/performance.md)" : "");
    std::fflush(stdout);
  }
  return 0;
}
