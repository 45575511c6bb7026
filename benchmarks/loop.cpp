// SPDX-License-Identifier: Apache-2.0
// cmg-bench-loop: times CUDA memory operations in plain loops and prints one line per operation.
// No dependency beyond libc and the CUDA libraries it is run against, so the same binary runs on
// the fake stack, under valgrind --tool=callgrind (each operation's loop is dumped separately), and
// on the GPU machine, where tests/gpu/bench.sh runs it alternately without and with the shim.
//
//   cmg-bench-loop [--iters N] [--batches B] [--size BYTES] [--live N] [--depth D] OP...
//   OP: alloc runtime vmm vmm-page gpa gpa-passthrough not-intercepted fail identity live, each optionally
//       OP:N for N operations instead of --iters (one process then times operations of very
//       different costs, which keeps the driver's start-up out of the GPU runs)
//
// Output, one line per operation: "op=alloc iters=N ns_median=... ns_min=... ns_max=..." where ns_*
// are per operation over the B batches (median of the batch means). "live" prints the heap bytes
// per live allocation with N allocations held, then times alloc+free pairs with them held.
// The operations run at the bottom of D extra frames (default 32), as in a real program, where a
// cudaMalloc is reached through tens of frames: captured stacks then have all the frames asked for.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_ops.h"

#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define CMGB_ZERO() CALLGRIND_ZERO_STATS
#define CMGB_DUMP(name) CALLGRIND_DUMP_STATS_AT(name)
#else
#define CMGB_ZERO() ((void)0)
#define CMGB_DUMP(name) ((void)(name))
#endif

using namespace cmgbench;

namespace {

struct Opts {
  long iters = 20000;
  int batches = 20;
  std::size_t size = 2 * kMiB;
  long live = 1000000;
  int depth = 32;
};

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Warms up, then runs `iters` operations in `batches` timed batches. Under callgrind, the batches
// (and nothing else) are dumped under the operation's name.
template <class F>
void timed(const char *name, const Opts &o, F &&op) {
  const long warm = std::max(10L, o.iters / 20);
  for (long i = 0; i < warm; ++i) op();
  const long per = std::max(1L, o.iters / o.batches);
  std::vector<double> ns;
  CMGB_ZERO();
  for (int b = 0; b < o.batches; ++b) {
    const std::uint64_t t0 = now_ns();
    for (long i = 0; i < per; ++i) op();
    ns.push_back(static_cast<double>(now_ns() - t0) / static_cast<double>(per));
  }
  CMGB_DUMP(name);
  std::sort(ns.begin(), ns.end());
  std::printf("op=%s iters=%ld ns_median=%.1f ns_min=%.1f ns_max=%.1f\n", name,
              per * o.batches, ns[ns.size() / 2], ns.front(), ns.back());
  std::fflush(stdout);
}

const char *object_of(void *p) {
  Dl_info info;
  if (!p || !dladdr(p, &info) || !info.dli_fname) return "?";
  const char *slash = std::strrchr(info.dli_fname, '/');
  return slash ? slash + 1 : info.dli_fname;
}

// A call the shim does not intercept must reach the caller as the driver's own pointer: the one
// cuGetProcAddress answers is the one dlsym finds in libcuda.so.1, and lies in it. (For an
// intercepted name both answers are the shim's wrapper, in libcumemguard.so.)
void identity(Driver &d) {
  for (const char *name : {"cuCtxSynchronize", "cuMemGetInfo", "cuStreamSynchronize", "cuMemAlloc"}) {
    void *from_gpa = lookup(d, name);
    std::string exact = name;
    if (exact == "cuMemGetInfo" || exact == "cuMemAlloc") exact += "_v2";
    void *from_dlsym = dlsym(d.lib, exact.c_str());
    std::printf("identity=%s gpa=%p dlsym=%p same=%d object=%s\n", name, from_gpa, from_dlsym,
                from_gpa == from_dlsym ? 1 : 0, object_of(from_gpa));
  }
  std::fflush(stdout);
}

std::size_t heap_bytes() {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

std::size_t rss_bytes() {
  long pages = 0, resident = 0;
  if (FILE *f = std::fopen("/proc/self/statm", "r")) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// N live allocations: heap and RSS growth per allocation (the fake's own and, under the shim,
// the model's), then alloc+free pairs timed while they are held.
void live(Driver &d, const Opts &o) {
  const std::size_t each = 64 << 10;
  std::vector<CUdeviceptr> held(static_cast<std::size_t>(o.live));
  alloc_free(d, each);
  const std::size_t h0 = heap_bytes(), r0 = rss_bytes();
  for (auto &p : held) CMGB_CHECK(d.memAlloc(&p, each));
  const std::size_t h1 = heap_bytes(), r1 = rss_bytes();
  std::printf("op=live-memory live=%ld heap_bytes_per_alloc=%.1f rss_bytes_per_alloc=%.1f\n",
              o.live, static_cast<double>(h1 - h0) / static_cast<double>(o.live),
              static_cast<double>(r1 - r0) / static_cast<double>(o.live));
  std::fflush(stdout);
  timed("alloc-at-live", o, [&] { alloc_free(d, each); });
  for (auto p : held) CMGB_CHECK(d.memFree(p));
}

}  // namespace

static int at_depth(int depth, const Opts &o, const std::vector<std::string> &ops);

int main(int argc, char **argv) {
  Opts o;
  std::vector<std::string> ops;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) die(("missing value after " + a).c_str(), 2);
      return argv[++i];
    };
    if (a == "--iters") o.iters = std::atol(next());
    else if (a == "--batches") o.batches = std::max(1, std::atoi(next()));
    else if (a == "--size") o.size = std::strtoull(next(), nullptr, 0);
    else if (a == "--live") o.live = std::atol(next());
    else if (a == "--depth") o.depth = std::max(0, std::atoi(next()));
    else if (a == "-h" || a == "--help") {
      std::puts(
          "usage: cmg-bench-loop [--iters N] [--batches B] [--size BYTES] [--live N] "
          "[--depth D] OP[:N]...\n"
          "OP: alloc runtime vmm vmm-page gpa gpa-passthrough not-intercepted fail double-free "
          "double-release identity live");
      return 0;
    } else ops.push_back(a);
  }
  if (ops.empty()) ops = {"identity", "alloc", "runtime", "vmm", "gpa", "gpa-passthrough",
                          "not-intercepted", "fail"};
  return at_depth(o.depth, o, ops);
}

static int run(const Opts &all, const std::vector<std::string> &spec) {
  Driver &d = ready();
  for (const std::string &s : spec) {
    Opts o = all;
    std::string op = s;
    if (auto colon = s.find(':'); colon != std::string::npos) {
      op = s.substr(0, colon);
      o.iters = std::atol(s.c_str() + colon + 1);
    }
    if (op == "alloc") timed("alloc", o, [&] { alloc_free(d, o.size); });
    else if (op == "runtime") timed("runtime", o, [&] { runtime_alloc_free(o.size); });
    else if (op == "vmm") timed("vmm", o, [&] { vmm_cycle(d, o.size); });
    else if (op == "vmm-page") {
      static BigReservation b = big_reservation(d, 4096);
      timed("vmm-page", o, [&] { grow_shrink(d, b); });
    }
    else if (op == "gpa") timed("gpa", o, [&] { (void)lookup(d, "cuMemAlloc"); });
    else if (op == "gpa-passthrough") timed("gpa-passthrough", o, [&] { (void)lookup(d, "cuCtxSynchronize"); });
    else if (op == "not-intercepted") {
      auto sync = reinterpret_cast<PFN_cuCtxSynchronize_v2000>(lookup(d, "cuCtxSynchronize"));
      timed("not-intercepted", o, [&] { CMGB_CHECK(sync()); });
    } else if (op == "fail") timed("fail", o, [&] { failing_unmap(d); });
    else if (op == "double-free")
      timed("double-free", o, [&] { double_free(d); });
    else if (op == "double-release")
      timed("double-release", o, [&] { double_release(d); });
    else if (op == "identity") identity(d);
    else if (op == "live") live(d, o);
    else die(("unknown operation " + op).c_str(), 2);
  }
  return 0;
}

__attribute__((noinline)) static int at_depth(int depth, const Opts &o, const std::vector<std::string> &ops) {
  if (depth == 0) return run(o, ops);
  int r = at_depth(depth - 1, o, ops);
  asm volatile("" ::: "memory");  // keeps the recursion a real call chain
  return r;
}
