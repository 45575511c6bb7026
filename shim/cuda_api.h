// SPDX-License-Identifier: Apache-2.0
// The CUDA, runtime and NCCL declarations the shim is written against, and the API enumeration
// generated from the three symbol lists.
//
// __CUDA_API_VERSION_INTERNAL makes cuda.h drop its renaming macros (cuMemAlloc -> cuMemAlloc_v2,
// cuGetProcAddress -> cuGetProcAddress_v2, …) and declare the legacy ABI variants under their own
// names, so every row of api_driver.def names exactly one export. Each wrapper is then declared from
// its PFN_* typedef, so the compiler checks it has exactly that variant's signature.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#undef __CUDA_API_VERSION_INTERNAL
#define CUDA_NO_HALF 1
#include <cuda_runtime_api.h>
// nccl.h is included only where NCCL types are needed (hooks_nccl.cpp, handlers_nccl.cpp): it pulls
// in cuda_runtime.h, whose template overloads of cudaMalloc & co. would make decltype ambiguous.

#include <cstdint>
#include <string_view>
#include <type_traits>

#define CMG_EXPORT extern "C" __attribute__((visibility("default")))

namespace cmg::shim {

enum class Api : std::uint16_t {
#define CMG_DRV(n, b, t) n,
#include "api_driver.def"
#undef CMG_DRV
#define CMG_RT(n, d) n,
#include "api_runtime.def"
#undef CMG_RT
#define CMG_NCCL(n, e) n,
#include "api_nccl.def"
#undef CMG_NCCL
  kCount
};

inline constexpr std::size_t kApiCount = static_cast<std::size_t>(Api::kCount);
enum class Family : std::uint8_t { Driver, Runtime, Nccl };

struct ApiInfo {
  const char *name;  // exact exported name (what the log calls the API)
  const char *base;  // driver: base name for cuGetProcAddress; runtime: declaration; nccl: event
  Family family;
  std::uint8_t name_len;  // strlen(name): the log writes the name once per call record
};
extern const ApiInfo kApis[kApiCount];
inline const char *api_name(Api a) { return kApis[static_cast<std::size_t>(a)].name; }
inline std::string_view api_name_view(Api a) {
  const ApiInfo &i = kApis[static_cast<std::size_t>(a)];
  return std::string_view(i.name, i.name_len);
}

}  // namespace cmg::shim

// Declarations of every wrapper from its PFN type / header declaration (see the comment above).
#define CMG_DRV(n, b, t) extern "C" std::remove_pointer_t<t> n;
#include "api_driver.def"
#undef CMG_DRV
// Runtime names are declared by cuda_runtime_api.h already (a mismatching definition is a compile
// error); only the _ptsz twins need a declaration, taken from their twin's type.
extern "C" {
cudaError_t cudaMallocAsync_ptsz(void **, size_t, cudaStream_t);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **, size_t, cudaMemPool_t, cudaStream_t);
cudaError_t cudaFreeAsync_ptsz(void *, cudaStream_t);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long,
                                         cudaDriverEntryPointQueryResult *);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *, void **, unsigned int,
                                                  unsigned long long,
                                                  cudaDriverEntryPointQueryResult *);
decltype(::cudaStreamBeginCapture) cudaStreamBeginCapture_ptsz;
decltype(::cudaStreamEndCapture) cudaStreamEndCapture_ptsz;
decltype(::cudaGraphInstantiateWithParams) cudaGraphInstantiateWithParams_ptsz;
decltype(::cudaGraphLaunch) cudaGraphLaunch_ptsz;
}
