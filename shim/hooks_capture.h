// SPDX-License-Identifier: Apache-2.0
// What the stream-capture and graph hooks share (hooks_driver.cpp, hooks_runtime.cpp): they are
// reached like the memory hooks, the runtime's through the PLT and dlsym, the driver's through the
// PLT, dlsym and cuGetProcAddress routing (the runtime gets every driver function that way:
// real-driver.md section 5), each one line into the handlers (handlers_capture.h). A runtime call
// reaches the driver underneath; the re-entry guard records it once, under the runtime's name.
#pragma once

#include <cstdint>
#include <cstring>

#include "handlers_capture.h"

namespace cmg::shim::capture_hooks {

inline std::uint64_t h(const void *p) {
  return reinterpret_cast<std::uintptr_t>(p);
}
inline constexpr int kGlobal = CU_STREAM_CAPTURE_MODE_GLOBAL;
// A mode the program passes (or the driver writes back) read as the number it is: a program may
// pass any value, which is then no enumerator, and loading it as the enum type is undefined.
static_assert(sizeof(CUstreamCaptureMode) == sizeof(int) &&
              sizeof(cudaStreamCaptureMode) == sizeof(int));
inline int mode_at(const void *mode) {
  int v = -1;
  if (mode) std::memcpy(&v, mode, sizeof v);
  return v;
}

}  // namespace cmg::shim::capture_hooks
