# SPDX-License-Identifier: Apache-2.0
"""cumemguard from Python: the shim's contracts for programs that adopt them.

    import cumemguard
    cumemguard.active()                      # is libcumemguard.so loaded here, which version
    cumemguard.maybe_empty_cache()           # an optional torch.cuda.empty_cache(): True if it ran
    cumemguard.suppress_opportunistic_cleanup()   # before a transport the shim cannot see starts
    with cumemguard.expandable_segments(False):   # e.g. custom all-reduce graph capture
        ...
    assert cumemguard.findings() == {}       # a run under the shim had no findings
    cumemguard.snapshot("after load")        # what is resident now, to the event log

Everything works with and without the shim loaded (docs/python.md says what differs). Importing
this package imports nothing beyond the standard library's os, sys and threading; torch is imported
only by the calls that use it, ctypes and json only by the calls that reach the C API.
"""
from ._allocator import ConfigError, allocator_settings, expandable_segments
from ._cleanup import (maybe_empty_cache, opportunistic_cleanup_suppressed, release_deferred,
                       suppress_opportunistic_cleanup)
from . import _native

__all__ = ["ShimInfo", "active", "maybe_empty_cache", "suppress_opportunistic_cleanup",
           "opportunistic_cleanup_suppressed", "release_deferred", "expandable_segments",
           "allocator_settings", "ConfigError", "findings", "snapshot", "stats", "torch_alloc_conf"]


class ShimInfo:
    """What active() returns: true when the shim is loaded in this process."""

    __slots__ = ("loaded", "version")

    def __init__(self, loaded, version):
        self.loaded = loaded
        self.version = version

    def __bool__(self):
        return self.loaded

    def __eq__(self, other):
        return isinstance(other, ShimInfo) and (self.loaded, self.version) == (other.loaded,
                                                                               other.version)

    def __repr__(self):
        return f"ShimInfo(loaded={self.loaded!r}, version={self.version!r})"


def active():
    """Whether libcumemguard.so is loaded in this process (preloaded, or ``cumemguard run``), and
    its version; ShimInfo(loaded=False, version=None) otherwise."""
    api = _native.shim()
    if api is None:
        return ShimInfo(False, None)
    return ShimInfo(True, api.version().decode())


def stats():
    """The shim's counters: {"version", "disabled", "findings": {class: count},
    "memory": [{"device", "kind", "current", "peak", "total"}] in bytes,
    "opportunistic_cleanup_suppressed"}; None when the shim is not loaded."""
    api = _native.shim()
    if api is None:
        return None
    return _native.call_json(api.stats_json)


def findings():
    """Findings so far by class ({} when none); None when the shim is not loaded, so that
    ``assert cumemguard.findings() == {}`` fails rather than passes without it."""
    s = stats()
    return None if s is None else s["findings"]


def snapshot(label=""):
    """Writes a snapshot of what is resident now to the shim's event log (cumemguard_snapshot in
    include/cumemguard.h): linear and VMM memory by device, kind, state and creating stack, this
    call's own stack with its Python frames. `cumemguard report` shows it in its "Resident"
    section, `cumemguard report --diff` compares two. Returns the snapshot's number in this
    process (1, 2, ...), 0 when none was written (no event log); None when the shim is not
    loaded."""
    api = _native.shim()
    if api is None:
        return None
    return int(api.snapshot(_native.encode(str(label))))


def torch_alloc_conf(overrides, base=None, torch_version=None):
    """What the shim's policy makes of `overrides` applied to the configuration in effect (the
    environment's when `base` is None): the dict documented in include/cumemguard.h. Changes
    nothing."""
    from ._allocator import plan

    return plan(overrides, base, torch_version)
