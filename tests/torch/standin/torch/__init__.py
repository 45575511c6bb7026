# SPDX-License-Identifier: Apache-2.0
"""A stand-in for the parts of `torch` the cumemguard package uses, for CI without PyTorch.

It records every string given to the allocator setter and keeps a state that behaves like
PyTorch 2.10/2.11's (docs/reference/pytorch-alloc-conf.md §5): each setter call resets
max_split_size, roundup_power2_divisions and garbage_collection_threshold, then applies what the
string names; expandable_segments and the CUDA keys keep their value when omitted. Its own toy
parser is deliberately not the shim's, so the tests compare two independent readings.

Keys of 2.12 (throw_on_cudamalloc_oom, pinned_free_catch_all) are accepted when torch.__version__
says 2.12 or later. Controls: STANDIN_TORCH_VERSION (torch.__version__), STANDIN_TORCH_NO_ACCELERATOR=1 (a torch
without torch._C._accelerator_setAllocatorSettings, which then has only the deprecated setter).
"""
import os
import sys
import types
import warnings

__version__ = os.environ.get("STANDIN_TORCH_VERSION", "2.11.0")
MiB = 1 << 20

calls = []  # (api, string) for every setter call, in order
empty_cache_calls = 0
state = {}


def _items(s):
    """Items of a configuration, whitespace dropped, brackets kept together."""
    s = "".join(s.split())
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return [tuple(i.split(":", 1)) for i in out]


def _bool(v):
    if v not in ("True", "False"):
        raise ValueError(f"Expected 'True' or 'False' but got '{v}'")
    return v == "True"


def _apply(conf):
    state["max_split_size"] = -1
    state["garbage_collection_threshold"] = 0.0
    state["roundup_power2_divisions"] = "0"
    state["PYTORCH_CUDA_ALLOC_CONF"] = conf
    for k, v in _items(conf):
        if k == "max_split_size_mb":
            state["max_split_size"] = int(v) * MiB
        elif k == "garbage_collection_threshold":
            state["garbage_collection_threshold"] = float(v)
        elif k == "roundup_power2_divisions":
            state["roundup_power2_divisions"] = v
        elif k == "expandable_segments":
            state["expandable_segments"] = _bool(v)
        elif k == "release_lock_on_cudamalloc":
            state["release_lock_on_cudamalloc"] = _bool(v)
        elif k == "backend":
            state["backend"] = v
        elif k in ("throw_on_cudamalloc_oom", "pinned_free_catch_all") and _release() >= (2, 12):
            state[k] = _bool(v)  # keys of 2.12 (its release notes, #179473)
        else:
            raise ValueError(f"Unrecognized key '{k}' in Accelerator allocator config.")


def _release():
    return tuple(int(x) for x in __version__.split("+")[0].split(".")[:2])


def _reset():
    """A fresh process: the allocator reads the environment at its first allocation."""
    global empty_cache_calls
    calls.clear()
    empty_cache_calls = 0
    state.clear()
    state.update(expandable_segments=False, release_lock_on_cudamalloc=False)
    env = os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
    if env is None:
        env = os.environ.get("PYTORCH_ALLOC_CONF")
    try:
        _apply(env or "")
    except ValueError as e:  # PyTorch raises this at the first CUDA allocation
        state["error"] = str(e)


# Called with the string before a setter applies it, when set: a test holds a thread inside the
# setter with it (the package's lock is held there).
_setter_hook = None


def _accelerator_setAllocatorSettings(conf):
    if _setter_hook is not None:
        _setter_hook(conf)
    calls.append(("accelerator", conf))
    _apply(conf)


def _set_allocator_settings(conf):
    if hasattr(_C, "_accelerator_setAllocatorSettings"):
        warnings.warn("torch.cuda._set_allocator_settings is deprecated. Use "
                      "torch._C._accelerator_setAllocatorSettings instead.", FutureWarning)
        calls.append(("deprecated", conf))
        _apply(conf)
        return
    calls.append(("cuda", conf))
    _apply(conf)


def _empty_cache():
    global empty_cache_calls
    empty_cache_calls += 1


def _snapshot():
    return {"allocator_settings": dict(state), "segments": []}


_C = types.ModuleType("torch._C")
if os.environ.get("STANDIN_TORCH_NO_ACCELERATOR") != "1":
    _C._accelerator_setAllocatorSettings = _accelerator_setAllocatorSettings
cuda = types.ModuleType("torch.cuda")
cuda.empty_cache = _empty_cache
cuda.memory = types.ModuleType("torch.cuda.memory")
cuda.memory._set_allocator_settings = _set_allocator_settings
cuda.memory._snapshot = _snapshot

# torch.distributed, present only once a test imports it (sys.modules is what cumemguard reads).
distributed = types.ModuleType("torch.distributed")
distributed._backend = None
distributed.is_available = lambda: True
distributed.is_initialized = lambda: distributed._backend is not None
distributed.get_backend = lambda: distributed._backend

sys.modules.update({"torch._C": _C, "torch.cuda": cuda, "torch.cuda.memory": cuda.memory})
_reset()
