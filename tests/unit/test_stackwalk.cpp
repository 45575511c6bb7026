// SPDX-License-Identifier: Apache-2.0
// The cached stack walker gives exactly what libgcc's _Unwind_Backtrace gives, through frames of
// every shape the compilers emit: plain, frame-pointer (alloca), large frames, libc (qsort
// callbacks), libstdc++ (std::function), other threads, and again from its cache.
#include <alloca.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

#include "stackwalk.h"

using cmg::shim::cached_backtrace;
using cmg::shim::libgcc_backtrace;

namespace {

struct Result {
  std::vector<std::uintptr_t> cached, libgcc;
  int n_cached = 0, n_libgcc = 0;
};

int g_max = 64;
Result g_last;

// Both walks from the same function; the first entry (each call's own return address here)
// differs by construction, every later one must be equal.
__attribute__((noinline)) void capture_both() {
  std::uintptr_t a[64] = {}, b[64] = {};
  g_last.n_cached = cached_backtrace(a, g_max, nullptr);
  g_last.n_libgcc = libgcc_backtrace(b, g_max, nullptr);
  g_last.cached.assign(a, a + std::max(0, g_last.n_cached));
  g_last.libgcc.assign(b, b + std::max(0, g_last.n_libgcc));
}

void check_last() {
  REQUIRE(g_last.n_cached == g_last.n_libgcc);
  REQUIRE(g_last.n_cached > 0);
  for (int i = 1; i < g_last.n_cached; ++i) {
    INFO("frame " << i);
    CHECK(g_last.cached[static_cast<std::size_t>(i)] == g_last.libgcc[static_cast<std::size_t>(i)]);
  }
}

__attribute__((noinline)) void plain(int depth) {
  if (depth == 0) return capture_both();
  plain(depth - 1);
  asm volatile("" ::: "memory");
}

// alloca forces a frame pointer: the CFA is rbp-based in these frames.
__attribute__((noinline)) void with_alloca(int depth) {
  volatile char *p = static_cast<char *>(alloca(static_cast<std::size_t>(64 + depth * 16)));
  p[0] = static_cast<char>(depth);
  if (depth == 0) return capture_both();
  if (depth % 3 == 0)
    plain(2);
  with_alloca(depth - 1);
  asm volatile("" ::: "memory");
}

__attribute__((noinline)) void big_frame(int depth) {
  char buf[20000];
  buf[depth] = 1;
  asm volatile("" : : "r"(buf) : "memory");  // keeps the frame large
  if (depth == 0) return capture_both();
  big_frame(depth - 1);
  asm volatile("" ::: "memory");
}

int g_qsort_depth = 0;
int compare_and_capture(const void *a, const void *b) {
  if (g_qsort_depth-- == 0) capture_both();
  return *static_cast<const int *>(a) - *static_cast<const int *>(b);
}

__attribute__((noinline)) void through_libc(int depth) {
  if (depth > 0) {
    through_libc(depth - 1);
    asm volatile("" ::: "memory");
    return;
  }
  int v[4] = {4, 3, 2, 1};
  g_qsort_depth = 1;
  std::qsort(v, 4, sizeof v[0], compare_and_capture);
}

__attribute__((noinline)) void through_function(int depth) {
  std::function<void(int)> f = [&](int d) {
    if (d == 0) return capture_both();
    through_function(d - 1);
  };
  f(depth);
  asm volatile("" ::: "memory");
}

}  // namespace

TEST_CASE("cached walk equals libgcc's, every frame shape") {
  for (int max : {1, 8, 16, 32, 64}) {
    g_max = max;
    for (int depth : {0, 1, 5, 40}) {
      INFO("max " << max << " depth " << depth);
      plain(depth);
      check_last();
      with_alloca(depth);
      check_last();
      big_frame(depth % 8);
      check_last();
      through_libc(depth);
      check_last();
      through_function(depth);
      check_last();
    }
  }
}

TEST_CASE("cached walk equals libgcc's on another thread, and from its cache") {
  g_max = 64;
  std::thread t([] {
    for (int round = 0; round < 3; ++round) {
      with_alloca(7);
      check_last();
      through_libc(3);
      check_last();
    }
  });
  t.join();
}

TEST_CASE("the skip predicate drops leading frames only") {
  std::uintptr_t a[8], b[8];
  auto skip_nothing = [](std::uintptr_t) { return false; };
  const int na = cached_backtrace(a, 8, skip_nothing);
  const int nb = libgcc_backtrace(b, 8, skip_nothing);
  REQUIRE(na == nb);
  // Skipping every frame leaves nothing, in both.
  auto skip_all = [](std::uintptr_t) { return true; };
  CHECK(cached_backtrace(a, 8, skip_all) == 0);
  CHECK(libgcc_backtrace(b, 8, skip_all) == 0);
}
