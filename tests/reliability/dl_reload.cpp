// SPDX-License-Identifier: Apache-2.0
// dlopen of libcuda, calls through dlsym'd pointers, dlclose, and a second dlopen at another
// address (the old range is blocked so the loader cannot reuse it). The program has no link-time
// CUDA dependency, like a plugin host. Under the shim the dlsym'd pointers are its wrappers: they
// must keep working in both rounds, whatever the shim remembered from the first one.
#include <cuda.h>
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>

namespace {

struct Fns {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) retain;
  decltype(&cuCtxSetCurrent) set_current;
  decltype(&cuMemAlloc_v2) alloc;
  decltype(&cuMemFree_v2) free;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
};

template <class T>
bool get(void *h, const char *name, T &out) {
  out = reinterpret_cast<T>(dlsym(h, name));
  return out != nullptr;
}

int round(const char *label, void *h, bool second) {
  Fns f{};
  if (!get(h, "cuInit", f.init) || !get(h, "cuDeviceGet", f.device_get) ||
      !get(h, "cuDevicePrimaryCtxRetain", f.retain) || !get(h, "cuCtxSetCurrent", f.set_current) ||
      !get(h, "cuMemAlloc_v2", f.alloc) || !get(h, "cuMemFree_v2", f.free) ||
      !get(h, "cuMemCreate", f.create) || !get(h, "cuMemRelease", f.release)) {
    std::printf("%s.lookup 1\n", label);
    return 1;
  }
  CUdevice d = 0;
  CUcontext c = nullptr;
  int bad = 0;
  bad += f.init(0) != CUDA_SUCCESS;
  bad += f.device_get(&d, 0) != CUDA_SUCCESS;
  bad += f.retain(&c, d) != CUDA_SUCCESS;
  bad += f.set_current(c) != CUDA_SUCCESS;
  if (second) {
    // Linear memory only in the second round: its hook asks the driver for the current device,
    // and the first round must not leave the shim holding libcuda open by that side effect.
    CUdeviceptr p = 0;
    bad += f.alloc(&p, 1 << 20) != CUDA_SUCCESS;
    bad += f.free(p) != CUDA_SUCCESS;
  }
  CUmemAllocationProp pr{};
  pr.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  pr.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  pr.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle hd = 0;
  bad += f.create(&hd, 2 << 20, &pr, 0) != CUDA_SUCCESS;
  bad += f.release(hd) != CUDA_SUCCESS;
  std::printf("%s.failures %d\n", label, bad);
  return bad;
}

// Load range of the object that defines `sym`.
bool range_of(void *sym, std::uintptr_t &lo, std::uintptr_t &hi) {
  Dl_info info;
  link_map *lm = nullptr;
  if (!dladdr1(sym, &info, reinterpret_cast<void **>(&lm), RTLD_DL_LINKMAP) || !lm) return false;
  struct Ctx {
    const char *name;
    std::uintptr_t base, lo = UINTPTR_MAX, hi = 0;
  } ctx{lm->l_name, lm->l_addr};
  dl_iterate_phdr(
      [](dl_phdr_info *i, size_t, void *data) -> int {
        auto *c = static_cast<Ctx *>(data);
        if (i->dlpi_addr != c->base) return 0;
        for (int k = 0; k < i->dlpi_phnum; ++k)
          if (i->dlpi_phdr[k].p_type == PT_LOAD) {
            std::uintptr_t a = i->dlpi_addr + i->dlpi_phdr[k].p_vaddr;
            if (a < c->lo) c->lo = a;
            if (a + i->dlpi_phdr[k].p_memsz > c->hi) c->hi = a + i->dlpi_phdr[k].p_memsz;
          }
        return 1;
      },
      &ctx);
  lo = ctx.lo & ~std::uintptr_t{4095};
  hi = (ctx.hi + 4095) & ~std::uintptr_t{4095};
  return ctx.hi > ctx.lo;
}

}  // namespace

int main() {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("open1 0\n");
    return 1;
  }
  std::uintptr_t lo = 0, hi = 0;
  const bool have_range = range_of(dlsym(h, "cuInit"), lo, hi);
  int bad = round("first", h, false);
  dlclose(h);
  const bool unloaded = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD) == nullptr;
  std::printf("unloaded %d\n", unloaded ? 1 : 0);
  if (unloaded && have_range) {
    // Keep the old range busy so the second load lands elsewhere.
    void *block = mmap(reinterpret_cast<void *>(lo), hi - lo, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    std::printf("blocked %d\n", block == reinterpret_cast<void *>(lo) ? 1 : 0);
  }
  h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    std::printf("open2 0\n");
    return 1;
  }
  bad += round("second", h, true);
  dlclose(h);
  return bad ? 1 : 0;
}
