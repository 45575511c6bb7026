// SPDX-License-Identifier: Apache-2.0
// A faithful sleep-mode allocator (vLLM's CuMemAllocator / cumem_allocator.cpp): my_malloc
// reserves, creates, maps and sets access; my_free unmaps, releases and frees the range whatever
// the allocation's state (vLLM's sleep-mode bug: unmapping memory freed while asleep); sleep copies out or discards, then unmaps and
// releases; wake_up creates, maps, sets access and copies back. Like vLLM, a failing driver call
// leaves its status in a process-global error code that is kept until the next operation reads it.
//
//   sleep_alloc error   free A while asleep, wake up, check B       (stale error at wake-up)
//   sleep_alloc aba     B woken onto A's old handle value, then A freed while asleep (D18 reuse)
//   sleep_alloc cycles  100 sleep/wake cycles with random frees and allocations while asleep
#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.h"

namespace {

CUresult error_code = CUDA_SUCCESS;  // vLLM keeps the last error here until Python reads it

#define CUMEM_CHECK(call)                 \
  do {                                    \
    CUresult e_ = (call);                 \
    if (e_ != CUDA_SUCCESS) error_code = e_; \
  } while (0)

size_t G = 0;

struct Entry {
  size_t size;
  CUmemGenericAllocationHandle handle;
  bool asleep;
  std::string tag;
  std::vector<unsigned char> backup;
};

std::map<CUdeviceptr, Entry> g_allocs;

void create_and_map(CUdeviceptr v, size_t size, CUmemGenericAllocationHandle *h) {
  if (error_code != CUDA_SUCCESS) return;  // vLLM returns early on a pending error
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  CUMEM_CHECK(cuMemCreate(h, size, &p, 0));
  if (error_code != CUDA_SUCCESS) return;
  CUMEM_CHECK(cuMemMap(v, size, 0, *h, 0));
  if (error_code != CUDA_SUCCESS) return;
  CUmemAccessDesc a{};
  a.location = p.location;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUMEM_CHECK(cuMemSetAccess(v, size, &a, 1));
}

void unmap_and_release(CUdeviceptr v, size_t size, CUmemGenericAllocationHandle h) {
  CUMEM_CHECK(cuMemUnmap(v, size));
  CUMEM_CHECK(cuMemRelease(h));
}

// The Python layer reads and clears the error after each call it makes.
bool take_error(const char *where) {
  if (error_code == CUDA_SUCCESS) return false;
  std::string key = where;
  for (char &c : key)
    if (c == ' ') c = '_';
  std::printf("error.%s %s\n", key.c_str(), cu_name(error_code));
  error_code = CUDA_SUCCESS;
  return true;
}

CUdeviceptr my_malloc(size_t size, const std::string &tag) {
  CUdeviceptr v = 0;
  CUMEM_CHECK(cuMemAddressReserve(&v, size, 0, 0, 0));
  Entry e{size, 0, false, tag, {}};
  create_and_map(v, size, &e.handle);
  g_allocs[v] = e;
  return v;
}

// The allocator's free callback: unmap + release + address free, asleep or not (vLLM's sleep-mode bug).
void my_free(CUdeviceptr v) {
  auto it = g_allocs.find(v);
  if (it == g_allocs.end()) return;
  unmap_and_release(v, it->second.size, it->second.handle);
  CUMEM_CHECK(cuMemAddressFree(v, it->second.size));
  g_allocs.erase(it);
}

void sleep_some(bool offload, const std::vector<CUdeviceptr> &order) {
  for (CUdeviceptr v : order) {
    Entry &e = g_allocs[v];
    if (offload) {
      e.backup.resize(e.size);
      CHECK_CU(cuMemcpyDtoH(e.backup.data(), v, e.size));
    }
    unmap_and_release(v, e.size, e.handle);
    e.asleep = true;
  }
}

void sleep_all(bool offload, bool reverse) {
  std::vector<CUdeviceptr> order;
  for (auto &[v, e] : g_allocs)
    if (!e.asleep) order.push_back(v);
  if (reverse) std::reverse(order.begin(), order.end());
  sleep_some(offload, order);
}

bool wake_up(const std::string &tag) {
  for (auto &[v, e] : g_allocs) {
    if (!e.asleep || (!tag.empty() && e.tag != tag)) continue;
    create_and_map(v, e.size, &e.handle);
    if (error_code != CUDA_SUCCESS) return !take_error(("wake_up " + e.tag).c_str());
    if (!e.backup.empty()) CHECK_CU(cuMemcpyHtoD(v, e.backup.data(), e.size));
    e.asleep = false;
  }
  return true;
}

bool bytes_are(CUdeviceptr v, size_t size, unsigned char value) {
  std::vector<unsigned char> buf(size);
  if (cuMemcpyDtoH(buf.data(), v, size) != CUDA_SUCCESS) return false;
  for (unsigned char c : buf)
    if (c != value) return false;
  return true;
}

int handle_live(CUmemGenericAllocationHandle h) {
  using fn = int (*)(unsigned long long);
  auto f = reinterpret_cast<fn>(dlsym(RTLD_DEFAULT, "fakecuda_handle_live"));
  return f ? f(h) : -1;  // -1: the real driver has no such question
}

int scenario_error() {
  CUdeviceptr a = my_malloc(2 * G, "kv");
  CUdeviceptr b = my_malloc(2 * G, "weights");
  CHECK_CU(cuMemsetD8(a, 0xaa, 2 * G));
  CHECK_CU(cuMemsetD8(b, 0xbb, 2 * G));
  sleep_all(/*offload=*/true, false);
  my_free(a);  // the KV cache is released while the engine sleeps
  bool ok = wake_up("");
  std::printf("wake_ok %d\n", ok ? 1 : 0);
  std::printf("b_intact %d\n", ok && bytes_are(b, 2 * G, 0xbb) ? 1 : 0);
  my_free(b);
  take_error("teardown");
  return 0;
}

int scenario_aba() {
  CUdeviceptr a = my_malloc(2 * G, "kv");
  CUdeviceptr b = my_malloc(2 * G, "weights");
  CHECK_CU(cuMemsetD8(b, 0xbb, 2 * G));
  // Release B first, then A: the driver re-issues the last released value first (D18), so B's
  // wake-up gets A's old handle value.
  sleep_some(/*offload=*/true, {b, a});
  CUmemGenericAllocationHandle a_old = g_allocs[a].handle;
  bool ok = wake_up("weights");
  std::printf("wake_ok %d\n", ok ? 1 : 0);
  std::printf("b_took_a_value %d\n", g_allocs[b].handle == a_old ? 1 : 0);
  my_free(a);  // stale: releases A's old value, which is B's handle now
  take_error("free_a");
  int live = handle_live(g_allocs[b].handle);
  std::printf("b_handle_live %d\n", live);
  std::printf("b_intact %d\n", bytes_are(b, 2 * G, 0xbb) ? 1 : 0);
  // Put B to sleep and wake it again: if its handle was freed behind its back, the release fails.
  sleep_all(true, false);
  bool ok2 = wake_up("");
  std::printf("second_cycle_ok %d\n", ok2 ? 1 : 0);
  std::printf("b_intact_after %d\n", ok2 && bytes_are(b, 2 * G, 0xbb) ? 1 : 0);
  my_free(b);
  std::printf("teardown_error %d\n", take_error("teardown") ? 1 : 0);
  return 0;
}

int scenario_cycles() {
  std::mt19937 rng(12345);
  std::map<CUdeviceptr, unsigned char> pattern;
  int errors = 0, frees_asleep = 0, bad_bytes = 0;
  for (int i = 0; i < 4; ++i) {
    CUdeviceptr v = my_malloc(G * (1 + i % 2), "t" + std::to_string(i % 2));
    pattern[v] = static_cast<unsigned char>(0x10 + i);
    CHECK_CU(cuMemsetD8(v, pattern[v], g_allocs[v].size));
  }
  for (int cycle = 0; cycle < 100; ++cycle) {
    sleep_all(/*offload=*/true, cycle % 2 == 1);
    errors += take_error("sleep");
    // Random frees while asleep, and a new allocation now and then.
    for (auto it = pattern.begin(); it != pattern.end();) {
      if (rng() % 4 == 0) {
        my_free(it->first);
        ++frees_asleep;
        it = pattern.erase(it);
      } else {
        ++it;
      }
    }
    errors += take_error("free while asleep");
    if (!wake_up("")) ++errors;
    while (pattern.size() < 4) {
      CUdeviceptr v = my_malloc(G * (1 + rng() % 2), "t" + std::to_string(rng() % 2));
      pattern[v] = static_cast<unsigned char>(rng());
      CHECK_CU(cuMemsetD8(v, pattern[v], g_allocs[v].size));
    }
    errors += take_error("malloc");
    for (auto &[v, val] : pattern)
      if (!g_allocs[v].asleep && !bytes_are(v, g_allocs[v].size, val)) ++bad_bytes;
  }
  for (auto &[v, val] : pattern) my_free(v);
  errors += take_error("teardown");
  std::printf("frees_while_asleep %d\n", frees_asleep);
  std::printf("errors %d\n", errors);
  std::printf("bad_bytes %d\n", bad_bytes);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sleep_alloc error|aba|cycles\n");
    return 64;
  }
  init_primary();
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CHECK_CU(cuMemGetAllocationGranularity(&G, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  std::string s = argv[1];
  if (s == "error") return scenario_error();
  if (s == "aba") return scenario_aba();
  if (s == "cycles") return scenario_cycles();
  return 64;
}
