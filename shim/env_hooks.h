// SPDX-License-Identifier: Apache-2.0
// The environment as the shim reads it while the program runs: PyTorch's allocator variables,
// snapshotted under the shim's lock and refreshed by the shim's setenv, unsetenv, putenv and
// clearenv (exported, so the program's and Python's os.environ calls pass through them). Reading
// `environ` itself on a hook's path raced with a setenv of another thread (it reallocates the
// array); the snapshot is read under the same lock that every change through these takes.
#pragma once

#include "torch_conf.h"

namespace cmg::shim {

// PyTorch's allocator variables as they stand now (a copy).
torchconf::Env torch_env_now();

}  // namespace cmg::shim
