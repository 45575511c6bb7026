// SPDX-License-Identifier: Apache-2.0
// The shim's view of PyTorch in the host: which release is loaded (from its libraries, lazily),
// the known problems of that release for the environment it read, and whether the CUDA caching
// allocator takes the path its configuration asks for (expandable segments configured, yet
// segments made with cudaMalloc). The policy is policy/torch_*; these only gather what it needs.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "torch_conf.h"
#include "torch_version.h"

namespace cmg::shim {

// The PyTorch release whose libraries (libc10*, libtorch*) are loaded, and where its version was
// read; nullopt while none is loaded. Looked up again until found, then kept.
std::optional<torchconf::FoundVersion> torch_loaded_version();

// The allocator variables as PyTorch reads them: the environment after the shim's rewrite at load
// (parser L reads it during `import torch`); nullptr before on_load ran.
const torchconf::Env *torch_env_at_load();
// The environment fails in every modelled release, and its errors were reported at load; when not,
// torch_release_check reports the loaded release's error.
bool torch_errors_reported_at_load();

// Once a release is found: its known problems for the environment (policy/torch_rules, the rows
// marked at_run_time) as `config` findings, naming the release and where its version was read.
void torch_release_check();

// From the cudaMalloc hook, with its return address: the first calls are checked (cheap after
// that: one relaxed load). A cudaMalloc from PyTorch's caching allocator (libc10_cuda,
// libtorch_cuda) while its settings ask for expandable segments is a `config` finding naming the
// variable and the known cause.
void torch_path_check(void *caller, std::size_t size);

// A program (the Python package) applied allocator settings at run time with PyTorch's setter:
// the path check follows them. Returns whether expandable segments are in effect afterwards
// (1/0), or -1 when the setter model says PyTorch raises on them (nothing applied then).
int torch_settings_applied(const char *conf);

}  // namespace cmg::shim
