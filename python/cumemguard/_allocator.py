# SPDX-License-Identifier: Apache-2.0
"""Scoped changes of PyTorch's allocator settings (the scoped allocator-settings guard), on the shim's own parser.

The allocator's settings belong to the process, and blocks may be open on several threads at once.
So the settings in effect are always the composition of every open block, in the order they were
entered, over the configuration PyTorch read from its variable (PYTORCH_CUDA_ALLOC_CONF when
present, even empty, else PYTORCH_ALLOC_CONF, as torch 2.10 and later do), judged with the grammar
of the torch that is imported (torch.__version__), so every key of that release is kept. Entering a
block applies its overrides on top of what is in effect; leaving one, on any thread and in any
order, goes to the composition of the blocks still open, with one call of the release's setter
whose string the policy checked against its model of that setter (which resets
max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold whenever they are
omitted, and keeps expandable_segments).
"""
import os
import threading

from . import _native


class ConfigError(RuntimeError):
    """The change cannot be made faithfully (the configuration fails in PyTorch, the policy
    library is missing, ...). Nothing was applied."""


# Taken for the plan and the setter call of one change, so that the changes of two threads are
# applied in the order of the composition. Replaced in a forked child (_after_fork_in_child): the
# thread holding it there does not exist in the child.
_lock = threading.Lock()
_open = []      # the open blocks (_Open), in the order they were entered, across threads
_applied = None  # the string last passed to the setter for them; None: the environment's


class _Open:
    __slots__ = ("block", "thread", "orphan")

    def __init__(self, block):
        self.block = block
        self.thread = threading.get_ident()
        self.orphan = False  # entered by a thread of the parent, in a forked child


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


def _torch(what):
    """torch, imported by the call that needs it; without it, an ImportError that says so."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"cumemguard.{what} changes PyTorch's allocator settings and needs "
                          f"PyTorch, which cannot be imported here ({e})") from e
    return torch


def _version(torch):
    return getattr(torch, "__version__", None)


def _composed(blocks, torch):
    """The string the blocks give applied in order over the environment's configuration (None
    when none of them changes it). A block whose overrides no longer apply on what precedes it
    (the policy refuses the merge) is left out."""
    state = None
    for b in blocks:
        p = plan(b.overrides, state, _version(torch))
        if not p.get("error") and not b._no_op(p):
            state = p["result"]
    return state


def _set(torch, conf, setter=None):
    _setter(torch, setter)(conf)
    _tell_shim(conf)


def _close(entry, torch):
    """Removes an open block and goes to the composition of the others. Lock held."""
    global _applied
    _open.remove(entry)
    target = _composed([e.block for e in _open], torch)
    if target == _applied:
        return  # the block changed nothing the others do not set too
    # The policy's restore for this block's overrides over the target takes the settings in effect
    # (the target with this block's keys as it set them, or as a later block set them, which the
    # target holds too) back to the target exactly, expandable_segments included.
    p = plan(entry.block.overrides, target, _version(torch))
    conf = p["restore"] if not p.get("error") else target
    if conf is None:  # no string from the policy: the block's own restore from its entry
        conf = entry.block.plan["restore"]
    before, _applied = _applied, target
    if conf != before:  # the setter given the string it was given last changes nothing
        _set(torch, conf, p.get("setter") or entry.block.plan.get("setter"))


def _drop_orphans(torch):
    """In a forked child, the blocks of the parent's other threads never end: closed here, at the
    child's first change (lock held)."""
    for e in [e for e in _open if e.orphan]:
        _close(e, torch)


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()
    me = threading.get_ident()
    for e in _open:
        e.orphan = e.thread != me


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class allocator_settings:
    """Applies `overrides` ("key:value,...", or "-key") to the full allocator configuration in
    effect for the duration of the block, then restores it, on normal and exceptional exit. Blocks
    compose across threads: each open block's overrides stay applied until it ends (the one
    entered last wins where two set the same key)."""

    def __init__(self, overrides):
        self.overrides = overrides
        self.plan = None  # the policy's answer, once entered
        self.applied = False  # entering it changed the settings
        self._entry = None

    def _no_op(self, p):
        return not p["changed"]

    def __enter__(self):
        global _applied
        torch = _torch(type(self).__name__)

        with _lock:
            _drop_orphans(torch)
            p = plan(self.overrides, _applied, _version(torch))
            self.plan = p
            if p.get("error"):
                raise ConfigError("cumemguard: " + p["error"])
            entry = _Open(self)
            _open.append(entry)
            self._entry = entry
            if self._no_op(p):
                return self
            # Recorded before the setter runs: a child forked during the call then knows the
            # block, and closing it there restores whatever the setter had done.
            before, _applied = _applied, p["result"]
            try:
                _set(torch, p["result"], p.get("setter"))
            except BaseException:
                _open.remove(entry)
                self._entry = None
                _applied = before
                raise
            self.applied = True
        return self

    def __exit__(self, exc_type, exc, tb):
        entry, self._entry = self._entry, None
        if entry is None:
            return False
        torch = _torch(type(self).__name__)

        with _lock:
            _drop_orphans(torch)
            if entry in _open:
                _close(entry, torch)
            self.applied = False
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
