// SPDX-License-Identifier: Apache-2.0
// Fake driver: initialisation, errors, devices, primary contexts, streams and the busy model.
#include <pthread.h>

#include "driver_internal.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace fc {
namespace {

std::atomic<bool> g_initialized{false};
// A child forked after cuInit cannot use the parent's driver state (CUDA is not fork-safe): its
// calls fail with NOT_INITIALIZED instead of touching locks another thread held at fork().
std::atomic<bool> g_forked_child{false};

struct ErrorText {
  CUresult code;
  const char *name;
  const char *text;
};
constexpr ErrorText kErrors[] = {
#define FC_ERR(e, s) {e, #e, s},
#include "cu_errors.def"
#undef FC_ERR
};

// ---- contexts: each device's primary context, and a fixed pool for cuCtxCreate* -------------
constexpr unsigned kCtxMagic = 0xfc0c7e47;
struct Context {
  unsigned magic;
  int dev;
  std::atomic<bool> used{false};  // a created context's slot in g_created is taken
};
Context g_primary[kMaxDevices];
std::atomic<int> g_primary_refs[kMaxDevices];
// Created contexts hold no memory of their own (allocations belong to the context's device), so
// a small pool is enough; a destroyed context's slot is given to a later cuCtxCreate.
constexpr int kCreated = 64;
Context g_created[kCreated];

// Per-thread context stack (cuCtxPush/Pop; cuCtxSetCurrent replaces the top). A fixed array
// keeps thread exit free of destructors.
constexpr int kStackDepth = 32;
thread_local Context *t_stack[kStackDepth];
thread_local int t_depth = 0;

Context *current() { return t_depth > 0 ? t_stack[t_depth - 1] : nullptr; }

Context *as_context(CUcontext c) {
  auto *p = reinterpret_cast<Context *>(c);
  const bool primary = p >= g_primary && p < g_primary + kMaxDevices;
  const bool created = p >= g_created && p < g_created + kCreated;
  if (!primary && !created) return nullptr;
  if (created && !p->used.load()) return nullptr;
  if (p->magic != kCtxMagic || !valid_device(p->dev)) return nullptr;
  return p;
}

// ---- streams --------------------------------------------------------------------------------
constexpr unsigned kStreamMagic = 0xfc057ea3;
struct Stream {
  unsigned magic;
  int dev;
  unsigned flags;
};
struct Streams {
  std::mutex mu;
  std::unordered_set<Stream *> live;
};
Streams &streams() {
  static Streams *s = new Streams;  // leaked: streams may be destroyed from static destructors
  return *s;
}

// ---- the busy model (real-driver.md section 3) ----------------------------------------------
std::atomic<long long> g_busy_until[kMaxDevices];

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void wait_until(long long target) {
  for (long long t = now_ns(); t < target; t = now_ns())
    std::this_thread::sleep_for(std::chrono::nanoseconds(target - t));
}

CUresult device_count(int *count) {
  if (CUresult r = require_init()) return r;
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = config().devices;
  return CUDA_SUCCESS;
}

CUresult device_total_mem(size_t *bytes, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = config().device_memory;
  return CUDA_SUCCESS;
}

CUresult device_can_access_peer(int *can, CUdevice dev, CUdevice peer) {
  if (CUresult r = require_init()) return r;
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = dev != peer;
  return CUDA_SUCCESS;
}

CUresult device_attribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!pi) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = 0;
  switch (attrib) {
    // What NCCL and PyTorch read to choose the cuMem path (nccl-and-cleanup.md 10.4): VMM and
    // POSIX-fd sharing yes, FABRIC no (real-driver.md section 6: FABRIC gets NOT_PERMITTED).
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES:
      v = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED: v = config().multicast ? 1 : 0; break;
    // The rest describe an H200 (compute capability 9.0, 132 SMs).
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 6144; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = 0x18 + dev; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 3; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT: v = 4; break;
    case CU_DEVICE_ATTRIBUTE_TENSOR_MAP_ACCESS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = -1; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = 0; break;
    default:
      if (attrib <= 0 || attrib > CU_DEVICE_ATTRIBUTE_ONLY_PARTIAL_HOST_NATIVE_ATOMIC_SUPPORTED)
        return CUDA_ERROR_INVALID_VALUE;
      v = 0;
      break;
  }
  *pi = v;
  return CUDA_SUCCESS;
}

CUresult init(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  // Every cuMemCreate of the fake holds a memfd; NCCL and PyTorch keep hundreds of allocations,
  // so lift the soft descriptor limit to the hard one, once.
  if (g_forked_child.load(std::memory_order_relaxed)) return CUDA_ERROR_NOT_INITIALIZED;
  if (!g_initialized.exchange(true)) {
    pthread_atfork(nullptr, nullptr, [] { g_forked_child.store(true); });
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      rl.rlim_cur = rl.rlim_max;
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  return CUDA_SUCCESS;
}

CUresult device_get(CUdevice *d, int ordinal) {
  if (CUresult r = require_init()) return r;
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

CUresult device_name(char *name, int len, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<std::size_t>(len), "NVIDIA H200 (fakecuda)");
  return CUDA_SUCCESS;
}

CUresult device_uuid(CUuuid *uuid, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::memset(uuid->bytes, 0, sizeof uuid->bytes);
  std::memcpy(uuid->bytes, "fakecuda", 8);
  uuid->bytes[15] = static_cast<char>(dev);
  return CUDA_SUCCESS;
}

CUresult primary_retain(CUcontext *pctx, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  g_primary_refs[dev].fetch_add(1);
  *pctx = primary_context(dev);
  return CUDA_SUCCESS;
}

CUresult primary_release(CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int refs = g_primary_refs[dev].load();
  while (refs > 0 && !g_primary_refs[dev].compare_exchange_weak(refs, refs - 1)) {
  }
  return refs > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult primary_state(CUdevice dev, unsigned int *flags, int *active) {
  if (CUresult r = require_init()) return r;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = g_primary_refs[dev].load() > 0;
  return CUDA_SUCCESS;
}

CUresult ctx_set_current(CUcontext c) {
  if (CUresult r = require_init()) return r;
  Context *ctx = nullptr;
  if (c && !(ctx = as_context(c))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!ctx) {
    if (t_depth > 0) --t_depth;
  } else if (t_depth == 0) {
    t_stack[t_depth++] = ctx;
  } else {
    t_stack[t_depth - 1] = ctx;
  }
  return CUDA_SUCCESS;
}

CUresult ctx_get_current(CUcontext *pctx) {
  if (CUresult r = require_init()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current());
  return CUDA_SUCCESS;
}

CUresult ctx_push(CUcontext c) {
  if (CUresult r = require_init()) return r;
  Context *ctx = as_context(c);
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_depth == kStackDepth) return CUDA_ERROR_OUT_OF_MEMORY;
  t_stack[t_depth++] = ctx;
  return CUDA_SUCCESS;
}

CUresult ctx_pop(CUcontext *pctx) {
  if (CUresult r = require_init()) return r;
  if (t_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
  Context *ctx = t_stack[--t_depth];
  if (pctx) *pctx = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

// bug-patterns.md P27: on a thread without a current context this is INVALID_CONTEXT (201).
CUresult ctx_get_device(CUdevice *device, CUcontext c) {
  if (CUresult r = require_init()) return r;
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  Context *ctx = c ? as_context(c) : current();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  *device = ctx->dev;
  return CUDA_SUCCESS;
}

CUresult ctx_synchronize(CUcontext c) {
  if (CUresult r = require_init()) return r;
  Context *ctx = c ? as_context(c) : current();
  if (!ctx) return CUDA_ERROR_INVALID_CONTEXT;
  if (CUresult r = capture_context_wait(ctx->dev)) return r;
  wait_idle(ctx->dev);
  return CUDA_SUCCESS;
}

// Each ABI variant has its own function (bug-patterns.md P24: cuCtxCreate 3020 and 11040 are
// different functions). The new context is pushed on the calling thread's stack, so a later
// cuCtxSetCurrent(NULL) pops it and leaves the context below current (real-driver.md section 5:
// the primary context, measured on the H200).
CUresult ctx_create(CUcontext *pctx, CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (t_depth == kStackDepth) return CUDA_ERROR_OUT_OF_MEMORY;
  for (Context &c : g_created) {
    bool was = false;
    if (!c.used.compare_exchange_strong(was, true)) continue;
    c.dev = dev;
    c.magic = kCtxMagic;
    t_stack[t_depth++] = &c;
    *pctx = reinterpret_cast<CUcontext>(&c);
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_OUT_OF_MEMORY;
}

// A created context only (a primary context is released, not destroyed). Popped when it is the
// calling thread's current context; other threads' stacks are theirs (cuda.h: the context stays
// current to them, and using it fails).
CUresult ctx_destroy(CUcontext c) {
  if (CUresult r = require_init()) return r;
  Context *ctx = as_context(c);
  if (!ctx || !(ctx >= g_created && ctx < g_created + kCreated)) return CUDA_ERROR_INVALID_CONTEXT;
  if (current() == ctx) --t_depth;
  ctx->magic = 0;
  ctx->used.store(false);
  return CUDA_SUCCESS;
}

// Nothing of a primary context is modelled beyond its references: a reset drops them all.
CUresult primary_reset(CUdevice dev) {
  if (CUresult r = require_init()) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  g_primary_refs[dev].store(0);
  return CUDA_SUCCESS;
}

CUresult stream_create(CUstream *ph, unsigned int flags) {
  if (CUresult r = require_init()) return r;
  if (!ph || (flags & ~static_cast<unsigned>(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  int dev;
  if (CUresult r = current_device(&dev)) return r;
  auto *s = new Stream{kStreamMagic, dev, flags};
  Streams &st = streams();
  std::lock_guard<std::mutex> lk(st.mu);
  st.live.insert(s);
  *ph = reinterpret_cast<CUstream>(s);
  return CUDA_SUCCESS;
}

CUresult stream_destroy(CUstream h) {
  if (CUresult r = require_init()) return r;
  auto *s = reinterpret_cast<Stream *>(h);
  Streams &st = streams();
  std::lock_guard<std::mutex> lk(st.mu);
  if (!st.live.erase(s)) return CUDA_ERROR_INVALID_HANDLE;
  s->magic = 0;
  delete s;
  return CUDA_SUCCESS;
}

// A capturing stream (or the legacy stream while a blocking stream captures) cannot be waited for
// or queried: its work is not scheduled (driver_capture.cpp).
CUresult stream_synchronize(CUstream h, bool per_thread) {
  if (CUresult r = require_init()) return r;
  StreamId id;
  if (CUresult r = resolve_stream(h, per_thread, &id)) return r;
  if (CUresult r = capture_stream_wait(id)) return r;
  wait_idle(id.dev);
  return CUDA_SUCCESS;
}

// NOT_READY while work queued before the call is still running on the stream's device (the busy
// model is per device: every stream of a busy device has work), SUCCESS once it is idle.
CUresult stream_query(CUstream h, bool per_thread) {
  if (CUresult r = require_init()) return r;
  StreamId id;
  if (CUresult r = resolve_stream(h, per_thread, &id)) return r;
  if (CUresult r = capture_stream_wait(id)) return r;
  const int dev = id.dev;
  if (dev >= 0 && dev < kMaxDevices && g_busy_until[dev].load() > now_ns())
    return CUDA_ERROR_NOT_READY;
  return CUDA_SUCCESS;
}

CUresult error_lookup(CUresult error, const char **p, bool text) {
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  const char *s = text ? error_string(error) : error_name(error);
  *p = s;
  return s ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

const char *error_name(CUresult r) {
  for (const ErrorText &e : kErrors)
    if (e.code == r) return e.name;
  return nullptr;
}

const char *error_string(CUresult r) {
  for (const ErrorText &e : kErrors)
    if (e.code == r) return e.text;
  return nullptr;
}

CUresult require_init() {
  if (g_forked_child.load(std::memory_order_relaxed)) return CUDA_ERROR_NOT_INITIALIZED;
  return g_initialized.load(std::memory_order_acquire) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

bool valid_device(int dev) { return dev >= 0 && dev < config().devices; }

CUresult current_device(int *dev) {
  Context *c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->dev;
  return CUDA_SUCCESS;
}

CUcontext primary_context(int dev) {
  g_primary[dev].dev = dev;
  g_primary[dev].magic = kCtxMagic;
  return reinterpret_cast<CUcontext>(&g_primary[dev]);
}

CUresult stream_device(CUstream h, int *dev) {
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return current_device(dev);
  auto *s = reinterpret_cast<Stream *>(h);
  Streams &st = streams();
  std::lock_guard<std::mutex> lk(st.mu);
  if (!st.live.count(s)) return CUDA_ERROR_INVALID_HANDLE;
  *dev = s->dev;
  return CUDA_SUCCESS;
}

namespace {
// The legacy stream has one identity per process, the per-thread default stream one per thread.
const char g_legacy_key = 0;
thread_local char t_per_thread_key = 0;
}  // namespace

CUresult resolve_stream(CUstream h, bool per_thread_default, StreamId *out) {
  StreamId id;
  if (h == CU_STREAM_LEGACY || (h == nullptr && !per_thread_default)) {
    id.key = &g_legacy_key;
    id.legacy = true;
  } else if (h == CU_STREAM_PER_THREAD || h == nullptr) {
    id.key = &t_per_thread_key;
  } else {
    auto *s = reinterpret_cast<Stream *>(h);
    Streams &st = streams();
    std::lock_guard<std::mutex> lk(st.mu);
    if (!st.live.count(s)) return CUDA_ERROR_INVALID_HANDLE;
    id.key = s;
    id.dev = s->dev;
    id.blocking = !(s->flags & CU_STREAM_NON_BLOCKING);
    *out = id;
    return CUDA_SUCCESS;
  }
  if (CUresult r = current_device(&id.dev)) return r;
  *out = id;
  return CUDA_SUCCESS;
}

unsigned long long live_streams() {
  Streams &st = streams();
  std::lock_guard<std::mutex> lk(st.mu);
  return st.live.size();
}

// Waits for the work queued before the call, not for work queued while it waits.
void wait_idle(int dev) {
  long long target = 0;
  if (dev >= 0 && dev < kMaxDevices) {
    target = g_busy_until[dev].load();
  } else {
    for (auto &b : g_busy_until) target = std::max(target, b.load());
  }
  wait_until(target);
}

void set_busy(int dev, unsigned long long ns) {
  if (dev < 0 || dev >= kMaxDevices) return;
  const long long until = now_ns() + static_cast<long long>(std::min(ns, 1ULL << 62));
  long long cur = g_busy_until[dev].load();
  while (cur < until && !g_busy_until[dev].compare_exchange_weak(cur, until)) {
  }
}

}  // namespace fc

using namespace fc;

FC_EXPORT CUresult cuInit(unsigned int Flags) { return FC_CALL(cuInit, init(Flags)); }

FC_EXPORT CUresult cuDriverGetVersion(int *driverVersion) {
  return FC_CALL(cuDriverGetVersion, driverVersion ? (*driverVersion = kDriverVersion, CUDA_SUCCESS)
                                                   : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuGetErrorName(CUresult error, const char **pStr) {
  return FC_CALL(cuGetErrorName, error_lookup(error, pStr, false));
}

FC_EXPORT CUresult cuGetErrorString(CUresult error, const char **pStr) {
  return FC_CALL(cuGetErrorString, error_lookup(error, pStr, true));
}

// cudart asks for it at 3000 and NVML dlsyms it (interposers.md 9.2); the fake has no tables.
FC_EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *) {
  return FC_CALL(cuGetExportTable,
                 ppExportTable ? (*ppExportTable = nullptr, CUDA_ERROR_NOT_SUPPORTED)
                               : CUDA_ERROR_INVALID_VALUE);
}

FC_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  return FC_CALL(cuDeviceGet, device_get(device, ordinal));
}

FC_EXPORT CUresult cuDeviceGetCount(int *count) {
  return FC_CALL(cuDeviceGetCount, device_count(count));
}

FC_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  return FC_CALL(cuDeviceGetAttribute, device_attribute(pi, attrib, dev));
}

FC_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  return FC_CALL(cuDeviceGetName, device_name(name, len, dev));
}

FC_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  return FC_CALL(cuDeviceGetUuid, device_uuid(uuid, dev));
}

FC_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  return FC_CALL(cuDeviceGetUuid_v2, device_uuid(uuid, dev));
}

FC_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  return FC_CALL(cuDeviceTotalMem_v2, device_total_mem(bytes, dev));
}

FC_EXPORT CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
  return FC_CALL(cuDeviceCanAccessPeer, device_can_access_peer(canAccessPeer, dev, peerDev));
}

FC_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  return FC_CALL(cuDevicePrimaryCtxRetain, primary_retain(pctx, dev));
}

FC_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return FC_CALL(cuDevicePrimaryCtxRelease, primary_release(dev));
}

FC_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return FC_CALL(cuDevicePrimaryCtxRelease_v2, primary_release(dev));
}

FC_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  return FC_CALL(cuDevicePrimaryCtxGetState, primary_state(dev, flags, active));
}

FC_EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int, CUdevice dev) {
  return FC_CALL(cuCtxCreate, ctx_create(pctx, dev));
}

FC_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int, CUdevice dev) {
  return FC_CALL(cuCtxCreate_v2, ctx_create(pctx, dev));
}

FC_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *, int, unsigned int,
                                  CUdevice dev) {
  return FC_CALL(cuCtxCreate_v3, ctx_create(pctx, dev));
}

FC_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *, unsigned int, CUdevice dev) {
  return FC_CALL(cuCtxCreate_v4, ctx_create(pctx, dev));
}

FC_EXPORT CUresult cuCtxDestroy(CUcontext ctx) { return FC_CALL(cuCtxDestroy, ctx_destroy(ctx)); }

FC_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  return FC_CALL(cuCtxDestroy_v2, ctx_destroy(ctx));
}

FC_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return FC_CALL(cuDevicePrimaryCtxReset, primary_reset(dev));
}

FC_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return FC_CALL(cuDevicePrimaryCtxReset_v2, primary_reset(dev));
}

FC_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx) {
  return FC_CALL(cuCtxGetCurrent, ctx_get_current(pctx));
}

FC_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  return FC_CALL(cuCtxSetCurrent, ctx_set_current(ctx));
}

FC_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
  return FC_CALL(cuCtxPushCurrent, ctx_push(ctx));
}

FC_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return FC_CALL(cuCtxPushCurrent_v2, ctx_push(ctx));
}

FC_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) {
  return FC_CALL(cuCtxPopCurrent, ctx_pop(pctx));
}

FC_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
  return FC_CALL(cuCtxPopCurrent_v2, ctx_pop(pctx));
}

FC_EXPORT CUresult cuCtxGetDevice(CUdevice *device) {
  return FC_CALL(cuCtxGetDevice, ctx_get_device(device, nullptr));
}

FC_EXPORT CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx) {
  return FC_CALL(cuCtxGetDevice_v2, ctx_get_device(device, ctx));
}

FC_EXPORT CUresult cuCtxSynchronize(void) {
  return FC_CALL(cuCtxSynchronize, ctx_synchronize(nullptr));
}

FC_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  return FC_CALL(cuCtxSynchronize_v2, ctx_synchronize(ctx));
}

FC_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
  return FC_CALL(cuStreamCreate, stream_create(phStream, Flags));
}

FC_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream) {
  return FC_CALL(cuStreamDestroy_v2, stream_destroy(hStream));
}

FC_EXPORT CUresult cuStreamSynchronize(CUstream hStream) {
  return FC_CALL(cuStreamSynchronize, stream_synchronize(hStream, false));
}

FC_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) {
  return FC_CALL(cuStreamSynchronize_ptsz, stream_synchronize(hStream, true));
}

FC_EXPORT CUresult cuStreamQuery(CUstream hStream) {
  return FC_CALL(cuStreamQuery, stream_query(hStream, false));
}

FC_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) {
  return FC_CALL(cuStreamQuery_ptsz, stream_query(hStream, true));
}
