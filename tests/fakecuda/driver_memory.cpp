// SPDX-License-Identifier: Apache-2.0
// Fake driver: linear and host memory, pools, copies, pointer queries and the state API.
#include "driver_memory.h"

#include "fakecuda.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <random>

namespace fc {

// ---- Arena ------------------------------------------------------------------------------------

bool Arena::open(const char *name, std::size_t per_device, int devices) {
  size = kArenaHeader + per_device * static_cast<std::size_t>(devices);
  fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return false;
  void *p = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(size)) == 0)
    p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    fd = -1;
    return false;
  }
  base = static_cast<char *>(p);
  std::random_device rd;
  nonce = (static_cast<unsigned long long>(rd()) << 32) ^ rd() ^ reinterpret_cast<std::uintptr_t>(p);
  ArenaHeader h{};
  std::memcpy(h.magic, kArenaMagic, sizeof h.magic);
  h.pid = getpid();
  h.nonce = nonce;
  std::memcpy(base, &h, sizeof h);
  segs.resize(static_cast<std::size_t>(devices));
  for (int d = 0; d < devices; ++d) {
    Segment &s = segs[static_cast<std::size_t>(d)];
    s.begin = s.bump = kArenaHeader + per_device * static_cast<std::size_t>(d);
    s.end = s.begin + per_device;
  }
  return true;
}

namespace {

std::optional<std::size_t> carve_once(Arena::Segment &s, std::size_t size) {
  if (auto it = s.bins.find(size); it != s.bins.end()) {
    std::size_t off = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) s.bins.erase(it);
    return off;
  }
  if (s.end - s.bump >= size) {
    std::size_t off = s.bump;
    s.bump += size;
    return off;
  }
  if (auto it = s.bins.upper_bound(size); it != s.bins.end()) {
    std::size_t bsz = it->first, off = it->second.back();
    it->second.pop_back();
    if (it->second.empty()) s.bins.erase(it);
    s.bins[bsz - size].push_back(off + size);
    return off;
  }
  return std::nullopt;
}

// Merges adjacent free blocks (and a free tail into the bump area) when nothing fits any more.
void coalesce(Arena::Segment &s) {
  std::vector<std::pair<std::size_t, std::size_t>> blocks;
  for (auto &[sz, offs] : s.bins)
    for (std::size_t o : offs) blocks.emplace_back(o, sz);
  std::sort(blocks.begin(), blocks.end());
  std::vector<std::pair<std::size_t, std::size_t>> merged;
  for (auto &b : blocks) {
    if (!merged.empty() && merged.back().first + merged.back().second == b.first)
      merged.back().second += b.second;
    else
      merged.push_back(b);
  }
  if (!merged.empty() && merged.back().first + merged.back().second == s.bump) {
    s.bump = merged.back().first;
    merged.pop_back();
  }
  s.bins.clear();
  for (auto &[o, sz] : merged) s.bins[sz].push_back(o);
}

}  // namespace

std::optional<std::size_t> Arena::carve(int dev, std::size_t sz) {
  Segment &s = segs[static_cast<std::size_t>(dev)];
  if (auto off = carve_once(s, sz)) return off;
  coalesce(s);
  return carve_once(s, sz);
}

void Arena::give_back(int dev, std::size_t off, std::size_t sz) {
  segs[static_cast<std::size_t>(dev)].bins[sz].push_back(off);
  // Large freed blocks give their pages back so that tests which allocate and free big buffers
  // in a loop do not grow the memfd; the address itself stays reserved for reuse.
  if (sz >= (std::size_t{1} << 20)) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    std::size_t b = align_up(off, page), e = (off + sz) / page * page;
    if (e > b)
      fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(b),
                static_cast<off_t>(e - b));
  }
}

// ---- Memory helpers -------------------------------------------------------------------------------

Memory &mem() {
  static Memory *m = new Memory;  // leaked: frees from static destructors must still find it
  return *m;
}

Arena *Memory::arena_for() {
  if (!arena_tried) {
    arena_tried = true;
    const Config &c = config();
    if (!arena.open("fakecuda-arena", c.device_memory, c.devices)) return nullptr;
  }
  return arena.fd >= 0 ? &arena : nullptr;
}

Reservation *Memory::reservation_of(std::uintptr_t p, std::size_t n, std::uintptr_t *base) {
  auto it = reservations.upper_bound(p);
  if (it == reservations.begin()) return nullptr;
  --it;
  if (p - it->first >= it->second.size || n > it->second.size - (p - it->first)) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

std::pair<const std::uintptr_t, Mapping> *Memory::mapping_at(std::uintptr_t p) {
  Reservation *r = reservation_of(p, 1, nullptr);
  if (!r) return nullptr;
  auto it = r->maps.upper_bound(p);
  if (it == r->maps.begin()) return nullptr;
  --it;
  return p - it->first < it->second.size ? &*it : nullptr;
}

template <class M>
static auto find_containing(M &m, std::uintptr_t p) -> decltype(&*m.begin()) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  return &*it;
}

Region Memory::describe(std::uintptr_t p) {
  Region r;
  if (auto *e = find_containing(linear, p); e && p - e->first < e->second.rounded) {
    r.kind = Region::Linear;
    r.base = r.map_base = e->first;
    r.size = r.map_size = e->second.size;
    r.dev = e->second.dev;
    r.lkind = e->second.kind;
    r.id = e->second.id;
    r.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return r;
  }
  if (auto *e = find_containing(host, p); e && p - e->first < e->second.mapped) {
    r.kind = Region::Host;
    r.base = r.map_base = e->first;
    r.size = r.map_size = e->second.size;
    r.dev = -1;
    r.id = e->second.id;
    r.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return r;
  }
  std::uintptr_t rbase;
  if (Reservation *res = reservation_of(p, 1, &rbase)) {
    r.base = rbase;
    r.size = res->size;
    auto *m = mapping_at(p);
    if (!m) {
      r.kind = Region::VmmUnmapped;
      return r;
    }
    const PhysAlloc &a = allocs.at(m->second.alloc);
    r.kind = Region::Vmm;
    r.map_base = m->first;
    r.map_size = m->second.size;
    r.dev = a.prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? a.prop.location.id : -1;
    r.id = m->second.alloc;
    r.handle_types = a.prop.requestedHandleTypes;
    int cur;
    r.access = current_device(&cur) == CUDA_SUCCESS ? m->second.dev_access[cur]
                                                     : m->second.host_access;
    r.any_access = m->second.host_access != 0;
    for (unsigned char f : m->second.dev_access) r.any_access |= f != 0;
    return r;
  }
  if (auto *e = find_containing(imports, p); e && p - e->first < e->second.size) {
    r.kind = Region::Import;
    r.base = r.map_base = e->first;
    r.size = r.map_size = e->second.size;
    r.dev = e->second.dev;
    r.access = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return r;
  }
  return r;
}

unsigned long long Memory::issue_value() {
  // real-driver.md D18: released values come back, deterministically the last released first.
  if (config().handle_reuse && !free_values.empty()) {
    unsigned long long v = free_values.back();
    free_values.pop_back();
    return v;
  }
  unsigned long long v = next_value;
  next_value += 0x60;  // spaced like small heap objects
  return v;
}

void Memory::retire_value(unsigned long long v) { free_values.push_back(v); }

// real-driver.md D13: the memory lives until the last handle and the last mapping are gone (and,
// in this fake, its last multicast binding: README.md, "Not measured").
void Memory::drop_if_unused(unsigned long long id) {
  auto it = allocs.find(id);
  if (it == allocs.end() || it->second.handle_refs || it->second.mappings || it->second.bindings)
    return;
  if (it->second.charged_dev >= 0) used[it->second.charged_dev] -= it->second.size;
  if (it->second.fd >= 0) close(it->second.fd);
  allocs.erase(it);
}

// ---- graph allocations' addresses (driver_internal.h) --------------------------------------------

CUresult graph_va_carve(int dev, std::size_t size, std::uintptr_t *out) {
  if (size > (std::size_t{1} << 48)) return CUDA_ERROR_INVALID_VALUE;
  const std::size_t rounded = align_up(size, kLinearAlign);
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  Arena *a = m.arena_for();
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  std::optional<std::size_t> off = a->carve(dev, rounded);
  if (!off) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto p = reinterpret_cast<std::uintptr_t>(a->base + *off);
  m.linear.emplace(p, Linear{size, rounded, dev, LinearKind::Graph, a, *off, m.next_id++});
  *out = p;
  return CUDA_SUCCESS;
}

void graph_va_release(std::uintptr_t p) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.linear.find(p);
  if (it == m.linear.end() || it->second.kind != LinearKind::Graph) return;
  it->second.arena->give_back(it->second.dev, it->second.offset, it->second.rounded);
  m.linear.erase(it);
}

bool graph_va_charge(std::uintptr_t p, bool live) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.linear.find(p);
  if (it == m.linear.end() || it->second.kind != LinearKind::Graph) return false;
  std::size_t &used = m.used[it->second.dev];
  if (!live) {
    used -= std::min(used, it->second.rounded);
    return true;
  }
  if (used + it->second.rounded > config().device_memory) return false;
  used += it->second.rounded;
  return true;
}

bool is_graph_va(std::uintptr_t p) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.linear.find(p);
  return it != m.linear.end() && it->second.kind == LinearKind::Graph;
}

namespace {

// ---- linear memory ------------------------------------------------------------------------------

CUresult linear_alloc(std::uintptr_t *out, std::size_t size, LinearKind kind, int dev) {
  if (!out || size == 0 || size > (std::size_t{1} << 48)) return CUDA_ERROR_INVALID_VALUE;
  if (config().bench) return bench_linear_alloc(out, size, dev);
  const std::size_t rounded = align_up(size, kLinearAlign);
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  if (m.used[dev] + rounded > config().device_memory) return CUDA_ERROR_OUT_OF_MEMORY;
  Arena *a = m.arena_for();
  if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
  std::optional<std::size_t> off = a->carve(dev, rounded);
  if (!off) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto p = reinterpret_cast<std::uintptr_t>(a->base + *off);
  m.linear.emplace(p, Linear{size, rounded, dev, kind, a, *off, m.next_id++});
  m.used[dev] += rounded;
  *out = p;
  return CUDA_SUCCESS;
}

// real-driver.md section 3: cuMemFree blocks until the device's queued work has finished;
// cuMemFreeAsync does not.
CUresult linear_free(std::uintptr_t p, bool wait) {
  if (config().bench) return bench_linear_free(p);
  Memory &m = mem();
  int dev;
  bool graph;
  {
    std::lock_guard<std::mutex> lk(m.mu);
    auto it = m.linear.find(p);
    if (it == m.linear.end()) return CUDA_ERROR_INVALID_VALUE;
    dev = it->second.dev;
    graph = it->second.kind == LinearKind::Graph;
    // cuda.h, cuMemFree: no implicit synchronization for cuMemAllocAsync memory.
    if (it->second.kind == LinearKind::Async) wait = false;
  }
  // A graph allocation's lifetime is the graph model's (called without this lock: the graph model
  // calls into this one). cuda.h: cuMemFree of stream-ordered memory does not synchronise.
  if (graph) return graph_free_outside(p);
  if (wait) wait_idle(dev);
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.linear.find(p);
  if (it == m.linear.end()) return CUDA_ERROR_INVALID_VALUE;  // freed meanwhile by another thread
  const Linear &l = it->second;
  l.arena->give_back(l.dev, l.offset, l.rounded);
  m.used[l.dev] -= l.rounded;
  m.linear.erase(it);
  return CUDA_SUCCESS;
}

CUresult alloc_v2(CUdeviceptr *dptr, std::size_t size) {
  if (CUresult r = require_init()) return r;
  if (CUresult r = capture_unsafe_call()) return r;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  std::uintptr_t p;
  CUresult r = linear_alloc(&p, size, LinearKind::Device, dev);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// The 32-bit ABI of cuMemAlloc/cuMemFree (cudaVersion < 3020) cannot name 64-bit addresses; on the
// H200 (driver 580) both answered CUDA_ERROR_INVALID_CONTEXT even with a current context.
CUresult legacy_32bit() {
  if (CUresult r = require_init()) return r;
  return CUDA_ERROR_INVALID_CONTEXT;
}

// Measured on the H200 (driver 580): cuMemFree_v2(0) succeeds, and a thread without a current
// context may free (the pointer names its context); only allocating needs one.
CUresult free_sync(std::uintptr_t p) {
  if (CUresult r = require_init()) return r;
  if (p == 0) return CUDA_SUCCESS;
  if (CUresult r = capture_unsafe_call()) return r;
  return linear_free(p, true);
}

CUresult alloc_pitch(CUdeviceptr *dptr, std::size_t *pitch, std::size_t width, std::size_t height,
                     unsigned int elem) {
  if (CUresult r = require_init()) return r;
  if (!dptr || !pitch || width == 0 || height == 0 || (elem != 4 && elem != 8 && elem != 16))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = capture_unsafe_call()) return r;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  const std::size_t p = align_up(width, kLinearAlign);
  if (height > (std::size_t{1} << 48) / p) return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t out;
  CUresult r = linear_alloc(&out, p * height, LinearKind::Device, dev);
  if (r == CUDA_SUCCESS) {
    *dptr = out;
    *pitch = p;
  }
  return r;
}

CUresult alloc_managed(CUdeviceptr *dptr, std::size_t size, unsigned int flags) {
  if (CUresult r = require_init()) return r;
  if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = capture_unsafe_call()) return r;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  std::uintptr_t p;
  CUresult r = linear_alloc(&p, size, LinearKind::Managed, dev);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// ---- pools: one default pool per device; async memory comes from the same arena ---------------
constexpr unsigned kPoolMagic = 0xfc0900c1;
struct Pool {
  unsigned magic;
  int dev;
};
// Every pool exists from the start: cuDeviceGetDefaultMemPool hands out a pointer and writes
// nothing, so threads asking at once do not race (ThreadSanitizer, tests/stress).
constexpr auto make_pools() {
  std::array<Pool, kMaxDevices> a{};
  for (int d = 0; d < kMaxDevices; ++d) a[static_cast<std::size_t>(d)] = Pool{kPoolMagic, d};
  return a;
}
std::array<Pool, kMaxDevices> g_pool_array = make_pools();
Pool *const g_pools = g_pool_array.data();

int pool_device(CUmemoryPool p) {
  auto *pool = reinterpret_cast<Pool *>(p);
  if (pool < g_pools || pool >= g_pools + kMaxDevices || pool->magic != kPoolMagic) return -1;
  return pool->dev;
}

// On a capturing stream the allocation and the free become graph memory nodes
// (driver_capture.cpp); `per_thread`: the _ptsz export (a null stream is the per-thread one).
CUresult alloc_async(CUdeviceptr *dptr, std::size_t size, CUmemoryPool pool, CUstream s,
                     bool per_thread) {
  if (CUresult r = require_init()) return r;
  if (!dptr) return CUDA_ERROR_INVALID_VALUE;
  StreamId id;
  if (CUresult r = resolve_stream(s, per_thread, &id)) return r;
  int dev = id.dev;
  if (pool && (dev = pool_device(pool)) < 0) return CUDA_ERROR_INVALID_VALUE;
  std::uintptr_t p;
  CUresult r = capture_alloc_node(id, size, &p);
  if (r == kNotCapturing) r = linear_alloc(&p, size, LinearKind::Async, dev);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

CUresult free_async(CUdeviceptr p, CUstream s, bool per_thread) {
  if (CUresult r = require_init()) return r;
  StreamId id;
  if (CUresult r = resolve_stream(s, per_thread, &id)) return r;
  CUresult r = capture_free_node(id, p);
  return r == kNotCapturing ? linear_free(p, false) : r;
}

CUresult default_pool(CUmemoryPool *pool, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(&g_pools[dev]);
  return CUDA_SUCCESS;
}

// real-driver.md section 3: trimming never waits for the device.
CUresult pool_trim(CUmemoryPool pool, std::size_t) {
  if (CUresult r = require_init()) return r;
  return pool_device(pool) < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

// ---- host memory ------------------------------------------------------------------------------

CUresult host_alloc(void **pp, std::size_t size, unsigned int flags) {
  if (CUresult r = require_init()) return r;
  if (!pp || size == 0 || size > (std::size_t{1} << 48) ||
      (flags & ~static_cast<unsigned>(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                      CU_MEMHOSTALLOC_WRITECOMBINED)))
    return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = capture_unsafe_call()) return r;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  const std::size_t len = align_up(size, static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  m.host.emplace(reinterpret_cast<std::uintptr_t>(p), HostBlock{size, len, m.next_id++});
  *pp = p;
  return CUDA_SUCCESS;
}

// real-driver.md section 3: cudaFreeHost waited for the kernel like cudaFree.
CUresult host_free(void *p) {
  if (CUresult r = require_init()) return r;
  if (CUresult r = capture_unsafe_call()) return r;
  Memory &m = mem();
  {
    std::lock_guard<std::mutex> lk(m.mu);
    if (!m.host.count(reinterpret_cast<std::uintptr_t>(p))) return CUDA_ERROR_INVALID_VALUE;
  }
  int dev;
  wait_idle(current_device(&dev) == CUDA_SUCCESS ? dev : -1);
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.host.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == m.host.end()) return CUDA_ERROR_INVALID_VALUE;
  munmap(p, it->second.mapped);
  m.host.erase(it);
  return CUDA_SUCCESS;
}

// ---- copies and sets: synchronous host memcpy after checking every known range -------------------

enum class Span { Outside, Ok, Bad };

// Outside: no known allocation is touched (plain host memory under unified addressing);
// Ok: inside one allocation that allows the access; Bad: anything else (the real driver
// answers INVALID_VALUE where the fake would otherwise fault).
Span check_span(std::uintptr_t p, std::size_t n, bool write) {
  if (n == 0) return Span::Ok;
  if (p + n < p) return Span::Bad;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  Region r = m.describe(p);
  if (r.kind == Region::None) return m.describe(p + n - 1).kind == Region::None ? Span::Outside : Span::Bad;
  if (r.kind == Region::VmmUnmapped) return Span::Bad;
  if (r.kind != Region::Vmm) {
    const std::size_t limit = r.kind == Region::Linear ? m.linear.at(r.base).rounded : r.size;
    return p - r.base <= limit && n <= limit - (p - r.base) ? Span::Ok : Span::Bad;
  }
  // VMM: every byte must lie in a mapping of this reservation with the access set.
  const unsigned need = write ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_READ;
  for (std::uintptr_t q = p; q < p + n;) {
    auto *mp = m.mapping_at(q);
    if (!mp) return Span::Bad;
    unsigned acc = mp->second.host_access;
    for (unsigned char f : mp->second.dev_access) acc |= f;
    if ((acc & need) != need) return Span::Bad;
    q = mp->first + mp->second.size;
  }
  return Span::Ok;
}

// How a synchronous copy or set meets open captures: on the legacy stream (the plain exports), on
// the per-thread default stream (the _ptds exports), or as a stream-ordered call's execution.
enum class Sync { Legacy, PerThread, None };

CUresult sync_capture_check(Sync how, int dev) {
  if (how == Sync::Legacy) return capture_legacy_use(dev);
  if (how == Sync::PerThread) {
    StreamId id;
    if (CUresult r = resolve_stream(nullptr, true, &id)) return r;
    return capture_stream_wait(id);
  }
  return CUDA_SUCCESS;
}

CUresult copy(std::uintptr_t dst, std::uintptr_t src, std::size_t n, bool dst_dev, bool src_dev,
              Sync how = Sync::None) {
  if (CUresult r = require_init()) return r;
  if (config().bench) return CUDA_ERROR_NOT_SUPPORTED;  // no backing memory to copy to or from
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  if (CUresult r = sync_capture_check(how, dev)) return r;
  Span d = check_span(dst, n, true), s = check_span(src, n, false);
  if (d == Span::Bad || s == Span::Bad || (dst_dev && d != Span::Ok) || (src_dev && s != Span::Ok))
    return CUDA_ERROR_INVALID_VALUE;
  if (n) std::memmove(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), n);
  return CUDA_SUCCESS;
}

// A copy on a capturing stream becomes a node of the capture and is not made now.
CUresult copy_async(std::uintptr_t dst, std::uintptr_t src, std::size_t n, CUstream st,
                    bool per_thread) {
  if (CUresult r = require_init()) return r;
  StreamId id;
  if (CUresult r = resolve_stream(st, per_thread, &id)) return r;
  CUresult r = capture_node(id);
  if (r != kNotCapturing) return r;
  return copy(dst, src, n, false, false);
}

template <class T>
CUresult fill(CUdeviceptr dst, T value, std::size_t count, Sync how) {
  if (CUresult r = require_init()) return r;
  if (config().bench) return CUDA_ERROR_NOT_SUPPORTED;  // no backing memory to write
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  if (CUresult r = sync_capture_check(how, dev)) return r;
  if (count > (std::size_t{1} << 48) / sizeof(T)) return CUDA_ERROR_INVALID_VALUE;
  if (check_span(dst, count * sizeof(T), true) != Span::Ok) return CUDA_ERROR_INVALID_VALUE;
  if (dst % alignof(T)) return CUDA_ERROR_INVALID_VALUE;
  T *p = reinterpret_cast<T *>(dst);
  std::fill(p, p + count, value);
  return CUDA_SUCCESS;
}

// ---- pointer queries ------------------------------------------------------------------------

template <class T>
void put(void *d, T v) {
  std::memcpy(d, &v, sizeof v);
}

CUresult address_range(CUdeviceptr *pbase, std::size_t *psize, CUdeviceptr p) {
  if (CUresult r = require_init()) return r;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  Region r = m.describe(p);
  // real-driver.md D15: reserved but unmapped VMM range -> CUDA_ERROR_NOT_FOUND. Measured on the
  // H200 (driver 580): a mapped VMM address gives its mapping (the chunk, unlike RANGE_START_ADDR,
  // D20), and NOT_FOUND while no access has been set on it.
  if (r.kind == Region::None || r.kind == Region::VmmUnmapped) return CUDA_ERROR_NOT_FOUND;
  if (r.kind == Region::Vmm) {
    if (!r.any_access) return CUDA_ERROR_NOT_FOUND;
    r.base = r.map_base;
    r.size = r.map_size;
  }
  if (pbase) *pbase = r.base;
  if (psize) *psize = r.size;
  return CUDA_SUCCESS;
}

CUresult attribute(void *data, CUpointer_attribute attr, const Region &r) {
  if (r.kind == Region::None || r.kind == Region::VmmUnmapped) return CUDA_ERROR_INVALID_VALUE;
  const bool managed = r.kind == Region::Linear && r.lkind == LinearKind::Managed;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: {
      put(data, r.dev >= 0 && r.kind != Region::Vmm ? primary_context(r.dev) : nullptr);
      return CUDA_SUCCESS;
    }
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      put(data, static_cast<unsigned>(r.dev < 0 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      return CUDA_ERROR_NOT_SUPPORTED;  // answered by the caller (needs the pointer itself)
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      return CUDA_ERROR_NOT_SUPPORTED;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: put(data, 1); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: put(data, r.id); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: put(data, managed ? 1 : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: {
      int d = r.dev;
      if (d < 0 && current_device(&d) != CUDA_SUCCESS) d = 0;
      put(data, d);
      return CUDA_SUCCESS;
    }
    // real-driver.md D21: 1 for cudaMalloc memory, 0 for VMM memory (and pool/managed memory,
    // which cudaIpcGetMemHandle refuses as well).
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      put(data, r.kind == Region::Linear && r.lkind == LinearKind::Device ? 1 : 0);
      return CUDA_SUCCESS;
    // real-driver.md D20: for VMM memory the whole reservation, not the mapped chunk.
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: put(data, static_cast<CUdeviceptr>(r.base)); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: put(data, r.size); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: put(data, reinterpret_cast<void *>(r.map_base)); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: put(data, r.map_size); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID: put(data, r.id); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED: put(data, 1); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: put(data, r.handle_types); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE: put(data, r.dev >= 0 ? 1 : 0); return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      put(data, static_cast<unsigned>(r.access == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
                                          ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE
                                      : r.access ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READ
                                                 : CU_POINTER_ATTRIBUTE_ACCESS_FLAG_NONE));
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: {
      CUmemoryPool pool = nullptr;
      if (r.kind == Region::Linear && r.lkind == LinearKind::Async) default_pool(&pool, r.dev);
      put(data, pool);
      return CUDA_SUCCESS;
    }
    default: return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult pointer_attribute(void *data, CUpointer_attribute attr, CUdeviceptr p) {
  if (CUresult r = require_init()) return r;
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  Region reg;
  {
    Memory &m = mem();
    std::lock_guard<std::mutex> lk(m.mu);
    reg = m.describe(p);
  }
  if (attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER || attr == CU_POINTER_ATTRIBUTE_HOST_POINTER) {
    if (reg.kind == Region::None || reg.kind == Region::VmmUnmapped) return CUDA_ERROR_INVALID_VALUE;
    const bool host_visible = reg.kind == Region::Host ||
                              (reg.kind == Region::Linear && reg.lkind == LinearKind::Managed);
    if (attr == CU_POINTER_ATTRIBUTE_HOST_POINTER && !host_visible) return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER) put(data, p);
    else put(data, reinterpret_cast<void *>(p));
    return CUDA_SUCCESS;
  }
  // MAPPED is the one attribute defined for addresses that are not mapped.
  if (attr == CU_POINTER_ATTRIBUTE_MAPPED && reg.kind == Region::VmmUnmapped) {
    put(data, 0);
    return CUDA_SUCCESS;
  }
  return attribute(data, attr, reg);
}

// cuPointerGetAttributes never fails for an unknown pointer: it writes zeroes (cuda.h 13.0).
CUresult pointer_attributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr p) {
  if (CUresult r = require_init()) return r;
  if (!attrs || !data || n == 0) return CUDA_ERROR_INVALID_VALUE;
  for (unsigned i = 0; i < n; ++i) {
    if (!data[i]) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = pointer_attribute(data[i], attrs[i], p);
    if (r == CUDA_SUCCESS) continue;
    if (r != CUDA_ERROR_INVALID_VALUE) return r;
    switch (attrs[i]) {
      case CU_POINTER_ATTRIBUTE_CONTEXT:
      case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
      case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: put(data[i], static_cast<void *>(nullptr)); break;
      case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: put(data[i], CUdeviceptr{0}); break;
      case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
      case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES: put(data[i], 0ULL); break;
      case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: put(data[i], std::size_t{0}); break;
      case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: put(data[i], -2); break;
      default: put(data[i], 0); break;
    }
  }
  return CUDA_SUCCESS;
}

CUresult mem_info(std::size_t *free_b, std::size_t *total) {
  if (CUresult r = require_init()) return r;
  if (!free_b || !total) return CUDA_ERROR_INVALID_VALUE;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  *total = config().device_memory;
  *free_b = *total - std::min(*total, m.used[dev]);
  return CUDA_SUCCESS;
}

}  // namespace
}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total) {
  return FC_CALL(cuMemGetInfo_v2, mem_info(free, total));
}

FC_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *, unsigned int) {
  return FC_CALL(cuMemAlloc, legacy_32bit());
}

FC_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
  return FC_CALL(cuMemAlloc_v2, alloc_v2(dptr, bytesize));
}

FC_EXPORT CUresult cuMemFree(CUdeviceptr_v1) { return FC_CALL(cuMemFree, legacy_32bit()); }

FC_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return FC_CALL(cuMemFree_v2, free_sync(dptr));
}

FC_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                      size_t Height, unsigned int ElementSizeBytes) {
  return FC_CALL(cuMemAllocPitch_v2, alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes));
}

FC_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
  return FC_CALL(cuMemAllocManaged, alloc_managed(dptr, bytesize, flags));
}

FC_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
  return FC_CALL(cuMemAllocHost_v2, host_alloc(pp, bytesize, 0));
}

FC_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
  return FC_CALL(cuMemHostAlloc, host_alloc(pp, bytesize, Flags));
}

FC_EXPORT CUresult cuMemFreeHost(void *p) { return FC_CALL(cuMemFreeHost, host_free(p)); }

FC_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  return FC_CALL(cuMemAllocAsync, alloc_async(dptr, bytesize, nullptr, hStream, false));
}

FC_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
  return FC_CALL(cuMemAllocAsync_ptsz, alloc_async(dptr, bytesize, nullptr, hStream, true));
}

FC_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
  return FC_CALL(cuMemFreeAsync, free_async(dptr, hStream, false));
}

FC_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
  return FC_CALL(cuMemFreeAsync_ptsz, free_async(dptr, hStream, true));
}

FC_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                           CUstream hStream) {
  return FC_CALL(cuMemAllocFromPoolAsync,
                 pool ? alloc_async(dptr, bytesize, pool, hStream, false) : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                CUmemoryPool pool, CUstream hStream) {
  return FC_CALL(cuMemAllocFromPoolAsync_ptsz,
                 pool ? alloc_async(dptr, bytesize, pool, hStream, true) : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
  return FC_CALL(cuDeviceGetDefaultMemPool, default_pool(pool_out, dev));
}

FC_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
  return FC_CALL(cuMemPoolTrimTo, pool_trim(pool, minBytesToKeep));
}

FC_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
  return FC_CALL(cuMemGetAddressRange_v2, address_range(pbase, psize, dptr));
}

FC_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  return FC_CALL(cuPointerGetAttribute, pointer_attribute(data, attribute, ptr));
}

FC_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                          void **data, CUdeviceptr ptr) {
  return FC_CALL(cuPointerGetAttributes, pointer_attributes(numAttributes, attributes, data, ptr));
}

FC_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return FC_CALL(cuMemcpy, copy(dst, src, ByteCount, false, false, Sync::Legacy));
}

FC_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
  return FC_CALL(cuMemcpy_ptds, copy(dst, src, ByteCount, false, false, Sync::PerThread));
}

FC_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream) {
  return FC_CALL(cuMemcpyAsync, copy_async(dst, src, ByteCount, hStream, false));
}

FC_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                      CUstream hStream) {
  return FC_CALL(cuMemcpyAsync_ptsz, copy_async(dst, src, ByteCount, hStream, true));
}

FC_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  return FC_CALL(cuMemcpyHtoD_v2, copy(dstDevice, reinterpret_cast<std::uintptr_t>(srcHost),
                                       ByteCount, true, false, Sync::Legacy));
}

FC_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
  return FC_CALL(cuMemcpyHtoD_v2_ptds, copy(dstDevice, reinterpret_cast<std::uintptr_t>(srcHost),
                                            ByteCount, true, false, Sync::PerThread));
}

FC_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return FC_CALL(cuMemcpyDtoH_v2, copy(reinterpret_cast<std::uintptr_t>(dstHost), srcDevice,
                                       ByteCount, false, true, Sync::Legacy));
}

FC_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
  return FC_CALL(cuMemcpyDtoH_v2_ptds, copy(reinterpret_cast<std::uintptr_t>(dstHost), srcDevice,
                                            ByteCount, false, true, Sync::PerThread));
}

FC_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return FC_CALL(cuMemcpyDtoD_v2, copy(dstDevice, srcDevice, ByteCount, true, true, Sync::Legacy));
}

FC_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
  return FC_CALL(cuMemcpyDtoD_v2_ptds,
                 copy(dstDevice, srcDevice, ByteCount, true, true, Sync::PerThread));
}

FC_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return FC_CALL(cuMemsetD8_v2, fill(dstDevice, uc, N, Sync::Legacy));
}

FC_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
  return FC_CALL(cuMemsetD8_v2_ptds, fill(dstDevice, uc, N, Sync::PerThread));
}

FC_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return FC_CALL(cuMemsetD32_v2, fill(dstDevice, ui, N, Sync::Legacy));
}

FC_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
  return FC_CALL(cuMemsetD32_v2_ptds, fill(dstDevice, ui, N, Sync::PerThread));
}

// ---- state API (fakecuda.h) ----------------------------------------------------------------------

FC_EXPORT int fakecuda_get_state(struct fakecuda_state *st) {
  if (!st) return -1;
  *st = fakecuda_state{};
  st->streams = live_streams();
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  for (auto &[p, l] : m.linear) {
    if (l.kind == LinearKind::Graph) continue;  // counted by the graph model below
    ++st->linear_allocs;
    st->linear_bytes += l.size;
  }
  for (auto &[p, h] : m.host) {
    ++st->host_allocs;
    st->host_bytes += h.size;
  }
  for (auto &[id, a] : m.allocs) {
    ++st->phys_allocs;
    st->phys_bytes += a.size;
  }
  for (auto &[v, h] : m.handles) st->handle_refs += h.refs;
  st->handle_values = m.handles.size();
  for (auto &[b, r] : m.reservations) {
    ++st->reservations;
    st->reserved_bytes += r.size;
    for (auto &[mb, mp] : r.maps) {
      ++st->mappings;
      st->mapped_bytes += mp.size;
    }
  }
  for (auto &[p, imp] : m.imports) {
    ++st->ipc_imports;
    st->ipc_import_refs += imp.refs;
  }
  for (int d = 0; d < kMaxDevices; ++d) st->device_used[d] = m.used[d];
  return 0;
}

FC_EXPORT int fakecuda_get_graph_state(struct fakecuda_graph_state *st) {
  if (!st) return -1;
  const CaptureCounts n = capture_counts();
  *st = fakecuda_graph_state{n.open, n.graphs, n.execs, n.graph_allocs, n.graph_live,
                             n.graph_live_bytes};
  return 0;
}

FC_EXPORT int fakecuda_handle_live(unsigned long long value) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  return m.handles.count(value) ? 1 : 0;
}

FC_EXPORT unsigned long long fakecuda_handle_allocation(unsigned long long value) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto it = m.handles.find(value);
  return it == m.handles.end() ? 0 : it->second.alloc;
}

FC_EXPORT unsigned long long fakecuda_mapping_handle(unsigned long long va) {
  Memory &m = mem();
  std::lock_guard<std::mutex> lk(m.mu);
  auto *mp = m.mapping_at(va);
  return mp ? mp->second.alloc : 0;
}
