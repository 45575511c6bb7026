// SPDX-License-Identifier: Apache-2.0
// cuGetProcAddress[_v2] of the fake driver: one answer per ABI variant, as the real driver gives.
#include <type_traits>

#include "driver_internal.h"

#include <cstring>

namespace fc {
namespace {

// Each export must have exactly the type of NVIDIA's typedef for the version it is listed under:
// a wrong version in driver_exports.def would hand callers a function of the wrong signature.
#define FC_FN(e, b, v)                                                 \
  static_assert(std::is_same_v<decltype(&::e), PFN_##b##_v##v>,        \
                #e " does not have the type of PFN_" #b "_v" #v);
#define FC_FN_PTSZ(e, b, v)                                            \
  static_assert(std::is_same_v<decltype(&::e), PFN_##b##_v##v##_ptsz>, \
                #e " does not have the type of PFN_" #b "_v" #v "_ptsz");
#define FC_FN_PTDS(e, b, v)                                            \
  static_assert(std::is_same_v<decltype(&::e), PFN_##b##_v##v##_ptds>, \
                #e " does not have the type of PFN_" #b "_v" #v "_ptds");
#include "driver_exports.def"
#undef FC_FN
#undef FC_FN_PTSZ
#undef FC_FN_PTDS

const FnInfo kTable[kFnCount] = {
#define FC_FN(e, b, v) {#e, #b, v, false, reinterpret_cast<void *>(&::e)},
#define FC_FN_PTSZ(e, b, v) {#e, #b, v, true, reinterpret_cast<void *>(&::e)},
#define FC_FN_PTDS(e, b, v) {#e, #b, v, true, reinterpret_cast<void *>(&::e)},
#include "driver_exports.def"
#undef FC_FN
#undef FC_FN_PTSZ
#undef FC_FN_PTDS
};

}  // namespace

const FnInfo &fn_info(unsigned index) { return kTable[index]; }

// The rules are those of the cuGetProcAddress documentation in cuda.h 13.0, which the real driver
// follows (real-driver.md section 5, interposers.md 10.1):
// * symbol is the base name; the answer is the newest variant introduced at or before version,
//   so "cuMemAlloc" 2000 -> cuMemAlloc, 3020 -> cuMemAlloc_v2; "cuCtxSynchronize" 13000 -> _v2;
// * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM picks the _ptsz/_ptds variant when there is one,
//   else the legacy one; flags 0 is the legacy-stream search;
// * version newer than the driver -> CUDA_ERROR_INVALID_VALUE;
// * unknown name (also "") -> CUDA_SUCCESS, *pfn = NULL, SYMBOL_NOT_FOUND; a known name asked for
//   at a version older than its first variant -> CUDA_SUCCESS, NULL, VERSION_NOT_SUFFICIENT.
// The pointers handed out are the exports themselves, so dlsym(handle, exact) agrees with them.
CUresult get_proc_address(Fn entry, const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) {
  const FnInfo *pick = nullptr;
  CUresult r = CUDA_SUCCESS;
  if (!symbol || !pfn || version > kDriverVersion ||
      (flags & ~static_cast<cuuint64_t>(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                                         CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))) {
    r = CUDA_ERROR_INVALID_VALUE;
    if (pfn) *pfn = nullptr;
  } else {
    const FnInfo *legacy = nullptr, *per_thread = nullptr;
    bool known = false;
    const bool want_pt = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (const FnInfo &fi : kTable) {
      if (std::strcmp(fi.base, symbol) != 0) continue;
      known = true;
      if (fi.version > version) continue;
      const FnInfo *&slot = fi.per_thread ? per_thread : legacy;
      if (fi.per_thread && !want_pt) continue;
      if (!slot || fi.version > slot->version) slot = &fi;
    }
    pick = per_thread ? per_thread : legacy;
    *pfn = pick ? pick->addr : nullptr;
    if (status)
      *status = pick    ? CU_GET_PROC_ADDRESS_SUCCESS
                : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                        : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  }
  if (tracing())
    trace_printf("gpa %s %s %d %llu %s", fn_info(static_cast<unsigned>(entry)).name,
                 !symbol ? "(null)" : *symbol ? symbol : "\"\"", version,
                 static_cast<unsigned long long>(flags),
                 r != CUDA_SUCCESS ? "INVALID_VALUE" : pick ? pick->name : "NULL");
  return r;
}

}  // namespace fc

// Both entry points work before cuInit (cudart asks before initialising: interposers.md 10.3).
FC_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags) {
  return FC_CALL(cuGetProcAddress, fc::get_proc_address(fc::Fn::cuGetProcAddress, symbol, pfn,
                                                        cudaVersion, flags, nullptr));
}

FC_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
  return FC_CALL(cuGetProcAddress_v2, fc::get_proc_address(fc::Fn::cuGetProcAddress_v2, symbol,
                                                           pfn, cudaVersion, flags, symbolStatus));
}
