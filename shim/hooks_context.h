// SPDX-License-Identifier: Apache-2.0
// The driver entry points that change which context is current: forwarded unchanged, then the
// current device the shim remembers is forgotten (state.h). They record nothing and decide nothing.
// The runtime reaches them through cuGetProcAddress (real-driver.md section 5: cudaSetDevice, a
// thread's first runtime call and cudaFree(0) each make one looked-up cuCtxSetCurrent).
// Included once, by hooks_driver.cpp: the table of Given wrappers there names every hook.
#pragma once

#include "loader.h"
#include "state.h"

namespace cmg::shim {
// Forgets even after a failed call: an answer asked again costs one driver query.
// The calling thread's own stack changed:
template <class F, class... A>
CUresult forward_own(F real, A... a) {
  if (!real) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = real(a...);
  forget_current_device();
  return r;
}
// What is current on other threads may have changed too (a destroyed or reset context):
template <class F, class... A>
CUresult forward_all(F real, A... a) {
  if (!real) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = real(a...);
  forget_current_device_everywhere();
  return r;
}
}  // namespace cmg::shim

CMG_HOOK(CUresult, cuCtxSetCurrent, (CUcontext c), (c)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxSetCurrent), c);
}
CMG_HOOK(CUresult, cuCtxPushCurrent, (CUcontext c), (c)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxPushCurrent), c);
}
CMG_HOOK(CUresult, cuCtxPushCurrent_v2, (CUcontext c), (c)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxPushCurrent_v2), c);
}
CMG_HOOK(CUresult, cuCtxPopCurrent, (CUcontext * c), (c)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxPopCurrent), c);
}
CMG_HOOK(CUresult, cuCtxPopCurrent_v2, (CUcontext * c), (c)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxPopCurrent_v2), c);
}
// cuCtxCreate pushes the new context on the calling thread's stack.
CMG_HOOK(CUresult, cuCtxCreate, (CUcontext * c, unsigned int flags, CUdevice dev),
         (c, flags, dev)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxCreate), c, flags, dev);
}
CMG_HOOK(CUresult, cuCtxCreate_v2, (CUcontext * c, unsigned int flags, CUdevice dev),
         (c, flags, dev)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxCreate_v2), c, flags, dev);
}
CMG_HOOK(CUresult, cuCtxCreate_v3,
         (CUcontext * c, CUexecAffinityParam *params, int n, unsigned int flags, CUdevice dev),
         (c, params, n, flags, dev)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxCreate_v3), c, params, n, flags, dev);
}
CMG_HOOK(CUresult, cuCtxCreate_v4,
         (CUcontext * c, CUctxCreateParams *params, unsigned int flags, CUdevice dev),
         (c, params, flags, dev)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxCreate_v4), c, params, flags, dev);
}
// cuCtxAttach makes the context current (pushes it); cuCtxDetach may destroy it.
CMG_HOOK(CUresult, cuCtxAttach, (CUcontext * c, unsigned int flags), (c, flags)) {
  return ::cmg::shim::forward_own(CMG_REAL_R(cuCtxAttach), c, flags);
}
CMG_HOOK(CUresult, cuCtxDetach, (CUcontext c), (c)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuCtxDetach), c);
}
CMG_HOOK(CUresult, cuCtxDestroy, (CUcontext c), (c)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuCtxDestroy), c);
}
CMG_HOOK(CUresult, cuCtxDestroy_v2, (CUcontext c), (c)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuCtxDestroy_v2), c);
}
CMG_HOOK(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev), (dev)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuDevicePrimaryCtxRelease), dev);
}
CMG_HOOK(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuDevicePrimaryCtxRelease_v2), dev);
}
CMG_HOOK(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev), (dev)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuDevicePrimaryCtxReset), dev);
}
CMG_HOOK(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev)) {
  return ::cmg::shim::forward_all(CMG_REAL_R(cuDevicePrimaryCtxReset_v2), dev);
}
