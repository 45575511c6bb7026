// SPDX-License-Identifier: Apache-2.0
// Whether the shim may write the process environment now. setenv() reallocates `environ` when it
// adds a variable, and glibc's getenv() reads it without a lock: another thread reading the
// environment meanwhile can read freed memory. So the shim writes it (CUMEMGUARD_SAID, the PyTorch
// variables CUMEMGUARD_TORCH_ALLOC_CONF sets) only while the calling thread is the process's only
// one: in the constructor of a shim preloaded or linked with the program, normally, and not in a
// shim dlopen'ed by a program whose threads already run.
#pragma once

namespace cmg::shim {

// True when this thread is the only one (/proc/self/stat's thread count), or when that cannot be
// read (the shim then behaves as it always did at load).
bool environ_write_safe();

}  // namespace cmg::shim
