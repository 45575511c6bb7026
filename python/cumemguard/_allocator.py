# SPDX-License-Identifier: Apache-2.0
"""Scoped changes of PyTorch's allocator settings (seed 002's guard), on the shim's own parser.

The full configuration in effect comes from the variable PyTorch reads (PYTORCH_CUDA_ALLOC_CONF
when present, even empty, else PYTORCH_ALLOC_CONF, as torch 2.10 and later do) or, inside another
block of this module, from what that block applied; it is judged with the grammar of the torch
that is imported (torch.__version__), so every key of that release is kept. cumemguard_torch_alloc_conf() changes only the
overridden token in it and gives the string that restores every setting afterwards; both were
checked against the model of PyTorch's setter (which resets max_split_size_mb,
roundup_power2_divisions and garbage_collection_threshold whenever they are omitted).
"""
import threading

from . import _native


class ConfigError(RuntimeError):
    """The change cannot be made faithfully (the configuration fails in PyTorch, the policy
    library is missing, ...). Nothing was applied."""


_lock = threading.RLock()
_applied = []  # the strings this module passed to the setter, innermost last


def _setter(torch, name=None):
    # The setter of the loaded release, as the policy names it for that release ("setter" of the
    # plan): torch._C._accelerator_setAllocatorSettings from 2.10, where
    # torch.cuda.memory._set_allocator_settings became a deprecated wrapper that emits a
    # FutureWarning (reference §6); the latter before. A build that lacks the named one gets the
    # one it has.
    fn = torch
    for part in (name or "").split(".")[1:]:
        fn = getattr(fn, part, None)
    if name and callable(fn):
        return fn
    fn = getattr(getattr(torch, "_C", None), "_accelerator_setAllocatorSettings", None)
    return fn if fn is not None else torch.cuda.memory._set_allocator_settings


def plan(overrides, base=None, torch_version=None):
    """The rewrite as the policy gives it (see include/cumemguard.h): a dict with "variable",
    "base", "result", "restore", "error", "expandable_before", "expandable_after", ..."""
    api = _native.policy()
    if api is None:
        raise ConfigError("cumemguard: cannot rewrite allocator settings: " +
                          _native.policy_error())
    return _native.call_json(api.torch_alloc_conf, _native.encode(base), _native.encode(overrides),
                             _native.encode(torch_version))


class allocator_settings:
    """Applies `overrides` ("key:value,...", or "-key") to the full allocator configuration in
    effect for the duration of the block, then restores it, on normal and exceptional exit."""

    def __init__(self, overrides):
        self.overrides = overrides
        self.plan = None  # the policy's answer, once entered
        self.applied = False

    def _no_op(self, p):
        return not p["changed"]

    def __enter__(self):
        import torch

        with _lock:
            base = _applied[-1] if _applied else None
            p = plan(self.overrides, base, getattr(torch, "__version__", None))
            self.plan = p
            if p.get("error"):
                raise ConfigError("cumemguard: " + p["error"])
            if self._no_op(p):
                return self
            _setter(torch, p.get("setter"))(p["result"])
            _applied.append(p["result"])
            self.applied = True
            _tell_shim(p["result"])
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.applied:
            return False
        import torch

        with _lock:
            if _applied and _applied[-1] == self.plan["result"]:
                _applied.pop()
            else:  # blocks closed out of order: forget this one wherever it is
                for i in range(len(_applied) - 1, -1, -1):
                    if _applied[i] == self.plan["result"]:
                        del _applied[i]
                        break
            self.applied = False
            _setter(torch, self.plan.get("setter"))(self.plan["restore"])
            _tell_shim(self.plan["restore"])
        return False


class expandable_segments(allocator_settings):
    """``expandable_segments:True/False`` for the block; a no-op when that is already in effect."""

    def __init__(self, enabled):
        self.enabled = bool(enabled)
        super().__init__("expandable_segments:" + ("True" if self.enabled else "False"))

    def _no_op(self, p):
        return p["expandable_before"] == self.enabled


def _tell_shim(conf):
    api = _native.shim()
    if api is not None:
        api.settings_applied(_native.encode(conf))
