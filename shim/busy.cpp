// SPDX-License-Identifier: Apache-2.0
// The busy check at unmap: see busy.h. It calls the driver's own exports (never the shim's
// wrappers), so nothing of it is recorded as the program's.
#include "busy.h"

#include "clock.h"
#include "cuda_api.h"
#include "handlers_capture.h"
#include "loader.h"
#include "state.h"

namespace cmg::shim {

namespace {
// A context synchronisation that returns within this was idle: the call itself costs microseconds.
constexpr std::uint64_t kWaitedNs = 100'000;

// The primary context of `dev` made current on this thread for the check, when the thread's
// current device is another one or it has none (a free callback on a thread that works on device
// 1 unmapping device-0 memory): then the previous context is current again. Never creates a
// context: a device whose primary context is not active has no work queued.
class DeviceContext {
 public:
  explicit DeviceContext(int dev) : dev_(dev) {
    if (current_device() == dev) {
      ok_ = true;
      return;
    }
    static std::atomic<void *> state_slot{nullptr}, retain_slot{nullptr}, push_slot{nullptr};
    auto get_state =
        driver_fn<PFN_cuDevicePrimaryCtxGetState_v7000>(state_slot, "cuDevicePrimaryCtxGetState");
    auto retain =
        driver_fn<PFN_cuDevicePrimaryCtxRetain_v7000>(retain_slot, "cuDevicePrimaryCtxRetain");
    auto push = driver_fn<PFN_cuCtxPushCurrent_v4000>(push_slot, "cuCtxPushCurrent_v2");
    unsigned flags = 0;
    int active = 0;
    if (!get_state || !retain || !push || get_state(dev, &flags, &active) != CUDA_SUCCESS ||
        !active)
      return;
    CUcontext ctx = nullptr;
    if (retain(&ctx, dev) != CUDA_SUCCESS) return;
    retained_ = true;
    if (push(ctx) != CUDA_SUCCESS) return;
    forget_current_device();  // the driver's own export: no hook saw the push
    pushed_ = ok_ = true;
  }
  ~DeviceContext() {
    static std::atomic<void *> pop_slot{nullptr}, release_slot{nullptr};
    if (pushed_) {
      auto pop = driver_fn<PFN_cuCtxPopCurrent_v4000>(pop_slot, "cuCtxPopCurrent_v2");
      CUcontext c = nullptr;
      if (pop) pop(&c);
      forget_current_device();
    }
    if (retained_) {
      auto release = driver_fn<PFN_cuDevicePrimaryCtxRelease_v11000>(
          release_slot, "cuDevicePrimaryCtxRelease_v2");
      if (release) release(dev_);
    }
  }
  DeviceContext(const DeviceContext &) = delete;
  DeviceContext &operator=(const DeviceContext &) = delete;
  bool ok() const { return ok_; }

 private:
  int dev_;
  bool ok_ = false, retained_ = false, pushed_ = false;
};

}  // namespace

BusyResult busy_check(BusyCheck mode, int dev) {
  BusyResult r;
  if (mode == BusyCheck::Off || dev < 0) return r;
  // Querying the legacy stream, or synchronizing the context, while a stream captures is refused
  // and invalidates the capture (real-driver.md C9, C10, C17): the check waits for the capture.
  if (capture_open() && !may_check_busy()) return r;
  const DeviceContext on(dev);
  if (!on.ok()) return r;
  if (mode == BusyCheck::Query) {
    static std::atomic<void *> slot{nullptr};
    auto q = driver_fn<PFN_cuStreamQuery_v2000>(slot, "cuStreamQuery");
    r.how = "query";
    r.busy = q && q(CU_STREAM_LEGACY) == CUDA_ERROR_NOT_READY;
    return r;
  }
  static std::atomic<void *> slot{nullptr};
  auto s = driver_fn<PFN_cuCtxSynchronize_v2000>(slot, "cuCtxSynchronize");
  if (!s) return r;
  const std::uint64_t t0 = mono_ns();
  if (s() != CUDA_SUCCESS) return r;
  r.how = "sync";
  r.waited_ns = mono_ns() - t0;
  r.busy = r.waited_ns >= kWaitedNs;
  return r;
}

}  // namespace cmg::shim
