// SPDX-License-Identifier: Apache-2.0
// shim/symtab: the in-process .symtab symbolizer names local (non-exported) functions, classifies
// them with the flush patterns, caches per address, and degrades to module+offset or a bare
// address.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdint>
#include <string>

#include "symtab.h"

using namespace cmg;
using namespace cmg::shim;

namespace {

// A local function named like PyTorch's flush: in .symtab only (anonymous namespace).
namespace NativeCachingAllocator {
__attribute__((noinline)) int emptyCache(int x) {
  asm volatile("" ::: "memory");
  return x * 3 + 1;
}
}  // namespace NativeCachingAllocator

__attribute__((noinline)) int plain_local_function(int x) {
  asm volatile("" ::: "memory");
  return x + 7;
}

// A "return address" inside f: symbolize() looks up pc - 1.
std::uintptr_t inside(int (*f)(int)) { return reinterpret_cast<std::uintptr_t>(f) + 2; }

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace

TEST_CASE("Local functions are named from .symtab and classified") {
  const FlushPatterns pats = FlushPatterns::from_option("!plain_local_function");
  const std::uintptr_t pcs[] = {inside(&NativeCachingAllocator::emptyCache),
                                inside(&plain_local_function)};
  const FrameSym *fs[2];
  frame_syms(pcs, 2, pats, fs);
  CHECK(fs[0]->module == self_exe());
  CHECK(fs[0]->demangled == "(anonymous namespace)::NativeCachingAllocator::emptyCache(int)");
  CHECK(fs[0]->name.rfind("_ZN", 0) == 0);
  CHECK(fs[0]->start == reinterpret_cast<std::uintptr_t>(&NativeCachingAllocator::emptyCache));
  CHECK(fs[0]->kind == FrameKind::Flush);
  CHECK(fs[1]->demangled == "(anonymous namespace)::plain_local_function(int)");
  CHECK(fs[1]->kind == FrameKind::Retry);
  CHECK(frame_text(*fs[0], pcs[0]) ==
        "(anonymous namespace)::NativeCachingAllocator::emptyCache(int)+0x2 (test_symtab)");
  // Cached per address: the same entry comes back.
  const FrameSym *again;
  frame_syms(pcs, 1, pats, &again);
  CHECK(again == fs[0]);
}

TEST_CASE("Addresses outside every object give a bare address") {
  int on_stack = 0;
  const std::uintptr_t pc = reinterpret_cast<std::uintptr_t>(&on_stack);
  const FrameSym *f;
  frame_syms(&pc, 1, FlushPatterns::from_option(""), &f);
  CHECK(f->module.empty());
  CHECK(f->name.empty());
  CHECK(f->kind == FrameKind::Other);
  CHECK(frame_text(*f, pc).rfind("0x", 0) == 0);
}
