// SPDX-License-Identifier: Apache-2.0
// How a CUDA 13 runtime reaches libcuda.so.1; shared by the fake cudart and the fake NCCL, which
// carries a static cudart of its own (nccl-and-cleanup.md 1.4).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>

namespace fakecuda_entry {

struct DriverEntry {
  void *handle = nullptr;
  PFN_cuGetProcAddress_v12000 gpa = nullptr;  // the pointer answered for ("cuGetProcAddress", 12000)
  CUresult init = CUDA_SUCCESS;               // what cuInit(0) returned
};

enum class EntryError { None, NoLibrary, NoEntryPoint, InitFailed };

// The measured sequence of cudart 13, dynamic and static alike (interposers.md 9.1,
// real-driver.md section 5): dlopen("libcuda.so.1", RTLD_NOW), exactly one
// dlsym(handle, "cuGetProcAddress_v2"), then through that pointer the empty-name probe,
// ("cuInit", 2000) and a call of cuInit(0), ("cuGetProcAddress", 11030) and
// ("cuGetProcAddress", 12000); symbolStatus is NULL in all of them. Every later lookup goes
// through the pointer returned for the 12000 request, never through the dlsym'd one.
// The dlopen/dlsym calls are plain calls: in a program linked with the static variant they go
// through the program's own PLT, which is where an LD_PRELOAD dlsym hook sees them.
inline EntryError open_driver(DriverEntry *e) {
  e->handle = dlopen("libcuda.so.1", RTLD_NOW);
  if (!e->handle) return EntryError::NoLibrary;
  auto boot = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(e->handle, "cuGetProcAddress_v2"));
  if (!boot) return EntryError::NoEntryPoint;
  void *p = nullptr;
  boot("", &p, 0, 0, nullptr);
  void *init = nullptr;
  if (boot("cuInit", &init, 2000, 0, nullptr) != CUDA_SUCCESS || !init)
    return EntryError::NoEntryPoint;
  e->init = reinterpret_cast<PFN_cuInit_v2000>(init)(0);
  void *gpa11 = nullptr, *gpa12 = nullptr;
  boot("cuGetProcAddress", &gpa11, 11030, 0, nullptr);
  boot("cuGetProcAddress", &gpa12, 12000, 0, nullptr);
  e->gpa = reinterpret_cast<PFN_cuGetProcAddress_v12000>(gpa12);
  if (!e->gpa) return EntryError::NoEntryPoint;
  return e->init == CUDA_SUCCESS ? EntryError::None : EntryError::InitFailed;
}

}  // namespace fakecuda_entry
